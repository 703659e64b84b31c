//! Durations in the policy file: seconds as a number (`60`, `0.5`), or a
//! duration with units as humantime writes them (`500ms`, `1m`, `1h`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Visitor};
use sluice_core::Nanos;

/// A span of time: seconds as a number, or a duration string such as `500ms`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Secs(pub(crate) Nanos);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SecsVisitor;
        impl Visitor<'_> for SecsVisitor {
            type Value = Secs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("seconds as a number, or a duration such as 500ms, 1s, 1m, 1h or 1d")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Secs, E> {
                Nanos::from_secs_f64(v)
                    .map(Secs)
                    .ok_or_else(|| E::custom(format_args!("duration {v} s is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Secs, E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Secs, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Secs, E> {
                let d = humantime::parse_duration(v.trim()).map_err(|e| {
                    E::custom(format_args!(
                        "invalid duration {v:?} ({e}); write seconds as a number, \
                         or a duration such as 500ms, 1s, 1m, 1h or 1d"
                    ))
                })?;
                i64::try_from(d.as_nanos())
                    .map(|n| Secs(Nanos(n)))
                    .map_err(|_| E::custom(format_args!("duration {v:?} is out of range")))
            }
        }
        d.deserialize_any(SecsVisitor)
    }
}
