//! Replay input: one JSON event per line, either a request or a call to a
//! named limit.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::net::IpAddr;

use anyhow::{Context, bail};
use serde::Deserialize;
use sluice_core::Settle;
use sluice_policy::RequestParts;

/// The longest line one event may take, in bytes: a thousand times a
/// request with a few hundred bytes of headers, and small enough that input
/// with no line ends (`/dev/zero`, a binary file, a stream cut without
/// newlines) is refused after a mebibyte instead of read into memory whole.
pub(crate) const MAX_EVENT_LINE_BYTES: usize = 1 << 20;

/// The lines of an events file or stream, read one at a time into one
/// buffer, which never holds more than [`MAX_EVENT_LINE_BYTES`] and a byte
/// (its capacity at most twice that), whatever the input.
pub(crate) struct EventLines<R> {
    input: R,
    /// The file's name, for errors.
    name: String,
    line: Vec<u8>,
    number: usize,
}

impl<R: BufRead> EventLines<R> {
    /// Lines of `input`; `name` names it in errors.
    pub(crate) fn new(input: R, name: &str) -> EventLines<R> {
        EventLines {
            input,
            name: name.to_owned(),
            line: Vec::new(),
            number: 0,
        }
    }

    /// The next line, without its line ending (`\n` or `\r\n`), and its
    /// number, from 1; `None` at the end of the input. An error names the
    /// file and the line.
    pub(crate) fn next_line(&mut self) -> anyhow::Result<Option<(usize, &str)>> {
        self.line.clear();
        self.number += 1;
        let (name, n) = (&self.name, self.number);
        // One byte past the bound tells a line at the bound from a longer
        // one without reading the rest of it.
        let most = MAX_EVENT_LINE_BYTES as u64 + 1;
        let read = (&mut self.input)
            .take(most)
            .read_until(b'\n', &mut self.line)
            .with_context(|| format!("{name}:{n}: cannot read"))?;
        if read == 0 {
            return Ok(None);
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
        } else if self.line.len() > MAX_EVENT_LINE_BYTES {
            bail!(
                "{name}:{n}: the line is longer than {MAX_EVENT_LINE_BYTES} bytes, the most \
                 an event may take (is this a file of JSON lines?)"
            );
        }
        let text = std::str::from_utf8(&self.line)
            .map_err(|e| anyhow::anyhow!("{name}:{n}: not UTF-8 text: {e}"))?;
        Ok(Some((n, text)))
    }
}

/// The fields of both kinds of event; which ones are present says which
/// kind it is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    // Kept as written so that the output echoes `t` exactly.
    t: serde_json::Number,
    ip: Option<String>,
    method: Option<String>,
    path: Option<String>,
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    query: Option<String>,
    limit: Option<String>,
    key: Option<String>,
    count: Option<f64>,
    reserve: Option<bool>,
    refund: Option<bool>,
    force: Option<bool>,
    /// Seconds the event's slots on concurrency limits are held.
    duration: Option<f64>,
    /// A name for the lease a call takes, for a later event to release.
    lease: Option<String>,
    /// The name of a lease to release.
    release: Option<String>,
    algorithm: Option<serde_json::Value>,
    algorithm_config: Option<serde_json::Value>,
}

/// One replayed event.
#[derive(Debug)]
pub(crate) enum Event {
    /// A request, evaluated against the policy's rules, holding its slots
    /// on concurrency rules for `duration` seconds (0: it takes no time).
    Request(RequestParts, f64),
    /// A call to a named limit, as the decision API or the library makes.
    Call(Call),
    /// The release of a lease a call named.
    Release {
        limit: String,
        key: String,
        lease: String,
    },
}

/// How long a call on a concurrency limit holds its lease.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Hold {
    /// Until it expires: nothing releases it.
    Expiry,
    /// For this many seconds.
    For(f64),
    /// Until an event releases it by this name.
    Named(String),
}

