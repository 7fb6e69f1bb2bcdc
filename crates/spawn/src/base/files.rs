//! What the crate says of the files it is handed.

/// What kind of file `meta` describes, in words.
pub(crate) fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Tries `file`'s exclusive lock once: `true` taken (or the platform has no such locks),
/// `false` held by another open of the file.
///
/// Unix only (where `flock` exists: not Solaris): there the lock is advisory, so readers are
/// never kept out (a transcript's: a fork child's resume reads it); elsewhere none is taken.
/// The lock belongs to the open file: a second open of the same file, in this process or
/// another, does not get it; it goes when the last handle to the open file is closed, or
/// its process dies.
pub(crate) fn try_lock_once(file: &std::fs::File) -> std::io::Result<bool> {
    // A file system or platform without such locks: written as before.
    Ok(try_lock(file)?.unwrap_or(true))
}

/// [`try_lock_once`], saying `None` where the file system or the platform has no such locks.
pub(crate) fn try_lock(file: &std::fs::File) -> std::io::Result<Option<bool>> {
    #[cfg(all(
        unix,
        not(any(
            target_os = "solaris",
            target_os = "espidf",
            target_os = "horizon",
            target_os = "vita"
        ))
    ))]
    {
        use rustix::fs::{FlockOperation, flock};
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(true)),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(Some(false)),
            // A file system without locks (some network mounts).
            Err(e) if e == rustix::io::Errno::NOLCK || e == rustix::io::Errno::OPNOTSUPP => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
    #[cfg(not(all(
        unix,
        not(any(
            target_os = "solaris",
            target_os = "espidf",
            target_os = "horizon",
            target_os = "vita"
        ))
    )))]
    {
        let _ = file;
        Ok(None)
    }
}
