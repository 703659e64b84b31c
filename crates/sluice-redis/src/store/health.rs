//! Whether Redis answers: what makes the store ready or not (an answer, a
//! refusal, a missed deadline), and the health check that pings a Redis
//! that is not answering, a suspect one and a silent connection
//! ([`watch`]).

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::RedisError;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use sluice_core::StoreError;

use super::Shared;
use super::connection::{Conn, Resend, send};

/// How long the connection may stay silent before the health check pings
/// it. A connection to a Redis that was killed, or restarted, is only found
/// dead by writing to it, and a call cannot be retried after its write
/// failed (see [`send`]): the ping finds it instead, and the calls after it
/// meet a new connection. Idle, that is a few pings a second; busy, none.
pub(super) const KEEPALIVE: Duration = Duration::from_millis(100);

impl Shared {
    pub(super) fn classify(&self, e: &RedisError) -> StoreError {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            self.ready.store(false, Ordering::Relaxed);
            // Only a refusal says Redis is down: a dropped connection is
            // replaced at once, and the calls after it wait for the new one.
            // A cluster can lose one node and still serve the others' slots.
            if e.is_connection_refusal() && matches!(self.conn, Conn::Single(_)) {
                self.refused.store(true, Ordering::Relaxed);
            }
        }
        if e.is_timeout() {
            self.timed_out()
        } else {
            StoreError::Unavailable(e.to_string())
        }
    }

    /// A call missed its deadline. A Redis that hangs (paused, swapping,
    /// stuck in a slow script) keeps its connections open and refuses
    /// nothing, so a miss is what says it may not be answering. One miss
    /// can also be a stall of this process, so it only makes the store
    /// suspect: the health check pings at once, and a ping that misses the
    /// deadline too makes the store not ready until one answers in time.
    pub(super) fn timed_out(&self) -> StoreError {
        self.suspect.store(true, Ordering::Relaxed);
        StoreError::Timeout
    }

    /// Records whether Redis answered a health-check ping: only a ping
    /// ends a refusal, since a call's reply may have been sent before the
    /// connection was lost.
    fn pinged(&self, answered: bool) {
        self.ready.store(answered, Ordering::Relaxed);
        if answered {
            self.heard();
            self.refused.store(false, Ordering::Relaxed);
        }
    }

    /// Records that Redis answered a call.
    pub(super) fn replied(&self) {
        self.heard();
        if !self.refused.load(Ordering::Relaxed) {
            self.ready.store(true, Ordering::Relaxed);
        }
    }

    fn heard(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.answered_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether Redis has been silent for longer than [`KEEPALIVE`].
    fn silent(&self) -> bool {
        let since = Duration::from_millis(self.answered_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(since) > KEEPALIVE
    }

    /// Awaits `call` within the deadline, mapping a miss and Redis errors.
    pub(super) async fn within<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.timeout(), call).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) => Err(self.classify(&e)),
            Ok(Ok(v)) => Ok(v),
        }
    }
}

/// Sends PING within the deadline.
async fn send_ping(shared: &Shared) -> Result<(), StoreError> {
    let mut conn = shared.conn.clone();
    let cmd = redis::cmd("PING");
    shared
        .within(send(&mut conn, &cmd, Resend::AfterAnyLoss))
        .await
        .map(drop)
}

/// Pings a connection silent for [`KEEPALIVE`], and says whether it
/// answered. On a Cluster every master is pinged, each on its own
/// connection; one that does not answer leaves readiness alone, as the
/// others' slots still serve, and the client reconnects to it.
async fn keepalive(shared: &Shared) -> bool {
    match &shared.conn {
        Conn::Single(_) => send_ping(shared).await.is_ok(),
        Conn::Cluster(c) => {
            let mut conn = c.clone();
            let masters = RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllMasters,
                Some(ResponsePolicy::AllSucceeded),
            ));
            let pinged = conn.route_command(redis::cmd("PING"), masters);
            matches!(
                tokio::time::timeout(shared.config.timeout(), pinged).await,
                Ok(Ok(_))
            )
        }
    }
}

pub(super) async fn ping(shared: &Shared) -> Result<(), StoreError> {
    let answered = send_ping(shared).await;
    shared.pinged(answered.is_ok());
    answered
}

/// Pings while Redis is not answering, so readiness (and the connection)
/// comes back without waiting for traffic; after a call missed its
/// deadline, to tell a hung Redis from a passing stall; and when the
/// connection has been silent for [`KEEPALIVE`], so that a connection that
/// died while the store was idle is replaced before a call needs it.
pub(super) async fn watch(shared: Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        if !s.ready.load(Ordering::Relaxed) || s.suspect.swap(false, Ordering::Relaxed) {
            let _ = ping(&s).await;
        } else if s.silent() && keepalive(&s).await {
            // A keepalive that failed has said so already: a refused or
            // lost connection made the store not ready, and a missed
            // deadline made it suspect, to be pinged again at once.
            s.pinged(true);
        }
        // While Redis refuses, calls fail at once until a ping is answered:
        // ping often then (each ping one connection attempt, refused at
        // once), so that they resume soon after Redis does.
        let pause = if s.ready.load(Ordering::Relaxed) {
            KEEPALIVE
        } else {
            Duration::from_millis(10)
        };
        drop(s);
        tokio::time::sleep(pause).await;
    }
}
