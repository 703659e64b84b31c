//! The policy error: every problem names the file, the line and the column of
//! the value at fault, so an operator can jump straight to it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::{Location, Spanned};

/// A policy file that could not be read, parsed or validated.
///
/// `line` and `column` are 1-based. They are 0 only when the file could not be
/// read at all, and `Display` then leaves them out.
///
/// ```
/// use sluice_policy::Policy;
/// let err = Policy::from_str("rules:\n  - name: [x]\n", "p.yaml").unwrap_err();
/// assert_eq!((err.line, err.column), (2, 11));
/// assert!(err.to_string().starts_with("p.yaml:2:11: "));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", Place(.file, *.line, *.column))]
pub struct PolicyError {
    /// The policy file, as it was named to the loader.
    pub file: PathBuf,
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column of the offending value.
    pub column: usize,
    /// What is wrong, without the position.
    pub message: String,
}

/// Something legal in a policy that is almost surely a mistake. The policy
/// is in force all the same; `sluice validate` prints these, and the
/// servers log them when they load a policy.
///
/// ```
/// use sluice_policy::Policy;
/// let p = Policy::from_str("limits:\n  a: {algorithm: token_bucket, algorithm_config: {rps: 1}}\n", "p.yaml").unwrap();
/// let w = &p.warnings()[0];
/// assert_eq!((w.line, w.column), (2, 3));
/// assert!(w.to_string().starts_with("p.yaml:2:3: warning: "));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyWarning {
    /// The policy file, as it was named to the loader.
    pub file: PathBuf,
    /// 1-based line of the value the warning is about.
    pub line: usize,
    /// 1-based column of that value.
    pub column: usize,
    /// What looks wrong, without the position.
    pub message: String,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = Place(&self.file, self.line, self.column);
        write!(f, "{place}: warning: {}", self.message)
    }
}

struct Place<'a>(&'a Path, usize, usize);

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place(file, 0, _) => write!(f, "{}", file.display()),
            Place(file, line, column) => write!(f, "{}:{line}:{column}", file.display()),
        }
    }
}

/// A position in the policy text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Pos {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Pos {
    pub(crate) fn of(loc: Location) -> Pos {
        let conv = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Pos {
            line: conv(loc.line()),
            column: conv(loc.column()),
        }
    }
}

impl<T> From<&Spanned<T>> for Pos {
    fn from(s: &Spanned<T>) -> Pos {
        Pos::of(s.referenced)
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// A validation failure before the file name is attached.
#[derive(Debug)]
pub(crate) struct Invalid {
    pub(crate) pos: Pos,
    pub(crate) message: String,
}

impl Invalid {
    pub(crate) fn into_error(self, file: PathBuf) -> PolicyError {
        PolicyError {
            file,
            line: self.pos.line,
            column: self.pos.column,
            message: self.message,
        }
    }

    pub(crate) fn into_warning(self, file: PathBuf) -> PolicyWarning {
        PolicyWarning {
            file,
            line: self.pos.line,
            column: self.pos.column,
            message: self.message,
        }
    }
}

/// Builds an [`Invalid`] at `pos`.
pub(crate) fn at(pos: impl Into<Pos>, message: impl fmt::Display) -> Invalid {
    Invalid {
        pos: pos.into(),
        message: message.to_string(),
    }
}

/// Converts a parser error, keeping its position and dropping the parser's
/// own rendering of it.
pub(crate) fn from_yaml(err: &serde_saphyr::Error, file: PathBuf) -> PolicyError {
    use serde_saphyr::{DefaultMessageFormatter, MessageFormatter};
    let pos = err.location().map(Pos::of).unwrap_or_default();
    let mut inner = err;
    // The formatter expects the original error, not its snippet/alias wrappers.
    while let serde_saphyr::Error::WithSnippet { error, .. }
    | serde_saphyr::Error::AliasError { error, .. } = inner
    {
        inner = error;
    }
    // Messages quote user input; keep control characters out of terminals.
    let mut message = String::new();
    for c in DefaultMessageFormatter.format_message(inner).chars() {
        if c.is_control() {
            message.extend(c.escape_debug());
        } else {
            message.push(c);
        }
    }
    PolicyError {
        file,
        line: pos.line,
        column: pos.column,
        message,
    }
}
