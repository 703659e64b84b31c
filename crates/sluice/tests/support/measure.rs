//! What a load test's client saw of each call, and the most admissions
//! those sightings prove happened within one period: how the tests that
//! hammer several servers on one store (`shared_redis`, `image`) hold them
//! to a limit without trusting any server's clock.

use std::time::{Duration, Instant};

/// One request as its client saw it: when it was sent, when the answer
/// came, and whether it was admitted. The store decided it somewhere
/// between the two times.
#[derive(Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) sent: Instant,
    pub(crate) answered: Instant,
    pub(crate) allowed: bool,
}

/// The most admissions the calls in `seen` prove happened within one
/// `period`: those sent at or after some admission's sending and answered
/// before a period after it. Every admission of such a group was decided
/// inside one span shorter than `period`, so a limit of `rate` per period
/// must have admitted at most `rate` of them, whatever the latencies.
pub(crate) fn most_in_one_period(seen: &[Seen], period: Duration) -> usize {
    let mut admitted: Vec<&Seen> = seen.iter().filter(|s| s.allowed).collect();
    admitted.sort_by_key(|s| s.sent);
    admitted
        .iter()
        .enumerate()
        .map(|(i, first)| {
            admitted[i..]
                .iter()
                .take_while(|s| s.sent < first.sent + period)
                .filter(|s| s.answered < first.sent + period)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// `per_server` callers for each server of `bases`, each sending `POST
/// /v1/limit` with `body` as soon as its last answer came, until `until`;
/// what they saw. Every answer must be a decision: 200 or 429.
pub(crate) async fn hammer(
    client: &reqwest::Client,
    bases: &[String],
    per_server: usize,
    body: &'static str,
    until: Instant,
) -> Vec<Seen> {
    let callers: Vec<_> = bases
        .iter()
        .flat_map(|base| std::iter::repeat_n(base.clone(), per_server))
        .map(|base| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while Instant::now() < until {
                    let sent = Instant::now();
                    let res = client
                        .post(format!("{base}/v1/limit"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    let status = res.status().as_u16();
                    assert!(status == 200 || status == 429, "{status}");
                    seen.push(Seen {
                        sent,
                        answered: Instant::now(),
                        allowed: status == 200,
                    });
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for caller in callers {
        seen.extend(caller.await.unwrap());
    }
    seen
}
