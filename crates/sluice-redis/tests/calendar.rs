//! Calendar windows on a real redis-server: a key lives in Redis until the
//! boundary that fills it again, which the script finds among the
//! boundaries the client hands it (the script has no tz database).

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use sluice_core::{Calendar, CalendarUnit, FakeClock, FixedWindow, Limit, Mode, Nanos, Op, Store};
use sluice_redis::{RedisConfig, RedisStore};
use support::{RedisServer, command};

fn pttl_ms(server: &RedisServer, key: &str) -> i64 {
    let reply = command(server.port(), &["PTTL", key]).unwrap();
    reply.trim().trim_start_matches(':').parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_key_lives_until_the_boundary_that_fills_it() {
    let server = RedisServer::start();
    // 2026-03-31T23:59:59+02:00, a second before April in Berlin.
    let clock = FakeClock::new(Nanos(1_774_994_399 * Nanos::PER_SEC));
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let store = RedisStore::with_clock(config, clock.clone()).unwrap();
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    let quota = FixedWindow::on_calendar(10.0, month)
        .unwrap()
        .with_max_reserved(20.0)
        .unwrap();
    let limit = Limit::new("cal-ttl", quota);
    let key = "sluice:{org}:cal-ttl";
    let spend = |cost, mode| store.decide(Op::new(&limit, "org", cost), mode);

    assert!(spend(10.0, Mode::CONSUME).await.unwrap().allowed);
    // Full again at midnight, a second away: kept at least that long (and
    // at least the store's shortest TTL).
    let ttl = pttl_ms(&server, key);
    assert!(ttl >= 990, "PTTL {ttl} ms");

    // Fifteen owed: April repays ten, May five; full again on 1 June.
    let d = spend(15.0, Mode::RESERVE).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some(1.0 + 30.0 * 86_400.0));
    let june = (1_780_264_800 - 1_774_994_399) * 1_000;
    let ttl = pttl_ms(&server, key);
    assert!(
        (june - 10..=june + 3).contains(&ttl),
        "PTTL {ttl} ms, want {june}"
    );
}
