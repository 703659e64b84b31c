//! A call's rows: which rows its keys and shards are, and the bytes a row
//! keeps for a key.

use std::borrow::Cow;

use sha2::{Digest as _, Sha256};
use sluice_core::{Limit, Op};

/// A row's key: the limit's name, the key, the shard.
pub(crate) type Row = (String, String, u32);

/// The row of `limit`'s shard `shard` of `key`.
pub(super) fn row(limit: &Limit, key: &str, shard: u32) -> Row {
    (limit.name().to_owned(), key.to_owned(), shard)
}

/// The rows every shard of `key` of `limit` keeps.
pub(super) fn shard_rows(limit: &Limit, key: &str) -> Vec<Row> {
    (0..limit.shards()).map(|s| row(limit, key, s)).collect()
}

/// The rows `ops` may use: both candidate shards of each.
pub(super) fn op_rows(ops: &[Op<'_>]) -> Vec<Row> {
    let mut rows: Vec<Row> = ops
        .iter()
        .flat_map(|op| {
            let (a, b) = op.shards();
            [row(op.limit, op.key, a), row(op.limit, op.key, b)]
        })
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// The longest key kept as it is; a longer one is kept as its digest.
const MAX_KEY_IN_ROW: usize = 1_024;

/// The bytes a row keeps for `key`: the key itself, or, beyond
/// [`MAX_KEY_IN_ROW`] bytes (an index row holds some 2,700), `0xFF` and
/// the key's SHA-256, which no key's own bytes can be (no UTF-8 string has
/// a byte `0xFF`). Bytes, not text, because a key may hold a NUL, which
/// PostgreSQL's text cannot.
fn stored_key(key: &str) -> Cow<'_, [u8]> {
    if key.len() <= MAX_KEY_IN_ROW {
        return Cow::Borrowed(key.as_bytes());
    }
    let mut digest = Vec::with_capacity(33);
    digest.push(0xFF);
    digest.extend_from_slice(&Sha256::digest(key.as_bytes()));
    Cow::Owned(digest)
}

/// Keys' bytes as sqlx binds an array of `bytea`.
pub(super) fn slices<'a>(keys: &'a [Cow<'_, [u8]>]) -> Vec<&'a [u8]> {
    keys.iter().map(AsRef::as_ref).collect()
}

/// Rows as the three arrays a statement takes: limits, keys, shards.
pub(super) type Columns<'a> = (Vec<&'a str>, Vec<Cow<'a, [u8]>>, Vec<i32>);

/// Rows as the three arrays a statement takes.
pub(super) fn columns<'a>(rows: impl Iterator<Item = &'a Row>) -> Columns<'a> {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (l, k, s) in rows {
        out.0.push(l.as_str());
        out.1.push(stored_key(k));
        // Shards are at most 1,024.
        out.2.push(*s as i32);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_long_key_is_kept_as_a_digest_no_key_can_be() {
        let long = "k".repeat(MAX_KEY_IN_ROW + 1);
        let kept = stored_key(&long);
        assert_eq!((kept.len(), kept[0]), (33, 0xFF));
        assert_ne!(stored_key(&format!("{long}x")), kept);
        assert_eq!(stored_key("a\0b").as_ref(), b"a\0b");
        assert_eq!(stored_key(&long[1..]).len(), MAX_KEY_IN_ROW);
    }
}
