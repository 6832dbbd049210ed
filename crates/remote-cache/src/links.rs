//! Files read by blocks: the links a working directory holds into the
//! local tier (sparse copies fetched as a store reads them), and the
//! block lists kept beside them so each block is checked against the
//! BLAKE3 its commit recorded (see [`RemoteDir`](crate::RemoteDir)).
//!
//! **Block lists.** A piece that is a whole file readers may read by
//! blocks (`.bin` arrays, page files: any whole file larger than the
//! publisher's tier fetches whole, and those its `by_blocks` picks — which
//! files a reader links is the reader's choice, so the publisher does not
//! rely on knowing it) carries the BLAKE3 of each `block_size`-byte block
//! of it: the last may be short; `block_size` is the publisher's tier
//! block size, doubled as needed to keep at most
//! `remote_tier::MAX_BLOCKS` blocks. It lives inside the piece,
//! so it is committed atomically with it and read with the one GET of the
//! commit; the field is absent where a file has no list (one too large for
//! a list's limits, or not read by blocks). The list has its own version: a reader that meets a newer one refuses the
//! commit ([`Error::Corrupt`]), as it does a list whose count does not
//! match `size` and `block_size`, a hash that is not 32 bytes of hex, a
//! block size outside 4 KiB..=64 MiB, or a list on bytes appended to a file.
//! A reader that links the file fetches it in the list's block size (one
//! sparse local file, zero-copy as before) and checks every block against
//! its hash before it is kept (see `remote_tier::RemoteTier::open_verified`);
//! a file without a list is checked by size and etag as its blocks arrive.
//! The list is kept in the state directory so that the file, linked again
//! on the next open, is checked the same way without reading its commit.
//!

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use remote_tier::{BlockHashes, BlockList};

use crate::commit::{Commit, MAX_RECORD, OBJECTS, Piece, STATE_DIR, commit_name};
use crate::prefetch::{self, Opening};
use crate::remote_dir::{RemoteDir, State};
use crate::workdir::Known;
use crate::{Error, Result};

impl RemoteDir {
    /// Keeps the checked block list of piece `p` (of commit `seq`) in the
    /// state directory, durably, for when its file is linked again after
    /// this commit was recorded as applied.
    pub(crate) fn keep_block_list(
        &self,
        state: &mut State,
        seq: u64,
        p: &Piece,
        list: &BlockList,
    ) -> Result<Arc<BlockHashes>> {
        let hashes = list.check(p.size).map_err(|problem| Error::Corrupt {
            url: self.tier.url().to_string(),
            name: commit_name(seq),
            problem: format!("{}: {problem}", p.path),
        })?;
        let path = self.block_list_path(&p.blake3);
        let dir = durable_fs::parent_dir(&path).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
        let bytes = serde_json::to_vec(list).map_err(|e| Error::Corrupt {
            url: self.dir.display().to_string(),
            name: path.display().to_string(),
            problem: format!("cannot encode the block list: {e}"),
        })?;
        // The file fsynced and renamed; its directory fsynced once for
        // every list of the commit, before the commit's record.
        let tmp = durable_fs::temp_path(&path);
        durable_fs::write_synced(&tmp, &bytes)?;
        durable_fs::rename(&tmp, &path)?;
        state.dirs_to_sync.insert(dir);
        Ok(Arc::new(hashes))
    }

    /// Where the block list of the piece `blake3` is kept locally.
    pub(crate) fn block_list_path(&self, blake3: &str) -> PathBuf {
        self.dir
            .join(STATE_DIR)
            .join("blocks")
            .join(format!("{blake3}.json"))
    }

