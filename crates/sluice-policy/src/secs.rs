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
                nanos_of_secs(v)
                    .map(Secs)
                    .ok_or_else(|| E::custom(format_args!("duration {v} s is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Secs, E> {
                v.checked_mul(Nanos::PER_SEC)
                    .map(|ns| Secs(Nanos(ns)))
                    .ok_or_else(|| E::custom(format_args!("duration {v} s is out of range")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Secs, E> {
                match i64::try_from(v) {
                    Ok(v) => self.visit_i64(v),
                    Err(_) => Err(E::custom(format_args!("duration {v} s is out of range"))),
                }
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

/// `secs` seconds in nanoseconds ([`Nanos::from_secs_f64`]), and where a
/// double cannot tell nanoseconds apart (from about 97 days up; at today's
/// epoch it resolves about 240 ns), the nearest microsecond it may stand
/// for: the policy keeps periods and starts to whole microseconds, and a
/// `start` of `1795820513.000001` means the microsecond it says.
fn nanos_of_secs(secs: f64) -> Option<Nanos> {
    let ns = Nanos::from_secs_f64(secs)?.0;
    let resolution = (secs.abs().next_up() - secs.abs()) * Nanos::PER_SEC as f64;
    if resolution > 1.0 {
        let micros = (ns + 500).div_euclid(1000) * 1000;
        if (micros - ns).abs() as f64 <= resolution / 2.0 {
            return Some(Nanos(micros));
        }
    }
    Some(Nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_at_epoch_scale_are_converted_as_written() {
        let cases = [
            (1795820513.25, 1_795_820_513_250_000_000),
            (1795820513.000001, 1_795_820_513_000_001_000),
            (1795820513.0, 1_795_820_513_000_000_000),
            (0.5, 500_000_000),
            (1e-9, 1),
            (-2.5, -2_500_000_000),
        ];
        for (secs, ns) in cases {
            assert_eq!(nanos_of_secs(secs), Some(Nanos(ns)), "{secs}");
        }
        // Half a microsecond a double can hold is not rounded away.
        assert_eq!(nanos_of_secs(1.0000005), Some(Nanos(1_000_000_500)));
        assert_eq!(nanos_of_secs(1e10), None);
        assert_eq!(nanos_of_secs(f64::NAN), None);
        assert_eq!(nanos_of_secs(f64::INFINITY), None);
    }
}
