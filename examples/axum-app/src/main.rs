//! Serves the example on 127.0.0.1:3000 (or the address in `$ADDR`):
//! `cargo run -p axum-app`, then `curl -i localhost:3000/`.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_http::{Enforcer, MemoryStore};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let enforcer = Arc::new(Enforcer::new(axum_app::policy()?, MemoryStore::new()));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    // The client address rules see comes from the socket, through ConnectInfo.
    let service = axum_app::app(enforcer).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
