//! Reading the files a policy is made of, within bounds: the policy itself
//! and the key files its `jwt` section names. Only a regular file is read,
//! and only up to its cap. Anything else (a FIFO, a socket, a device such
//! as `/dev/zero`) is refused at once, without waiting: a FIFO's `open`
//! would otherwise wait for a writer that may never come, and a device may
//! never end.

use std::fs::{File, FileType, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// The largest policy file read: far more than any policy needs, and small
/// enough that reading it never holds up a reload.
pub const MAX_POLICY_BYTES: u64 = 4 << 20;

/// The largest key file (PEM or JWKS) a policy may name.
pub const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// Reads the regular file at `path`, refusing one of more than `max` bytes
/// and anything that is not a regular file, without ever waiting on it.
///
/// ```
/// use sluice_policy::read_capped;
/// let err = read_capped("/dev/zero".as_ref(), 1024).unwrap_err();
/// assert_eq!(err.to_string(), "a character device, not a regular file");
/// ```
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    // Asked of the path first, so that a FIFO or a device is never opened
    // at all (opening some devices does something); and of the open file
    // again, since the path may be swapped for one in between.
    regular(std::fs::metadata(path)?.file_type())?;
    let file = open_without_waiting(path)?;
    regular(file.metadata()?.file_type())?;
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

/// Opens `path` for reading. On Unix the open does not wait: a FIFO
/// swapped in after the check above opens at once, with or without a
/// writer, and is then refused; on a regular file the flag changes nothing.
fn open_without_waiting(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Refuses anything but a regular file, saying what it is instead.
fn regular(kind: FileType) -> io::Result<()> {
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else {
        other_kind(kind)
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file"),
    ))
}

#[cfg(unix)]
fn other_kind(kind: FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn other_kind(_: FileType) -> &'static str {
    "a special file"
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

    /// A FIFO without a writer would hold `open` forever, so each read
    /// runs on a thread of its own: one that waits fails the test after
    /// ten seconds instead of hanging it.
    #[cfg(unix)]
    #[test]
    fn a_fifo_a_socket_a_directory_and_devices_are_refused_at_once() {
        use std::sync::mpsc;
        use std::time::Duration;

        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let socket = dir.path().join("socket");
        let _listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let cases = [
            (fifo, "a FIFO (named pipe), not a regular file"),
            (socket, "a socket, not a regular file"),
            (dir.path().to_owned(), "a directory, not a regular file"),
            ("/dev/zero".into(), "a character device, not a regular file"),
            ("/dev/null".into(), "a character device, not a regular file"),
        ];
        for (path, want) in cases {
            let (tx, rx) = mpsc::channel();
            let read = path.clone();
            std::thread::spawn(move || {
                let _ = tx.send(read_capped(&read, MAX_KEY_FILE_BYTES));
            });
            let got = rx.recv_timeout(Duration::from_secs(10));
            let err = got
                .unwrap_or_else(|_| panic!("reading {} did not return", path.display()))
                .unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidInput,
                "{}",
                path.display()
            );
            assert_eq!(err.to_string(), want, "{}", path.display());
        }
    }
}
