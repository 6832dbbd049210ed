//! Publishing a working directory: what changed since the last commit
//! applied, uploaded under a lease, then claimed as the next commit.

use super::*;

impl RemoteDir {
    /// [`publish`](RemoteDir::publish), under the state lock `state`.
    pub(super) fn publish_locked(&self, mut state: MutexGuard<'_, State>) -> Result<PublishReport> {
        self.refresh_locked(&mut state, OnOtherLog::Refuse)?;
        let (pieces, after, mut removed) = self.changes(&state)?;
        let mut report = PublishReport {
            pieces: pieces.len() as u64,
            ..PublishReport::default()
        };
        hooks::reached(&self.tier, Stage::Hashed);
        if pieces.is_empty() && removed.is_empty() {
            return Ok(report);
        }
        let log = self.ensure_log(&mut state)?;
        // gc keeps what the lease names until the commit landed (the
        // lease is deleted when this returns).
        let mut lease = Lease::take(
            &self.tier,
            PUBLISH_LEASE,
            pieces.iter().map(|(p, _)| p.object()),
        )?;
        // Each file is opened again as it is sent, one at a time (a commit
        // may hold more files than a process may open): what is sent is
        // checked against the hash taken, whatever happened to it since.
        for (piece, path) in &pieces {
            // A lease that may have lapsed is checked again below anyway.
            let _ = lease.renew_if_due()?;
            if let Some(bytes) = self.upload(piece, path)? {
                report.uploaded += 1;
                report.bytes_uploaded += bytes;
            }
        }
        hooks::reached(&self.tier, Stage::Uploaded);
        // A commit never names an object that is not there: one a gc
        // that ignores leases took meanwhile is sent again.
        // Checked again while the lease may have lapsed during the check.
        let _ = lease.renew_if_due()?;
        loop {
            for (piece, path) in &pieces {
                if upload::ensure_present(&self.tier, piece, &open_source(path)?, path)? {
                    report.uploaded += 1;
                    report.bytes_uploaded += piece.size;
                }
            }
            if !lease.renew_if_due()? {
                break;
            }
        }
        let pieces: Vec<Piece> = pieces.into_iter().map(|(p, _)| p).collect();
        for _ in 0..MAX_COMMIT_RACES {
            let seq = crate::commit::next_seq(self.tier.url(), state.seq)?;
            let commit = Commit {
                version: COMMIT_VERSION,
                seq,
                writer: self.writer.clone(),
                pieces: pieces.clone(),
                removed: removed.clone(),
                log: log.clone(),
            };
            let name = commit_name(seq);
            let bytes = crate::commit::encode(&self.tier, &name, &commit)?;
            match self.tier.commit(&name, bytes) {
                Ok(()) => {
                    report.removed = removed.len() as u64;
                    self.record(&mut state, seq, after, removed)?;
                    report.seq = Some(seq);
                    return Ok(report);
                }
                // Another writer took the number: learn its commit (which
                // also tells whether it claimed one of our files) and try
                // the next.
                Err(remote_tier::Error::CommitTaken { .. }) => {
                    self.refresh_locked(&mut state, OnOtherLog::Refuse)?;
                    // A removal stands only for a file this handle still
                    // had and still does not find.
                    removed.retain(|p| {
                        state.files.contains_key(p)
                            && std::fs::symlink_metadata(self.dir.join(p)).is_err()
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(remote_tier::Error::CommitTaken {
            url: self.tier.url().to_string(),
            name: format!(
                "{COMMITS}/ ({MAX_COMMIT_RACES} sequence numbers taken by other writers meanwhile)"
            ),
        }
        .into())
    }

    /// The pieces that publish what changed locally, with the file each
    /// is read from; the files as they will be once committed; and the
    /// files removed (not those the store evicts locally). No file is
    /// left open.
    #[allow(clippy::type_complexity)]
    pub(super) fn changes(
        &self,
        state: &State,
    ) -> Result<(Vec<(Piece, PathBuf)>, BTreeMap<String, Known>, Vec<String>)> {
        let mut pieces = Vec::new();
        let mut after = BTreeMap::new();
        // Block hashes this commit may still list in a store's own block size.
        let mut hashes_left = STORE_BLOCK_HASHES;
        let listed = local_files(&self.dir, self.files.private)?;
        let mut removed = self.removed_files(state, &listed);
        removed.sort();
        for (rel, path) in listed {
            let file = File::open(&path).map_err(Error::io("open", &path))?;
            let m = file.metadata().map_err(Error::io("stat", &path))?;
            let (len, ino) = (m.len(), m.ino());
            let known = state.files.get(&rel).copied();
            let (offset, replace) = match known {
                Some(k) if k.ino == 0 => continue,
                Some(k) if k.ino == ino && k.len == len => continue,
                Some(k) if k.ino == ino && len > k.len => (k.len, false),
                Some(_) => (0, true),
                None => (0, false),
            };
            let size = len - offset;
            // Whole files a reader may read by blocks get a hash per block,
            // in the same pass, so each block can be checked as it arrives.
            let block_size = match offset {
                0 => self
                    .files
                    .block_list_size(&rel, size, self.tier.config(), &mut hashes_left),
                _ => None,
            };
            let (hash, blocks) = hash_open(&file, &path, offset, size, block_size)?;
            pieces.push((
                Piece {
                    path: rel.clone(),
                    offset,
                    size,
                    blake3: hash,
                    replace,
                    blocks: blocks.map(|b| b.to_list()),
                },
                path,
            ));
            after.insert(
                rel,
                Known {
                    len,
                    ino,
                    blocks: false,
                },
            );
        }
        // Whole new files before the bytes appended to logs that point at
        // them (readers apply in order).
        pieces.sort_by_key(|(p, _)| (p.offset != 0, p.path.clone()));
        Ok((pieces, after, removed))
    }

    /// The files this directory's commits hold that the store removed
    /// (not those it evicts locally), given the files `listed` now.
    pub(super) fn removed_files(&self, state: &State, listed: &[(String, PathBuf)]) -> Vec<String> {
        let present: HashSet<&str> = listed.iter().map(|(rel, _)| rel.as_str()).collect();
        state
            .files
            .keys()
            .filter(|rel| {
                !present.contains(rel.as_str())
                    && !(self.files.evicted_locally)(rel)
                    && !(self.files.private)(rel)
                    // Links into the tier are not listed: gone only when
                    // the link is.
                    && std::fs::symlink_metadata(self.dir.join(rel)).is_err()
            })
            .cloned()
            .collect()
    }

    /// Whether the store wrote or removed anything since the last commit
    /// applied here: a listing and a `stat` per file, no hashing and no
    /// request.
    pub(super) fn changed_locally(&self, state: &State) -> Result<bool> {
        let listed = local_files(&self.dir, self.files.private)?;
        if !self.removed_files(state, &listed).is_empty() {
            return Ok(true);
        }
        for (rel, path) in &listed {
            let m = std::fs::metadata(path).map_err(Error::io("stat", path))?;
            match state.files.get(rel) {
                Some(k) if k.ino == 0 || (k.ino == m.ino() && k.len == m.len()) => {}
                _ => return Ok(true),
            }
        }
        Ok(false)
    }

    /// Uploads a piece unless its object exists and was written recently
    /// ([`REUSE_WITHIN`]), its bytes checked against its BLAKE3 as they
    /// are sent; returns the bytes sent.
    pub(super) fn upload(&self, piece: &Piece, path: &Path) -> Result<Option<u64>> {
        match upload::put_piece(&self.tier, piece, &open_source(path)?, path)? {
            true => Ok(Some(piece.size)),
            false => Ok(None),
        }
    }
}

/// Opens the file a piece is read from.
pub(super) fn open_source(path: &Path) -> Result<File> {
    File::open(path).map_err(Error::io("open", path))
}
