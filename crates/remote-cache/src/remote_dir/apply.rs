//! Applying commits to a working directory: a refresh reads what follows
//! the last commit applied, fetches and verifies each piece (or links it
//! to be read by blocks), removes what a commit removed, and records it.

use super::*;

impl RemoteDir {
    pub(super) fn refresh_locked(
        &self,
        state: &mut State,
        on_other: OnOtherLog,
    ) -> Result<RefreshReport> {
        self.check_log()?;
        let (found, next) = self.read_log_and_after(state.seq)?;
        let mut on_other = on_other;
        let mut next = next;
        match (&state.log_id, found) {
            (Some(had), found) if found.as_ref() != Some(had) => {
                self.other_log(state, found, on_other)?;
                // Started over: the log must now be the bucket's own.
                on_other = OnOtherLog::Refuse;
                next = self.read_after(0)?;
            }
            // A directory with no log recorded (nothing applied yet, or
            // commits applied before the log's identity was seen: the two
            // are asked for at once) takes the log's own.
            (None, Some(id)) => {
                log_id::write_local(&self.dir.join(STATE_DIR), Some(&id))?;
                state.log_id = Some(id);
            }
            _ => {}
        }
        self.apply_logged(state, next, on_other)
    }

    /// The log's identity and what follows `seq`, asked for at once.
    pub(super) fn read_log_and_after(&self, seq: u64) -> Result<(Option<String>, Option<Next>)> {
        std::thread::scope(|s| {
            let log = s.spawn(|| read_log_id(&self.tier));
            let next = self.read_after(seq);
            let log = log
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok((log?, next?))
        })
    }

    /// [`apply_from`](Self::apply_from), with what reads see made whole
    /// again if it fails part-way.
    pub(super) fn apply_logged(
        &self,
        state: &mut State,
        next: Option<Next>,
        on_other: OnOtherLog,
    ) -> Result<RefreshReport> {
        let applied = self.apply_from(state, next, on_other);
        if applied.is_err() {
            self.reset_view(state);
        }
        applied
    }

