//! The connection to Redis (to one node, reconnecting, or to a Cluster,
//! routing), and how a command is sent on it: again only when it cannot
//! have run (see [`send`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use crate::config::RedisConfig;

/// A connection to one node (reconnecting) or to a Cluster (routing).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Connects lazily: nothing here waits for Redis.
pub(super) fn connect(config: &RedisConfig) -> Result<Conn, RedisError> {
    let timeout = config.timeout();
    if config.is_cluster() {
        // No retries by the client: it sends a command again after its
        // connection was lost too, when a script may have run already.
        // `send` retries what never ran, redirections included.
        let client =
            redis::cluster::ClusterClient::builder(config.nodes().iter().map(String::as_str))
                .connection_timeout(timeout.max(Duration::from_millis(100)))
                .response_timeout(timeout.max(Duration::from_millis(100)))
                .retries(0)
                .build()?;
        let conn =
            client.get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
        Ok(Conn::Cluster(conn))
    } else {
        let node = config.nodes().first().map_or("", String::as_str);
        let client = redis::Client::open(node)?;
        // One connection attempt per reconnection, without backoff: the
        // health check paces the attempts while Redis is down, and a call
        // made once Redis is back never waits out a backoff sleep started
        // while it was down.
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_response_timeout(None)
            .set_number_of_retries(0);
        Ok(Conn::Single(ConnectionManager::new_lazy_with_config(
            client, manager,
        )?))
    }
}

/// What may be sent again after its first try failed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Resend {
    /// A command that changes what Redis holds: only if it never left.
    IfUnsent,
    /// A command that changes nothing (PING): after any lost connection too.
    AfterAnyLoss,
}

/// How many times [`send`] tries a command at most.
const TRIES: usize = 3;

/// Sends `cmd`, and again, up to [`TRIES`] times in all, while it failed in
/// a way `resend` allows; every caller bounds the whole with its deadline.
///
/// Why a script call sent again cannot spend twice: it is sent again only
/// when it never ran. A refusal comes only from opening a connection (a TCP
/// reset answering the connection request, or a missing Unix socket),
/// never from one that carried a command: an established connection that
/// breaks reports a reset or a broken pipe. A Cluster node that answers
/// MOVED, ASK, TRYAGAIN or CLUSTERDOWN has turned the call away before
/// running it, and a Cluster with no connection to any node has sent
/// nothing. A script call that failed any other way (a broken pipe, a
/// reset, a missed deadline) may have run before it failed, so it is never
/// sent again, by this or by the Cluster client (see [`connect`]); its
/// caller fails open or closed instead.
///
/// A refusal is tried again once: the first can be stale, kept by the
/// connection manager from an attempt made while Redis was down until
/// something used the connection; using it started a fresh attempt, which
/// the second try waits for, and a refusal then says that Redis refuses
/// now. A redirection is followed as a Cluster client follows it: ASK with
/// ASKING to the node named, MOVED once the client has read the new slot
/// map, which it does on seeing MOVED.
pub(super) async fn send(conn: &mut Conn, cmd: &Cmd, resend: Resend) -> Result<Value, RedisError> {
    let mut result = cmd.query_async::<Value>(conn).await;
    let mut refused = false;
    for _ in 1..TRIES {
        let Err(e) = &result else { break };
        let again = if e.is_connection_refusal() {
            // Once only, as said above.
            let first = !refused;
            refused = true;
            first
        } else {
            turned_away(e) || (resend == Resend::AfterAnyLoss && e.is_connection_dropped())
        };
        if !again {
            break;
        }
        result = match (e.redirect_node(), &mut *conn) {
            (Some((node, _)), Conn::Cluster(c))
                if e.kind() == ErrorKind::Server(ServerErrorKind::Ask) =>
            {
                asking(c, cmd, node).await
            }
            _ => cmd.query_async::<Value>(conn).await,
        };
    }
    result
}

/// Whether a Cluster turned a command away before it ran.
fn turned_away(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        ) | ErrorKind::ClusterConnectionNotFound
    )
}

/// `cmd` sent to the Cluster node `node` (`host:port`) after ASKING, as an
/// ASK redirection asks: the node is importing the slot of `cmd`'s keys.
async fn asking(conn: &mut ClusterConnection, cmd: &Cmd, node: &str) -> Result<Value, RedisError> {
    let (host, port) = node
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
        .ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "an ASK to no node", node.to_owned()))
        })?;
    let mut pipeline = redis::pipe();
    pipeline.cmd("ASKING").add_command(cmd.clone());
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    // Only the command's reply, not ASKING's.
    let mut replies = conn.route_pipeline(pipeline, 1, 1, route).await?;
    replies
        .pop()
        .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply after ASKING")))?
        .extract_error()
}
