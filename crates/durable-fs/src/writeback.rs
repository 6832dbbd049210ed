//! Early write-back: hand written bytes to the disk before the commit fsync.

use std::fs::File;

/// Asks the kernel to start writing `len` bytes of `file` at `offset` back
/// now (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`; elsewhere a no-op),
/// so the disk works while the writer produces the next bytes and the
/// commit's fsync finds little left to do.
///
/// Advice only: durability still comes from that fsync, so a failure here
/// (e.g. `ENOSYS`, or an offset beyond `i64`) is ignored.
pub fn start_writeback(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: sync_file_range only reads its integer arguments and
        // touches no memory of ours; the descriptor stays open while `file`
        // is borrowed.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}