    /// Applies `next`, the commit after `state`'s last (or a checkpoint
    /// after it), and the ones after. A commit of another log than the
    /// one applied here is refused, or started over from.
    pub(super) fn apply_from(
        &self,
        state: &mut State,
        mut next: Option<Next>,
        mut on_other: OnOtherLog,
    ) -> Result<RefreshReport> {
        let mut report = RefreshReport {
            seq: state.seq,
            ..RefreshReport::default()
        };
        if state.behind
            && !matches!(next, Some(Next::Checkpoint(_)))
            && let Some(cp) = newest_checkpoint_after(&self.tier, state.seq)?
        {
            next = Some(Next::Checkpoint(cp));
        }
        // Commits are numbered without gaps (a writer claims `seq + 1` only
        // once it has applied `seq`), so the first number that is not there
        // ends the log: one GET finds the next commit, or that there is
        // none, where a listing would cost a LIST and then a GET.
        while let Some(item) = next {
            if let Next::Commit(c) = &item
                && of_other_log(&state.log_id, c)
            {
                self.other_log(state, Some(c.log.clone()), on_other)?;
                on_other = OnOtherLog::Refuse;
                report = RefreshReport::default();
                next = self.read_after(0)?;
                continue;
            }
            let (commit, checkpoint) = match item {
                Next::Commit(c) => (c, false),
                Next::Checkpoint(cp) => (self.checkpoint_commit(state, cp), true),
            };
            let seq = commit.seq;
            // Commits are immutable once written: the next one is asked for
            // while this one is applied, not a round trip after.
            let (applied, ahead) = std::thread::scope(|s| {
                let ahead = s.spawn(|| self.read_after(seq));
                let applied = self.apply(state, &commit);
                let ahead = ahead
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (applied, ahead)
            });
            let (files, removed, fetched) = match applied {
                Ok(applied) => applied,
                // gc removed an object of this commit: it lies before the
                // retention window, and a checkpoint stands for it.
                Err(e) if is_gone(&e) => match newest_checkpoint_after(&self.tier, state.seq)? {
                    Some(cp) if cp.seq > seq || (!checkpoint && cp.seq == seq) => {
                        next = Some(Next::Checkpoint(cp));
                        continue;
                    }
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            };
            report.removed += removed.len() as u64;
            self.record(state, seq, files, removed)?;
            state.behind = false;
            report.commits += u64::from(!checkpoint);
            report.checkpoints += u64::from(checkpoint);
            report.fetched += fetched;
            report.seq = seq;
            next = ahead?;
        }
        if report.commits + report.checkpoints > 0 {
            self.prune_block_lists(state);
        }
        if report.fetched > 0 {
            // Copies made while still open were kept over budget; the
            // working directory holds those bytes now.
            self.tier.evict()?;
        }
        Ok(report)
    }

    /// What follows `seq`: the commit after it (none follows `u64::MAX`);
    /// for a directory with nothing applied (`seq` 0), the newest
    /// checkpoint first, if gc wrote one.
    pub(super) fn read_after(&self, seq: u64) -> Result<Option<Next>> {
        if seq == 0
            && let Some(cp) = newest_checkpoint_after(&self.tier, 0)?
        {
            return Ok(Some(Next::Checkpoint(cp)));
        }
        match seq.checked_add(1) {
            Some(next) => Ok(read_commit(&self.tier, next)?.map(Next::Commit)),
            None => Ok(None),
        }
    }

    /// Applies one commit: its pieces, then its removals. Returns the
    /// files it left, the files it removed and how many pieces were
    /// written locally.
    #[allow(clippy::type_complexity)]
    pub(super) fn apply(
        &self,
        state: &mut State,
        c: &Commit,
    ) -> Result<(BTreeMap<String, Known>, Vec<String>, u64)> {
        let mut files = BTreeMap::new();
        let mut fetched = 0;
        // Opened first, all at once, in the background while the files
        // copied whole are fetched, and kept open until the commit is
        // applied: the loop below finds them open.
        let _opening = self.open_by_blocks_at_once(c);
        let (ahead, ahead_of) = self.fetched_whole(c);
        let windows = prefetch::windows(&ahead, self.tier.config().tier_budget);
        let mut next_window = 0;
        for (i, p) in c.pieces.iter().enumerate() {
            if let (Some(k), Some(w)) = (ahead_of[i], windows.get(next_window))
                && k == w.start
            {
                prefetch::fetch_window(&self.tier, &ahead[w.clone()]);
                next_window += 1;
            }
            let local = self.dir.join(&p.path);
            let end = p.offset + p.size;
            let known = state.files.get(&p.path).copied();
            // A link into the tier is never local work: a new piece for its
            // path replaces it (or, re-applied after a crash, relinks it).
            let meta = std::fs::symlink_metadata(&local)
                .ok()
                .filter(|m| !m.file_type().is_symlink());
            if meta.is_none() && known.is_none_or(|k| k.ino == 0) {
                state.by_blocks.remove(&p.path);
            }
            // A re-applied commit (a crash before it was recorded): the
            // bytes are in place already.
            if let Some(m) = &meta
                && m.is_file()
                && m.len() >= end
                && (!p.replace || m.len() == end)
                && hash_range(&local, p.offset, p.size)? == p.blake3
            {
                let k = Known {
                    len: m.len().max(known.map_or(0, |k| k.len)),
                    ino: m.ino(),
                    blocks: false,
                };
                state.files.insert(p.path.clone(), k);
                files.insert(p.path.clone(), k);
                continue;
            }
            // Local bytes not published by this handle: another writer wrote
            // a file this one also writes.
            let unpublished = match (&meta, known) {
                (None, _) => false,
                (Some(_), Some(k)) if k.ino == 0 => true,
                (Some(m), Some(k)) => m.ino() != k.ino || m.len() != k.len,
                (Some(_), None) => true,
            };
            if unpublished {
                return Err(Error::Conflict {
                    url: self.tier.url().to_string(),
                    path: p.path.clone(),
                    seq: c.seq,
                    writer: c.writer.clone(),
                });
            }
            let object = format!("{OBJECTS}/{}", p.blake3);
            let new_file = meta.is_none() || p.replace;
            if new_file && self.linked(p) {
                let hashes = match &p.blocks {
                    Some(list) => Some(self.keep_block_list(state, c.seq, p, list)?),
                    None => None,
                };
                let k = Known {
                    len: p.size,
                    ino: 0,
                    blocks: hashes.is_some(),
                };
                self.link(state, &p.path, &object, k, hashes)?;
                files.insert(p.path.clone(), k);
                continue;
            }
            if known.is_some_and(|k| k.ino == 0) && !p.replace {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!("{}: a file published whole grew afterwards", p.path),
                });
            }
            let expected = Expected {
                size: Some(p.size),
                blake3: Some(*parse_hash(&self.tier, &p.blake3)?.as_bytes()),
            };
            let have = meta.as_ref().map_or(0, |m| m.len());
            if !new_file && p.offset != have {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!(
                        "{}: appends at byte {} to a file of {have} bytes here",
                        p.path, p.offset
                    ),
                });
            }
            if new_file && p.offset != 0 {
                return Err(Error::Corrupt {
                    url: self.tier.url().to_string(),
                    name: commit_name(c.seq),
                    problem: format!(
                        "{}: starts at byte {}, but the file is not here",
                        p.path, p.offset
                    ),
                });
            }
            let source = if p.size == 0 {
                None
            } else {
                Some(self.tier.fetch(&object, &expected)?)
            };
            let ino = if new_file {
                write_new(&local, source.as_ref(), p.size)?
            } else {
                append(&local, source.as_ref(), p.offset, p.size)?
            };
            fetched += 1;
            let k = Known {
                len: end,
                ino,
                blocks: false,
            };
            state.files.insert(p.path.clone(), k);
            files.insert(p.path.clone(), k);
        }
        let removed = self.remove(state, c)?;
        Ok((files, removed, fetched))
    }

    /// Removes the files commit `c` removed from the working directory
    /// (after its pieces are in place: a store still maps what it had
    /// open). Each is checked as a piece is: a file this handle does not
    /// know as it left it is local work, not to be lost
    /// ([`Error::Conflict`]).
    pub(super) fn remove(&self, state: &mut State, c: &Commit) -> Result<Vec<String>> {
        let mut dirs = HashSet::new();
        for path in &c.removed {
            let local = self.dir.join(path);
            let known = state.files.get(path).copied();
            match std::fs::symlink_metadata(&local) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("stat", &local)(e)),
                Ok(m) => {
                    let link = m.file_type().is_symlink();
                    let as_left = match known {
                        Some(k) if k.ino == 0 => link,
                        Some(k) => m.is_file() && m.ino() == k.ino && m.len() == k.len,
                        None => false,
                    };
                    if !as_left {
                        return Err(Error::Conflict {
                            url: self.tier.url().to_string(),
                            path: path.clone(),
                            seq: c.seq,
                            writer: c.writer.clone(),
                        });
                    }
                    match std::fs::remove_file(&local) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(Error::io("remove", &local)(e)),
                    }
                    dirs.insert(durable_fs::parent_dir(&local).to_path_buf());
                }
            }
            state.files.remove(path);
            state.by_blocks.remove(path);
        }
        for d in dirs {
            durable_fs::sync_dir(&d)?;
        }
        Ok(c.removed.clone())
    }

    /// The objects of `c` that applying it will fetch whole (not linked to
    /// be read by blocks, not already in place), with their sizes; and for
    /// each piece, its index in that list.
    pub(super) fn fetched_whole(
        &self,
        c: &Commit,
    ) -> (Vec<(prefetch::Ahead, u64)>, Vec<Option<usize>>) {
        let mut ahead = Vec::new();
        let of = c
            .pieces
            .iter()
            .map(|p| {
                let linked = self.linked(p);
                let local = self.dir.join(&p.path);
                if p.size == 0 || linked || prefetch::in_place(&local, p.offset + p.size) {
                    return None;
                }
                let hash = parse_hash(&self.tier, &p.blake3).ok()?;
                ahead.push((
                    prefetch::Ahead {
                        object: format!("{OBJECTS}/{}", p.blake3),
                        expected: Expected {
                            size: Some(p.size),
                            blake3: Some(*hash.as_bytes()),
                        },
                    },
                    p.size,
                ));
                Some(ahead.len() - 1)
            })
            .collect();
        (ahead, of)
    }

    /// Whether piece `p` is linked into the tier and read by blocks rather
    /// than copied whole: a whole file the store reads by blocks, larger
    /// than the tier fetches whole, read in blocks of its own size, or
    /// read under leases.
    pub(crate) fn linked(&self, p: &Piece) -> bool {
        // A file its store reads under leases is linked whatever its size:
        // a whole copy of a small one would sit outside the tier's budget.
        p.offset == 0
            && p.size > 0
            && (self.files.by_blocks)(&p.path, p.size)
            && (p.size > self.tier_whole_max()
                || (self.files.block_size)(&p.path, p.size).is_some()
                || (self.files.evict_blocks)(&p.path))
    }

    pub(crate) fn tier_whole_max(&self) -> u64 {
        // The tier fetches objects up to its whole-file size in one piece;
        // only larger ones are worth reading by blocks.
        self.tier.config().whole_file_max
    }

    /// Replaces the link `path` to `object` (`len` bytes) by a whole local
    /// copy, verified against the BLAKE3 the object is named by, and
    /// records it as a file of the working directory.
    pub(crate) fn make_whole(
        &self,
        state: &mut State,
        path: &str,
        object: &str,
        len: u64,
    ) -> Result<()> {
        let blake3 = object
            .strip_prefix(&format!("{OBJECTS}/"))
            .unwrap_or_default();
        let expected = Expected {
            size: Some(len),
            blake3: Some(*parse_hash(&self.tier, blake3)?.as_bytes()),
        };
        let copy = self.tier.fetch(object, &expected)?;
        let ino = write_new(&self.dir.join(path), Some(&copy), len)?;
        state.by_blocks.remove(path);
        let known = Known {
            len,
            ino,
            blocks: false,
        };
        let seq = state.seq;
        self.record(
            state,
            seq,
            BTreeMap::from([(path.to_string(), known)]),
            Vec::new(),
        )
    }
}

pub(super) fn parse_hash(tier: &RemoteTier, hex: &str) -> Result<blake3::Hash> {
    blake3::Hash::from_hex(hex).map_err(|e| Error::Corrupt {
        url: tier.url().to_string(),
        name: hex.to_string(),
        problem: format!("not a BLAKE3 hash: {e}"),
    })
}
