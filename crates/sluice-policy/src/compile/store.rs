//! The policy's `store`: memory, Redis or PostgreSQL, and the settings
//! each of them takes.

use std::time::Duration;

use serde_saphyr::Spanned;

use crate::error::{Invalid, at};
use crate::policy::StoreConfig;
use crate::schema::{RawStore, StoreKind};

pub(super) fn store(s: &Spanned<RawStore>) -> Result<StoreConfig, Invalid> {
    let r = &s.value;
    let wrong = |field: &str, kind: &str| format!("`{field}` applies to the {kind} store only");
    let timeout = || match &r.timeout_ms {
        Some(t) if t.value == 0 => Err(at(t, "`timeout_ms` must be at least 1")),
        Some(t) => Ok(Some(Duration::from_millis(t.value))),
        None => Ok(None),
    };
    if !matches!(r.kind, StoreKind::Postgres) {
        if let Some(x) = &r.schema {
            return Err(at(x, wrong("schema", "postgres")));
        }
        if let Some(x) = &r.durable {
            return Err(at(x, wrong("durable", "postgres")));
        }
    }
    match r.kind {
        StoreKind::Memory => {
            if let Some(u) = &r.url {
                return Err(at(u, wrong("url", "redis or postgres")));
            }
            if let Some(t) = &r.timeout_ms {
                return Err(at(t, wrong("timeout_ms", "redis or postgres")));
            }
            let max_keys = match &r.max_keys {
                Some(m) if m.value == 0 => return Err(at(m, "`max_keys` must be at least 1")),
                Some(m) => Some(usize::try_from(m.value).map_err(|_| at(m, "too large"))?),
                None => None,
            };
            Ok(StoreConfig::Memory { max_keys })
        }
        StoreKind::Redis => {
            if let Some(m) = &r.max_keys {
                return Err(at(m, wrong("max_keys", "memory")));
            }
            let Some(url) = &r.url else {
                return Err(at(
                    s,
                    "a redis store needs a `url`, such as redis://127.0.0.1:6379/0",
                ));
            };
            if !(url.value.starts_with("redis://") || url.value.starts_with("rediss://")) {
                return Err(at(
                    url,
                    "the redis `url` must start with redis:// or rediss://",
                ));
            }
            Ok(StoreConfig::Redis {
                url: url.value.clone(),
                timeout: timeout()?,
            })
        }
        StoreKind::Postgres => {
            if let Some(m) = &r.max_keys {
                return Err(at(m, wrong("max_keys", "memory")));
            }
            let Some(url) = &r.url else {
                return Err(at(
                    s,
                    "a postgres store needs a `url`, such as postgres://app@127.0.0.1:5432/app",
                ));
            };
            if !(url.value.starts_with("postgres://") || url.value.starts_with("postgresql://")) {
                return Err(at(
                    url,
                    "the postgres `url` must start with postgres:// or postgresql://",
                ));
            }
            if let Some(x) = &r.schema {
                let plain = x.value.len() <= 63
                    && x.value
                        .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && x.value
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !plain {
                    return Err(at(
                        x,
                        "`schema` must be 1 to 63 lowercase ASCII letters, digits and `_`, \
                         starting with a letter or `_`",
                    ));
                }
            }
            Ok(StoreConfig::Postgres {
                url: url.value.clone(),
                timeout: timeout()?,
                schema: r.schema.as_ref().map(|x| x.value.clone()),
                durable: r.durable.as_ref().is_none_or(|d| d.value),
            })
        }
    }
}
