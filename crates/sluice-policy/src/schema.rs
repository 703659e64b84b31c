//! The policy file as written: serde types that mirror the YAML/JSON, with
//! every value that later validation may reject wrapped in [`Spanned`] so that
//! the error can point at it.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::identity::jwt::RawJwt;
use sluice_core::OnStoreError;

use crate::secs::Secs;
use crate::settings::{Enforcement, OnMissing};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub(crate) store: Option<Spanned<RawStore>>,
    pub(crate) on_store_error: Option<OnStoreError>,
    pub(crate) trusted_proxies: Option<Spanned<RawTrustedProxies>>,
    pub(crate) ipv6_prefix: Option<Spanned<u64>>,
    pub(crate) jwt: Option<Spanned<RawJwt>>,
    pub(crate) limits: Option<Entries<RawLimit>>,
    pub(crate) rules: Option<Vec<Spanned<RawRule>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StoreKind {
    Memory,
    Redis,
    Postgres,
}

// One flat struct rather than an internally tagged enum: serde buffers tagged
// enums, and buffering loses the positions of the values inside.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub(crate) kind: StoreKind,
    pub(crate) max_keys: Option<Spanned<u64>>,
    pub(crate) url: Option<Spanned<String>>,
    pub(crate) timeout_ms: Option<Spanned<u64>>,
    pub(crate) schema: Option<Spanned<String>>,
    pub(crate) durable: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AlgorithmKind {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Concurrency,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) algorithm_config: Spanned<RawConfig>,
    pub(crate) mode: Option<Enforcement>,
    pub(crate) on_store_error: Option<OnStoreError>,
    pub(crate) penalty: Option<Spanned<Secs>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub(crate) name: Spanned<String>,
    pub(crate) limit_keys: Vec<Spanned<String>>,
    #[serde(rename = "match")]
    pub(crate) conditions: Option<Entries<String>>,
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) algorithm_config: Spanned<RawConfig>,
    pub(crate) mode: Option<Enforcement>,
    pub(crate) on_store_error: Option<OnStoreError>,
    pub(crate) on_missing: Option<OnMissing>,
    pub(crate) domain: Option<Spanned<String>>,
    pub(crate) group: Option<Spanned<String>>,
    pub(crate) penalty: Option<Spanned<Secs>>,
    pub(crate) on_limit: Option<Spanned<RawOnLimit>>,
}

/// `on_limit`: what a rule does with a request over its limit. Without
/// `delay`, it refuses it, as a rule without `on_limit` does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOnLimit {
    pub(crate) delay: Option<Spanned<RawDelay>>,
}

/// `on_limit: {delay: {max: 2s}}`: hold a request that a reservation admits
/// within `max`, and forward it when it is due.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDelay {
    pub(crate) max: Spanned<Secs>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) rps: Option<Spanned<Num>>,
    pub(crate) tokens_per_second: Option<Spanned<Num>>,
    pub(crate) rate: Option<Spanned<Num>>,
    pub(crate) period: Option<Spanned<Secs>>,
    pub(crate) burst: Option<Spanned<Num>>,
    pub(crate) capacity: Option<Spanned<Num>>,
    pub(crate) start: Option<Spanned<Secs>>,
    pub(crate) calendar: Option<Spanned<String>>,
    pub(crate) timezone: Option<Spanned<String>>,
    pub(crate) max_reserved: Option<Spanned<Num>>,
    pub(crate) shards: Option<Spanned<u32>>,
    pub(crate) cost_source: Option<Spanned<String>>,
    pub(crate) fixed_cost: Option<Spanned<Num>>,
    pub(crate) default_cost: Option<Spanned<Num>>,
    pub(crate) max: Option<Spanned<Num>>,
    pub(crate) lease: Option<Spanned<Secs>>,
}

/// A mapping kept in file order, keys with their positions.
///
/// Duplicate keys never reach this type: the parser rejects them with a
/// position, which is the error we want for duplicate limit names.
/// `trusted_proxies`: a list of CIDRs, or `{cidrs: [...], header: ...}`
/// naming the one forwarding header the proxies write. Read by hand, since
/// an untagged enum would buffer the values and lose their positions.
#[derive(Debug, Default)]
pub(crate) struct RawTrustedProxies {
    pub(crate) cidrs: Vec<Spanned<String>>,
    pub(crate) header: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawTrustedProxies {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TrustedVisitor;
        impl<'de> Visitor<'de> for TrustedVisitor {
            type Value = RawTrustedProxies;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of CIDRs, or a mapping with `cidrs` and `header`")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut cidrs = Vec::new();
                while let Some(c) = seq.next_element()? {
                    cidrs.push(c);
                }
                Ok(RawTrustedProxies {
                    cidrs,
                    header: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = RawTrustedProxies::default();
                let mut seen_cidrs = false;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "cidrs" if !seen_cidrs => {
                            out.cidrs = map.next_value()?;
                            seen_cidrs = true;
                        }
                        "header" if out.header.is_none() => out.header = Some(map.next_value()?),
                        "cidrs" | "header" => {
                            return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                        }
                        _ => return Err(de::Error::unknown_field(&key, &["cidrs", "header"])),
                    }
                }
                if !seen_cidrs {
                    return Err(de::Error::missing_field("cidrs"));
                }
                Ok(out)
            }
        }
        d.deserialize_any(TrustedVisitor)
    }
}

#[derive(Debug)]
pub(crate) struct Entries<V>(pub(crate) Vec<(Spanned<String>, Spanned<V>)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<V>, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(EntriesVisitor(PhantomData))
    }
}

/// A number written as a YAML/JSON number (quoted strings are rejected so that
/// `rate: "fast"` gets a clear message rather than a parse failure).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Num(pub(crate) f64);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NumVisitor;
        impl Visitor<'_> for NumVisitor {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
                Ok(Num(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Num, E> {
                Err(E::custom(format_args!("expected a number, got {v:?}")))
            }
        }
        d.deserialize_any(NumVisitor)
    }
}
