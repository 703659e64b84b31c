//! Redis key names: `{prefix}{<key>}:<limit>[:<shard>]`, where the braces
//! make the caller's key the Cluster hash tag, so every limit and shard of one
//! key lives in one slot and a transaction over them is one script call.

use sluice_core::Limit;

/// The Redis key holding `shard` of `key` under the limit `limit`.
///
/// `\` and `}` in the key are escaped, so that the tag ends where the key ends
/// and distinct (key, limit) pairs never share a name.
pub(crate) fn state_key(prefix: &str, key: &str, limit: &str, shard: Option<u32>) -> String {
    let mut out = String::with_capacity(prefix.len() + key.len() + limit.len() + 8);
    out.push_str(prefix);
    out.push('{');
    for c in key.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '}' => out.push_str("\\)"),
            c => out.push(c),
        }
    }
    out.push_str("}:");
    out.push_str(limit);
    if let Some(s) = shard {
        out.push(':');
        out.push_str(&s.to_string());
    }
    out
}

/// The Redis key of `shard` of `key` under `limit`: unsharded limits have
/// no shard suffix.
pub(crate) fn shard_key(prefix: &str, limit: &Limit, key: &str, shard: u32) -> String {
    let shard = (limit.shards() > 1).then_some(shard);
    state_key(prefix, key, limit.name(), shard)
}

/// The Cluster slot of a key name, per the Cluster specification.
pub(crate) fn slot(name: &str) -> u16 {
    let b = name.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &b[open + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(b)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unambiguous_and_tagged_by_key() {
        assert_eq!(state_key("s:", "u1", "api", None), "s:{u1}:api");
        assert_eq!(state_key("s:", "u1", "api", Some(3)), "s:{u1}:api:3");
        // Without escaping, these two would share a name.
        assert_ne!(
            state_key("s:", "a}:b", "c", None),
            state_key("s:", "a", "b}:c", None)
        );
        assert_eq!(state_key("s:", "a}b\\", "l", None), "s:{a\\)b\\\\}:l");
        assert_eq!(
            slot(&state_key("s:", "u1", "api", None)),
            slot(&state_key("s:", "u1", "other", Some(1)))
        );
    }

    #[test]
    fn slots_match_the_cluster_specification() {
        // Examples from the Redis Cluster specification.
        assert_eq!(slot("123456789"), 0x31c3);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }
}