    /// The block list kept for the piece `blake3` of `size` bytes.
    pub(crate) fn kept_block_list(&self, blake3: &str, size: u64) -> Result<Arc<BlockHashes>> {
        let path = self.block_list_path(blake3);
        let corrupt = |problem: String| Error::Corrupt {
            url: self.dir.display().to_string(),
            name: path.display().to_string(),
            problem,
        };
        let bytes = durable_fs::read_capped(&path, MAX_RECORD as u64)
            .map_err(|e| corrupt(format!("the block list of a linked file: {e}")))?;
        let list: BlockList = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("not a block list: {e}")))?;
        Ok(Arc::new(list.check(size).map_err(corrupt)?))
    }

    /// Removes the kept block lists that no linked file uses any more (a
    /// commit replaced the file). Only once every linked file with a list
    /// is open here, so a list still needed is never taken for garbage.
    pub(crate) fn prune_block_lists(&self, state: &State) {
        let mut used = HashSet::new();
        for (path, k) in &state.files {
            if !k.blocks {
                continue;
            }
            let object = state.by_blocks.get(path).map(|f| f.name());
            match object.and_then(|o| o.strip_prefix(&format!("{OBJECTS}/"))) {
                Some(blake3) => used.insert(format!("{blake3}.json")),
                None => return,
            };
        }
        let dir = self.dir.join(STATE_DIR).join("blocks");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") && !used.contains(&name) {
                // Garbage either way: a failed removal is retried by the
                // next commit applied.
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The objects of `c`'s pieces that are linked and read by blocks,
    /// opened through the tier up to its parallelism at once: on a cold
    /// tier each open asks the store for its object (a HEAD), and one
    /// after another those cost a round trip each. A failed open is left
    /// to [`link`](Self::link), which opens each again and reports it.
    pub(crate) fn open_by_blocks_at_once(&self, c: &Commit) -> Option<Opening> {
        let wanted: Vec<(String, Arc<BlockHashes>, bool)> = c
            .pieces
            .iter()
            .filter(|p| p.offset == 0 && self.linked(p))
            .filter(|p| (self.files.block_size)(&p.path, p.size).is_some())
            .filter_map(|p| {
                let hashes = p.blocks.as_ref()?.check(p.size).ok()?;
                let leased = (self.files.evict_blocks)(&p.path);
                Some((format!("{OBJECTS}/{}", p.blake3), Arc::new(hashes), leased))
            })
            .collect();
        (wanted.len() >= 2).then(|| prefetch::open_in_background(self.tier.clone(), wanted))
    }

    /// Opens `object` through the tier (pinned while this handle lives,
    /// or for a file whose store leases what it reads
    /// ([`StoreFiles::evict_blocks`](crate::StoreFiles::evict_blocks)),
    /// open with only the leased blocks kept; every block checked against
    /// `hashes` when given) and links `path` to its local file.
    pub(crate) fn link(
        &self,
        state: &mut State,
        path: &str,
        object: &str,
        known: Known,
        hashes: Option<Arc<BlockHashes>>,
    ) -> Result<()> {
        let size = known.len;
        let file = match hashes {
            // Read under leases: blocks of it may be freed while it is open.
            h if (self.files.evict_blocks)(path) => self.tier.open_leased(object, h)?,
            // Read in blocks of the store's own size: sparse whatever its size.
            Some(h) if (self.files.block_size)(path, size).is_some() => {
                self.tier.open_by_blocks(object, h)?
            }
            Some(h) => self.tier.open_verified(object, h)?,
            None => self.tier.open_object(object)?,
        };
        if file.len() != size {
            return Err(remote_tier::Error::Corrupt {
                url: self.tier.url().to_string(),
                name: object.to_string(),
                problem: format!("{} bytes, the commit says {size}", file.len()),
            }
            .into());
        }
        let local = self.dir.join(path);
        // An absolute target: the working directory and the tier may be
        // named relative to different places.
        let target =
            std::fs::canonicalize(file.path()).map_err(Error::io("resolve", file.path()))?;
        // A warm open finds the link in place (made durable when it was
        // made): no new link, no directory fsync.
        if std::fs::read_link(&local).ok().as_deref() != Some(target.as_path()) {
            let parent = durable_fs::parent_dir(&local).to_path_buf();
            std::fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
            let tmp = durable_fs::unique_temp_path(&parent, "link");
            std::os::unix::fs::symlink(&target, &tmp).map_err(Error::io("symlink", &tmp))?;
            durable_fs::rename(&tmp, &local)?;
            // Fsynced once for every link of the commit, before its record.
            state.dirs_to_sync.insert(parent);
        }
        state.files.insert(path.to_string(), known);
        state.by_blocks.insert(path.to_string(), file);
        Ok(())
    }

    /// Removes what dead processes left in the working directory: the
    /// temporary files of block lists, and of links and of copies they
    /// were making (named
    /// with their host and pid, see `durable_fs::unique_temp_path`), in
    /// every directory of it. Called on open, before anything is linked
    /// or copied; best effort (what stays is only space, swept next time).
    pub(crate) fn sweep_leftovers(&self) {
        // Block lists are written by the one holder of the directory's
        // lock, as this handle is now: any temporary one is a dead
        // writer's.
        let _ = durable_fs::remove_temp_files(&self.dir.join(STATE_DIR).join("blocks"));
        let mut dirs = vec![self.dir.clone()];
        while let Some(dir) = dirs.pop() {
            durable_fs::remove_dead_temp_files(&dir);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            // Directories only, never through a link (links point into
            // the tier, which sweeps its own).
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }

    /// Re-opens a file read by blocks (on open: the tier may have evicted
    /// it, or moved it) and points its link at the local copy.
    pub(crate) fn relink(&self, state: &mut State, path: &str) -> Result<()> {
        let local = self.dir.join(path);
        let target = std::fs::read_link(&local).ok();
        let name = target
            .as_ref()
            .and_then(|t| t.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The tier names local copies by the escaped object name.
        let object = name
            .strip_suffix(".sparse")
            .or_else(|| name.strip_suffix(".whole"))
            .map(|k| k.replace("%2F", "/").replace("%25", "%"))
            .filter(|o| o.starts_with(&format!("{OBJECTS}/")));
        let Some(object) = object else {
            return Err(Error::Corrupt {
                url: self.dir.display().to_string(),
                name: path.to_string(),
                problem: "a file read by blocks that is no longer a link into the tier".into(),
            });
        };
        let known = state.files.get(path).copied().unwrap_or(Known {
            len: 0,
            ino: 0,
            blocks: false,
        });
        // Linked by a handle whose store reads it by blocks, opened now by
        // one whose store maps it whole (another store kind on the URL's
        // working directory: `cachex inspect` after a Python reader): made
        // whole here, so no store maps bytes never fetched.
        if !(self.files.by_blocks)(path, known.len) {
            return self.make_whole(state, path, &object, known.len);
        }
        let hashes = if known.blocks {
            let blake3 = object
                .strip_prefix(&format!("{OBJECTS}/"))
                .unwrap_or_default();
            Some(self.kept_block_list(blake3, known.len)?)
        } else {
            None
        };
        self.link(state, path, &object, known, hashes)?;
        state.sync_dirs()
    }
}
