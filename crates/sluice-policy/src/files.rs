//! Reading the files a policy is made of, within bounds: the policy itself
//! and the key files its `jwt` section names. A file that is not a regular
//! file (a device such as `/dev/zero`, a pipe that never ends) or that is
//! larger than its cap is refused instead of read without end.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The largest policy file read: far more than any policy needs, and small
/// enough that reading it never holds up a reload.
pub const MAX_POLICY_BYTES: u64 = 4 << 20;

/// The largest key file (PEM or JWKS) a policy may name.
pub const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// Reads the regular file at `path`, refusing one of more than `max` bytes.
///
/// ```
/// use sluice_policy::read_capped;
/// let err = read_capped("/dev/zero".as_ref(), 1024).unwrap_err();
/// assert!(err.to_string().contains("not a regular file"));
/// ```
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = File::open(path)?;
    // Asked of the open file, so that the file checked is the file read.
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    // One byte past the cap tells a file at the cap from a larger one,
    // including one that grows while it is read.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than the {max} bytes allowed"),
        ));
    }
    Ok(bytes)
}

/// [`read_capped`] for a text file.
pub(crate) fn read_text_capped(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_capped(path, max)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_at_the_cap_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [b'a'; 16]).unwrap();
        assert_eq!(read_capped(&path, 16).unwrap().len(), 16);
        let err = read_capped(&path, 15).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn an_endless_device_is_refused_without_reading_it() {
        let err = read_capped(Path::new("/dev/zero"), MAX_KEY_FILE_BYTES).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
