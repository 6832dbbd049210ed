//! Quarantine of corrupt shards: moved aside under the writer lock, so
//! that the next read generates them again.

use std::path::Path;

use durable_fs::FileLock;

use crate::error::{Error, Result};
use crate::format::{COMPLETED_FILE, QUARANTINE_DIR, StoreItem};
use crate::inner::Inner;

impl<T: StoreItem> Inner<T> {
    /// Moves a corrupt shard file into `quarantine/` under the writer lock.
    pub(crate) fn quarantine(&self, path: &Path) -> Result<()> {
        let _lock = FileLock::exclusive(&self.paths.writer_lock).map_err(Error::durable)?;
        let dir = self.root.join(QUARANTINE_DIR);
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        let stem = path.file_name().and_then(|n| n.to_str()).unwrap_or("shard");
        let dest = durable_fs::unique_temp_path(&dir, stem);
        match durable_fs::rename(path, &dest) {
            Ok(()) => {}
            // Someone else quarantined or replaced it already.
            Err(durable_fs::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(());
            }
            Err(e) => return Err(Error::durable(e)),
        }
        // The shard's removal from `shards/` is what must survive; the
        // root loses its `completed` flag with it.
        durable_fs::sync_dir(&self.paths.shards)
            .and_then(|()| durable_fs::remove_and_sync(&self.root.join(COMPLETED_FILE)))
            .map(drop)
            .map_err(Error::durable)
    }
}