/// A call to a named limit, or to one it brings (`algorithm` and
/// `algorithm_config`, whose state `limit` names).
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) limit: String,
    pub(crate) key: String,
    pub(crate) count: f64,
    pub(crate) reserve: bool,
    /// Give `count` back (`"refund": true`), or charge it whatever the key
    /// holds (`"force": true`), instead of deciding a call.
    pub(crate) settle: Option<Settle>,
    /// How long a lease taken on a concurrency limit is held.
    pub(crate) hold: Hold,
    /// The call's own limit: its algorithm and that algorithm's settings.
    pub(crate) inline: Option<(serde_json::Value, serde_json::Value)>,
}

impl RawEvent {
    /// Whether any field of a request event is given.
    fn has_request_fields(&self) -> bool {
        self.ip.is_some()
            || self.method.is_some()
            || self.path.is_some()
            || self.host.is_some()
            || !self.headers.is_empty()
            || self.query.is_some()
    }

    /// Whether any field of a named-limit call is given, but `limit`, `key`
    /// and `duration`, which others share.
    fn has_call_fields(&self) -> bool {
        self.count.is_some()
            || self.reserve.is_some()
            || self.refund.is_some()
            || self.force.is_some()
            || self.lease.is_some()
            || self.algorithm.is_some()
            || self.algorithm_config.is_some()
    }
}

