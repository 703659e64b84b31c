//! `{key}` substitution: a path, body or descriptor value in which `{key}`
//! stands for one of K keys, `user:00000000` to `user:{K-1}`, so that the
//! limiter under test sees many keys instead of one hot one.

/// What `{key}` is replaced with.
pub(super) const PLACEHOLDER: &str = "{key}";

/// Up to this many keys, every rendering is computed once before the run
/// (a few megabytes at most), so a request costs a table lookup and a
/// reference-count increment; above it each request renders its own.
pub(super) const PRERENDER_MAX: u64 = 100_000;

/// A text split at its `{key}` placeholders.
#[derive(Debug, Clone)]
pub(super) struct Template {
    /// The text between placeholders: one part more than placeholders.
    parts: Vec<String>,
}

impl Template {
    /// Splits `text` at its placeholders.
    pub(super) fn new(text: &str) -> Self {
        Template {
            parts: text.split(PLACEHOLDER).map(str::to_owned).collect(),
        }
    }

    /// The text, when it has no placeholder.
    pub(super) fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// The text with key number `k` in every placeholder.
    pub(super) fn render(&self, k: u64) -> String {
        self.render_with(&key(k))
    }

    /// The text with `key` in every placeholder.
    pub(super) fn render_with(&self, key: &str) -> String {
        self.parts.join(key)
    }
}

/// Key number `k`.
pub(super) fn key(k: u64) -> String {
    format!("user:{k:08}")
}

/// A template's renderings in the form requests need (a body, a URI),
/// computed ahead when that is cheap.
#[derive(Debug)]
pub(super) enum Keyed<T> {
    /// No placeholder: one value for every request.
    Fixed(T),
    /// One value per key.
    Table(Vec<T>),
    /// Too many keys to tabulate: rendered per request.
    Lazy(Template),
}

impl<T: Clone> Keyed<T> {
    /// Renders `template` for `keys` keys through `make`, which also checks
    /// that a rendering is valid: the key's characters are the same for
    /// every key, so the first rendering being valid means all are.
    pub(super) fn new(
        template: &Template,
        keys: u64,
        make: impl Fn(String) -> anyhow::Result<T>,
    ) -> anyhow::Result<Self> {
        if let Some(text) = template.fixed() {
            return Ok(Keyed::Fixed(make(text.to_owned())?));
        }
        let first = make(template.render(0))?;
        if keys > PRERENDER_MAX {
            return Ok(Keyed::Lazy(template.clone()));
        }
        let mut table = Vec::with_capacity(keys as usize);
        table.push(first);
        for k in 1..keys {
            table.push(make(template.render(k))?);
        }
        Ok(Keyed::Table(table))
    }

    /// The rendering for key number `k`, through `make` when it was not
    /// computed ahead.
    pub(super) fn get(
        &self,
        k: u64,
        make: impl FnOnce(String) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        match self {
            Keyed::Fixed(v) => Ok(v.clone()),
            Keyed::Table(t) => t
                .get(k as usize)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("key {k} is out of range")),
            Keyed::Lazy(template) => make(template.render(k)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn placeholders_are_replaced_everywhere() {
        let t = Template::new(r#"{"key":"{key}","again":"{key}"}"#);
        assert_eq!(t.fixed(), None);
        assert_eq!(
            t.render(42),
            r#"{"key":"user:00000042","again":"user:00000042"}"#
        );
        assert_eq!(Template::new("/plain").fixed(), Some("/plain"));
    }

    #[test]
    fn small_key_spaces_are_tabulated_and_big_ones_rendered_lazily() {
        let t = Template::new("/{key}");
        let ok = |s: String| Ok(s);
        let small = Keyed::new(&t, 3, ok).unwrap();
        assert!(matches!(&small, Keyed::Table(v) if v.len() == 3));
        assert_eq!(small.get(2, ok).unwrap(), "/user:00000002");
        assert!(small.get(3, ok).is_err());
        let big = Keyed::new(&t, PRERENDER_MAX + 1, ok).unwrap();
        assert!(matches!(big, Keyed::Lazy(_)));
        assert_eq!(big.get(123_456_789, ok).unwrap(), "/user:123456789");
        let bad = Keyed::new(&t, 3, |_| -> anyhow::Result<String> { anyhow::bail!("no") });
        assert!(bad.is_err());
    }
}
