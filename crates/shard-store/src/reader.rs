//! Finding and decoding shard files and reading `metadata.json`.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use durable_fs::FileLock;

use crate::error::{Error, Result};
use crate::format::{
    self, Compression, MAX_METADATA_BYTES, MAX_SHARD_FILE_BYTES, Metadata, ShardName, StoreItem,
};
use crate::inner::Inner;

/// Reads and decodes one shard file (`name` parsed from its file name).
pub(crate) fn read_shard<T: StoreItem>(
    path: &Path,
    name: ShardName,
    compression: Compression,
) -> Result<Option<Vec<T>>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open shard", path)(e)),
    };
    let size = file
        .metadata()
        .map_err(Error::io("stat shard", path))?
        .len();
    if size > MAX_SHARD_FILE_BYTES {
        return Err(Error::CorruptShard {
            path: path.to_path_buf(),
            reason: format!("{size} bytes is larger than the {MAX_SHARD_FILE_BYTES} byte limit"),
        });
    }
    // `size` is bounded above, so this allocation is too.
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)
        .map_err(Error::io("read shard", path))?;
    let pickle = format::decompress(path, bytes, compression)?;
    format::decode_shard(path, name, &pickle).map(Some)
}

/// Reads `metadata.json` of a root (no lock).
pub(crate) fn read_metadata_file(path: &Path) -> Result<Option<Metadata>> {
    match durable_fs::read_capped(path, MAX_METADATA_BYTES) {
        Ok(text) => Metadata::parse(path, &text).map(Some),
        Err(durable_fs::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(Error::durable(e)),
    }
}

/// Every shard file name of `compression` in `dir`.
pub(crate) fn list_shards(dir: &Path, compression: Compression) -> Result<Vec<ShardName>> {
    let entries = std::fs::read_dir(dir).map_err(Error::io("list shards", dir))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("list shards", dir))?;
        if let Some(name) = entry
            .file_name()
            .to_str()
            .and_then(|n| ShardName::parse(n, compression))
        {
            out.push(name);
        }
    }
    Ok(out)
}

impl<T: StoreItem> Inner<T> {
    /// Every shard file in `shards/`.
    pub(crate) fn shard_files(&self) -> Result<Vec<ShardName>> {
        list_shards(&self.paths.shards, self.compression)
    }

    /// The longest shard file starting at `start`, if any.
    pub(crate) fn find_shard_file(&self, start: u64) -> Result<Option<ShardName>> {
        // The common case: a full shard, one stat.
        let full = ShardName {
            start,
            end: start.saturating_add(self.shard_len),
        };
        if self
            .paths
            .shards
            .join(full.file_name(self.compression))
            .exists()
        {
            return Ok(Some(full));
        }
        // With the length known, the only other candidate is the short last shard.
        let known = self.state.lock().length;
        if let Some(len) = known {
            if start >= len || full.end <= len {
                return Ok(None);
            }
            let last = ShardName { start, end: len };
            let exists = self
                .paths
                .shards
                .join(last.file_name(self.compression))
                .exists();
            return Ok(exists.then_some(last));
        }
        Ok(self
            .shard_files()?
            .into_iter()
            .filter(|n| n.start == start && n.end <= full.end)
            .max_by_key(|n| n.end))
    }

    /// Whether any shard file starts at `start`.
    pub(crate) fn shard_on_disk(&self, start: u64) -> bool {
        matches!(self.find_shard_file(start), Ok(Some(_)))
    }

    /// Loads shard `start` from disk. A corrupt file is quarantined and
    /// reported as missing when a source can regenerate it; otherwise its
    /// error is returned.
    pub(crate) fn load_from_disk_or_quarantine(&self, start: u64) -> Result<Option<Arc<Vec<T>>>> {
        // A shard may vanish between listing and opening (eviction): retry once.
        for _ in 0..2 {
            let Some(name) = self.find_shard_file(start)? else {
                return Ok(None);
            };
            let path = self.paths.shards.join(name.file_name(self.compression));
            match read_shard::<T>(&path, name, self.compression) {
                Ok(Some(items)) => {
                    self.touch_disk(start);
                    return Ok(Some(Arc::new(items)));
                }
                Ok(None) => continue,
                Err(e @ Error::CorruptShard { .. }) => {
                    if self.source.is_none() {
                        return Err(e);
                    }
                    self.quarantine(&path)?;
                    self.state.lock().disk_size.remove(&name);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Reads the metadata under a shared lock of the root.
    pub(crate) fn read_metadata(&self) -> Result<Metadata> {
        let _lock = FileLock::shared(&self.paths.writer_lock).map_err(Error::durable)?;
        self.read_metadata_unlocked()
    }

    /// Reads the metadata; the caller holds the writer lock.
    pub(crate) fn read_metadata_unlocked(&self) -> Result<Metadata> {
        read_metadata_file(&self.paths.metadata)?.ok_or_else(|| Error::BadMetadata {
            path: self.paths.metadata.clone(),
            reason: "missing".into(),
        })
    }

    /// The final length if known here or recorded on disk by anyone.
    pub(crate) fn final_length_refreshed(&self) -> Result<Option<u64>> {
        if let Some(len) = self.state.lock().length {
            return Ok(Some(len));
        }
        let meta = self.read_metadata()?;
        if meta.length_final {
            self.state.lock().length = Some(meta.length);
            return Ok(Some(meta.length));
        }
        Ok(None)
    }
}