/// Parses one line; errors say what is wrong, and the caller adds where.
pub(crate) fn parse(line: &str) -> anyhow::Result<(serde_json::Number, Event)> {
    let raw: RawEvent = serde_json::from_str(line)?;
    if !raw.t.as_f64().is_some_and(f64::is_finite) {
        bail!("`t` must be a finite number of seconds");
    }
    let duration = match raw.duration {
        Some(d) if !(d.is_finite() && d >= 0.0) => {
            bail!("`duration` must be a finite number of seconds ≥ 0, got {d}")
        }
        d => d,
    };
    let (request_fields, call_fields_but_key) = (raw.has_request_fields(), raw.has_call_fields());
    let call_fields = raw.key.is_some() || call_fields_but_key;
    if let Some(lease) = raw.release {
        let Some(limit) = raw.limit else {
            bail!("`release` names a lease of a named limit, which needs `limit`");
        };
        if request_fields || call_fields_but_key || raw.duration.is_some() {
            bail!("a release event has `t`, `limit`, `key` and `release`, and nothing else");
        }
        let key = raw.key.unwrap_or_default();
        return Ok((raw.t, Event::Release { limit, key, lease }));
    }
    let event = match raw.limit {
        Some(limit) => {
            if request_fields {
                bail!(
                    "an event is either a request (ip, method, path, host, headers, query) \
                     or a named-limit call (limit, key, count, reserve, refund, force, \
                     algorithm, algorithm_config), not both"
                );
            }
            let inline = match (raw.algorithm, raw.algorithm_config) {
                (None, None) => None,
                (Some(algorithm), config) => {
                    Some((algorithm, config.unwrap_or(serde_json::Value::Null)))
                }
                (None, Some(_)) => bail!("`algorithm_config` needs the `algorithm` it configures"),
            };
            let count = raw.count.unwrap_or(1.0);
            let reserve = raw.reserve.unwrap_or(false);
            let settle = match (raw.refund.unwrap_or(false), raw.force.unwrap_or(false)) {
                (false, false) => None,
                (true, true) => bail!("an event refunds or forces a charge, not both"),
                _ if reserve => bail!("a refund or a forced charge takes no `reserve`"),
                (true, false) => Some(Settle::Refund(count)),
                (false, true) => Some(Settle::Charge(count)),
            };
            let hold = match (duration, raw.lease) {
                (None, None) => Hold::Expiry,
                (Some(d), None) => Hold::For(d),
                (None, Some(name)) => Hold::Named(name),
                (Some(_), Some(_)) => {
                    bail!(
                        "a lease is held for a `duration` or until it is released by name, not both"
                    )
                }
            };
            Event::Call(Call {
                limit,
                key: raw.key.unwrap_or_default(),
                count,
                reserve,
                settle,
                hold,
                inline,
            })
        }
        None => {
            if call_fields {
                bail!(
                    "`key`, `count`, `reserve`, `refund`, `force`, `lease`, `algorithm` and \
                     `algorithm_config` belong to named-limit calls, which need `limit`"
                );
            }
            let ip = raw
                .ip
                .map(|ip| {
                    ip.parse::<IpAddr>()
                        .with_context(|| format!("bad `ip` {ip:?}"))
                })
                .transpose()?;
            let parts = RequestParts {
                ip,
                method: raw.method.unwrap_or_else(|| "GET".to_owned()),
                path: raw.path.unwrap_or_else(|| "/".to_owned()),
                host: raw.host,
                headers: raw.headers.into_iter().collect(),
                query: raw.query.unwrap_or_default(),
                // Recorded tokens can't be verified in virtual time: their
                // expiry is against the real clock. Replays see no claims.
                ..RequestParts::default()
            };
            Event::Request(parts, duration.unwrap_or(0.0))
        }
    };
    Ok((raw.t, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_end_at_a_newline_with_or_without_a_carriage_return() {
        let input = "{\"t\": 1}\r\n\n{\"t\": 2}".as_bytes();
        let mut lines = EventLines::new(input, "e.jsonl");
        assert_eq!(lines.next_line().unwrap(), Some((1, "{\"t\": 1}")));
        assert_eq!(lines.next_line().unwrap(), Some((2, "")));
        assert_eq!(lines.next_line().unwrap(), Some((3, "{\"t\": 2}")));
        assert_eq!(lines.next_line().unwrap(), None);
        let err = EventLines::new(&b"\xff\n"[..], "e.jsonl")
            .next_line()
            .unwrap_err();
        assert!(err.to_string().starts_with("e.jsonl:1: not UTF-8"), "{err}");
    }

    #[test]
    fn a_line_at_the_bound_is_read_and_one_byte_more_is_refused() {
        let at_bound = format!("{}\n{}", " ".repeat(MAX_EVENT_LINE_BYTES), "x");
        let mut lines = EventLines::new(at_bound.as_bytes(), "e.jsonl");
        let (n, line) = lines.next_line().unwrap().unwrap();
        assert_eq!((n, line.len()), (1, MAX_EVENT_LINE_BYTES));
        assert_eq!(lines.next_line().unwrap(), Some((2, "x")));
        let over = format!("{{}}\n{}\n", " ".repeat(MAX_EVENT_LINE_BYTES + 1));
        let mut lines = EventLines::new(over.as_bytes(), "e.jsonl");
        assert_eq!(lines.next_line().unwrap(), Some((1, "{}")));
        let err = lines.next_line().unwrap_err().to_string();
        assert!(
            err.starts_with("e.jsonl:2: the line is longer than 1048576 bytes"),
            "{err}"
        );
    }

    /// Zeros without end, as `/dev/zero` gives, and a line of 100 MB: each
    /// is refused once the bound is passed, having held no more than it.
    #[test]
    fn endless_input_without_line_ends_is_refused_within_the_bound() {
        let zeros = std::io::BufReader::new(std::io::repeat(0));
        let huge =
            std::io::BufReader::new(std::io::repeat(b'a').take(100_000_000).chain(&b"\n"[..]));
        let inputs: [(&str, Box<dyn BufRead>); 2] =
            [("zeros", Box::new(zeros)), ("huge", Box::new(huge))];
        for (name, input) in inputs {
            let mut lines = EventLines::new(input, name);
            let err = lines.next_line().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{name}:1: the line is longer than")),
                "{err}"
            );
            let held = lines.line.capacity();
            assert!(
                held <= 2 * (MAX_EVENT_LINE_BYTES + 1),
                "{name}: {held} bytes held"
            );
        }
    }

    #[test]
    fn requests_and_calls_are_told_apart() {
        let (t, e) = parse(r#"{"t": 0.5, "ip": "::1", "headers": {"X-A": "1"}}"#).unwrap();
        assert_eq!(t.as_f64(), Some(0.5));
        let Event::Request(req, 0.0) = e else {
            panic!("request expected")
        };
        assert_eq!((req.method.as_str(), req.path.as_str()), ("GET", "/"));
        assert_eq!(req.headers, vec![("X-A".to_owned(), "1".to_owned())]);
        let (_, e) = parse(r#"{"t": 1, "limit": "l", "key": "u", "count": 2.5}"#).unwrap();
        assert!(matches!(
            e,
            Event::Call(Call {
                count: 2.5,
                reserve: false,
                settle: None,
                hold: Hold::Expiry,
                inline: None,
                ..
            })
        ));
        let (_, e) = parse(r#"{"t": 1, "limit": "l", "key": "u", "lease": "job-1"}"#).unwrap();
        assert!(matches!(e, Event::Call(Call { hold: Hold::Named(name), .. }) if name == "job-1"));
        let (_, e) = parse(r#"{"t": 2, "limit": "l", "key": "u", "release": "job-1"}"#).unwrap();
        assert!(matches!(e, Event::Release { lease, .. } if lease == "job-1"));
        let (_, e) = parse(r#"{"t": 2, "path": "/upload", "duration": 1.5}"#).unwrap();
        assert!(matches!(e, Event::Request(_, 1.5)));
        for (line, want) in [
            (
                r#"{"t": 1, "limit": "l", "count": 3, "refund": true}"#,
                Settle::Refund(3.0),
            ),
            (
                r#"{"t": 1, "limit": "l", "count": 4, "force": true}"#,
                Settle::Charge(4.0),
            ),
        ] {
            let Event::Call(call) = parse(line).unwrap().1 else {
                panic!("call expected")
            };
            assert_eq!(call.settle, Some(want), "{line}");
        }
        let inline = r#"{"t": 1, "limit": "q", "key": "u", "algorithm": "token_bucket", "algorithm_config": {"rps": 2}}"#;
        let Event::Call(call) = parse(inline).unwrap().1 else {
            panic!("call expected")
        };
        let (algorithm, config) = call.inline.unwrap();
        assert_eq!(
            (algorithm.as_str(), &config["rps"]),
            (Some("token_bucket"), &2.into())
        );
    }

    #[test]
    fn bad_events_say_why() {
        let cases = [
            (r#"{"t": "soon"}"#, "invalid type"),
            (r#"{"t": 1, "ip": "300.1.1.1"}"#, "bad `ip`"),
            (r#"{"t": 1, "limit": "l", "path": "/"}"#, "not both"),
            (r#"{"t": 1, "count": 2}"#, "need `limit`"),
            (r#"{"t": 1, "algorithm": "token_bucket"}"#, "need `limit`"),
            (
                r#"{"t": 1, "limit": "l", "algorithm_config": {"rps": 1}}"#,
                "needs the `algorithm`",
            ),
            (r#"{"t": 1, "heders": {}}"#, "unknown field `heders`"),
            (r#"{"t": 1, "refund": true}"#, "need `limit`"),
            (
                r#"{"t": 1, "limit": "l", "refund": true, "force": true}"#,
                "not both",
            ),
            (
                r#"{"t": 1, "limit": "l", "force": true, "reserve": true}"#,
                "takes no `reserve`",
            ),
            (r#"{"t": 1, "release": "a"}"#, "needs `limit`"),
            (
                r#"{"t": 1, "limit": "l", "release": "a", "count": 1}"#,
                "nothing else",
            ),
            (
                r#"{"t": 1, "limit": "l", "lease": "a", "duration": 1}"#,
                "not both",
            ),
            (r#"{"t": 1, "path": "/", "duration": -1}"#, "`duration`"),
            (r#"{"t": 1, "path": "/", "lease": "a"}"#, "need `limit`"),
            (r#"{"ip": "::1"}"#, "missing field `t`"),
            ("{", "EOF"),
        ];
        for (line, want) in cases {
            let err = format!("{:#}", parse(line).unwrap_err());
            assert!(err.contains(want), "{line}: {err}");
        }
    }
}
