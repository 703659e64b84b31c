//! Serves the example on 127.0.0.1:3000 (or the address in `$ADDR`), on
//! the PostgreSQL database `$DATABASE_URL` names, whose tables it makes if
//! they are missing. See the example's section of `docs/postgres.md`.

use std::net::SocketAddr;

use sluice_postgres::{PostgresConfig, PostgresStore};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow::anyhow!("set DATABASE_URL, e.g. postgres://app@localhost/app"))?;
    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let pool = axum_postgres::connect(&url).await?;
    axum_postgres::make_tables(&pool).await?;
    // The store's pool serves its own calls (resets); the limits spent in
    // the service's transactions go through the service's pool.
    let store = PostgresStore::new(PostgresConfig::from_url(&url)?)?;
    let app = axum_postgres::App::new(pool, store, axum_postgres::Limits::standard()?);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, axum_postgres::router(app))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
