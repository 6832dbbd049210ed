//! Garbage collection of a commit log: [`gc`] deletes the objects that no
//! commit inside the retention window references, and folds the commits
//! up to the window's first into a checkpoint; [`du`] reports what a bucket
//! holds without changing it.
//!
//! # Publishers and gc: no record names an object gc deleted
//!
//! Objects are content-addressed: a publisher whose file holds the bytes
//! of an old, unreferenced object names that object again, and reuses it
//! (it is in the store) or sends it again under the same name, while gc
//! may be deleting it. No store offers gc a delete conditional on what it
//! saw (`object_store` has no conditional delete, and S3 gives the same
//! bytes sent again the same ETag), so each side writes what it is about
//! to do before it reads what the other does (the records: `lease.rs`):
//!
//! - A **publisher** (a publish, a push, a staged upload, a staged
//!   commit's check, gc's own fold of a file for a checkpoint) writes a
//!   lease naming every object its record will name, then reads the
//!   sweeps and waits for each live one that names one of its objects to
//!   end. Only then does it look for, reuse or send an object; it writes
//!   its record (commit or checkpoint), then deletes the lease.
//! - **gc** writes a sweep naming the objects it may delete, then reads
//!   the leases, then the commits and checkpoints written since its
//!   survey. It deletes an object only if none of these names it and a
//!   HEAD shows it older than the grace period, and deletes the sweep
//!   once every delete it sent was answered.
//!
//! **Invariant.** An object a publisher finds in the store (or sends)
//! after its lease is taken stays there while the lease lives, and the
//! record the publisher writes keeps it afterwards. Take a sweep `S` that
//! deletes object `o`, and a lease `L` naming `o`. If gc's read of the
//! leases started after L's put was answered, it read L and kept `o`.
//! Otherwise S's put was answered before L's, so the publisher's read of
//! the sweeps, which follows L's put, found S, and the publisher waited
//! for S to end, that is for every delete of S to be answered, before it
//! looked for `o`. All this needs is that the store lists an object from
//! when its put is answered until its delete is (S3, GCS, Azure Blob and
//! a local file system alike). A lease is deleted only after its record
//! landed, so a gc that reads the leases after that reads the record next
//! and keeps `o`.
//!
//! A sweep that never ends (gc killed, a delete left unanswered) lapses:
//! the publisher stops waiting when its life is over, and a later gc
//! deletes it. gc sends each HEAD and delete within
//! [`SWEEP_FOR`](crate::SWEEP_FOR) of starting the write of the sweep
//! (past it, the objects left start over in a new sweep, with the leases
//! read again), and a delete is answered or given up within the tier's
//! bound on a call; the sweep lives twice as long as a delete may take to
//! land, so every delete lands before it lapses. Both sides judge lapse
//! on the server's clock (`lease.rs`), so a process whose clock is wrong
//! changes nothing. A lease renewed after it may have lapsed is written
//! under a new name, waits for the sweeps again, and the publisher checks
//! its objects again before it commits. Publishers and
//! gcs of earlier versions write no sweeps and wait for none: against
//! them the grace period and [`REUSE_WITHIN`](crate::REUSE_WITHIN) still
//! hold (see [`gc`]).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use remote_tier::{Expected, ObjectInfo, RemoteTier};

use crate::commit::{
    CHECKPOINT_VERSION, CHECKPOINTS, COMMITS, Checkpoint, Commit, OBJECTS, Piece, checkpoint_name,
    checkpoints_after, encode, parse_record_name, read_checkpoint, read_commit, writer_name,
};
use crate::files::StoreFiles;
use crate::hooks::{self, Stage};
use crate::lease::{self, CLOCK_SLACK, Lease, PUBLISH_LEASE, SWEEP_OBJECTS, Sweep};
use crate::log_state::LogState;
use crate::upload;
use crate::workdir::hash_open;
use crate::{Error, Result};

/// The retention window when none is given: a week.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// The grace period when none is given: an hour.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// How [`gc`] chooses what to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcOptions {
    /// The retention window: the commit that was current at its start,
    /// and every commit after it, stay readable, with every object their
    /// states need.
    pub keep: Duration,
    /// No object written within it is deleted, referenced or not.
    pub grace: Duration,
}

impl Default for GcOptions {
    fn default() -> GcOptions {
        GcOptions {
            keep: DEFAULT_KEEP,
            grace: DEFAULT_GRACE,
        }
    }
}

/// What a commit log holds, as [`du`] finds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The last commit (0: none).
    pub seq: u64,
    /// The newest checkpoint, if gc wrote one.
    pub checkpoint: Option<u64>,
    /// The retention window's first commit: the one current at its
    /// start (the last one when none was written since; 0 when every one
    /// was): what a gc now would checkpoint.
    pub window_start: u64,
    /// Files after the last commit, and their bytes.
    pub files: u64,
    /// The bytes of those files.
    pub file_bytes: u64,
    /// Objects the retention window needs (or a publish in flight holds a
    /// lease on), and their bytes.
    pub live_objects: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Objects nothing in the window needs (a gc deletes those older than
    /// its grace period).
    pub garbage_objects: u64,
    /// Their bytes.
    pub garbage_bytes: u64,
    /// Commit records.
    pub commits: u64,
    /// Their bytes.
    pub commit_bytes: u64,
    /// Checkpoints.
    pub checkpoints: u64,
    /// Their bytes.
    pub checkpoint_bytes: u64,
}

impl Usage {
    /// Every byte under the URL that this layout accounts for: objects,
    /// commit records and checkpoints.
    pub fn total_bytes(&self) -> u64 {
        self.live_bytes + self.garbage_bytes + self.commit_bytes + self.checkpoint_bytes
    }
}

/// What [`gc`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The last commit seen.
    pub seq: u64,
    /// The checkpoint written by this run (`None`: the newest one was
    /// already at the window's start, or nothing was committed).
    pub checkpoint: Option<u64>,
    /// Files folded from several pieces into one object for it.
    pub folded: u64,
    /// Objects kept, and their bytes.
    pub live_objects: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Objects deleted.
    pub deleted_objects: u64,
    /// Their bytes.
    pub deleted_bytes: u64,
    /// Unreferenced objects kept because they are younger than the grace
    /// period.
    pub young_objects: u64,
    /// Older checkpoints deleted.
    pub deleted_checkpoints: u64,
    /// Unreferenced objects kept because a live lease (a publish in
    /// flight) names them.
    pub leased_objects: u64,
    /// Lapsed leases deleted.
    pub deleted_leases: u64,
    /// Lapsed sweeps deleted (of gcs killed, or whose delete went
    /// unanswered).
    pub deleted_sweeps: u64,
    /// Sweeps ended before their last object because [`SWEEP_FOR`](crate::SWEEP_FOR)
    /// passed (a slow store, a paused process): the objects left started
    /// over in a new sweep.
    pub restarted_sweeps: u64,
}

/// The commit log as gc and du see it.
struct Survey {
    now: SystemTime,
    /// The newest checkpoint that reads.
    base: Option<Checkpoint>,
    /// Every checkpoint listed.
    checkpoints: Vec<(u64, ObjectInfo)>,
    /// Every commit record listed.
    commit_records: Vec<ObjectInfo>,
    /// The window's first commit (see [`Usage::window_start`]).
    cut: u64,
    /// The files after commit `cut`.
    at_cut: LogState,
    /// The files after the last commit.
    last: LogState,
    /// The objects of the pieces of the commits after `cut`.
    after_cut: HashSet<String>,
    /// Every object listed.
    objects: Vec<ObjectInfo>,
}

fn survey(tier: &RemoteTier, keep: Duration) -> Result<Survey> {
    let now = SystemTime::now();
    let mut checkpoints: Vec<(u64, ObjectInfo)> = tier
        .list(CHECKPOINTS)?
        .into_iter()
        .filter_map(|o| parse_record_name(CHECKPOINTS, &o.name).map(|s| (s, o)))
        .collect();
    checkpoints.sort_by_key(|(s, _)| *s);
    let mut base = None;
    for (seq, _) in checkpoints.iter().rev() {
        if let Some(cp) = read_checkpoint(tier, *seq)? {
            base = Some(cp);
            break;
        }
    }
    let commit_records = tier.list(COMMITS)?;
    let written: HashMap<u64, SystemTime> = commit_records
        .iter()
        .filter_map(|o| parse_record_name(COMMITS, &o.name).map(|s| (s, o.last_modified)))
        .collect();
    let mut last = base
        .as_ref()
        .map(LogState::from_checkpoint)
        .unwrap_or_default();
    let mut commits: Vec<Commit> = Vec::new();
    last.read_after(tier, &mut |c| commits.push(c.clone()))?;
    let window_from = now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH);
    // A record written within the listing's slack of the window's start
    // may be after it: the commit current then is the last one written
    // surely before.
    let before = |when: SystemTime| when + CLOCK_SLACK < window_from;
    // The commit current at the window's start, among every record (those
    // below the checkpoint too; one not in the listing was written after
    // it): a reader on the latest commit then may be on it still.
    let current_at_start = written
        .iter()
        .filter(|&(_, &when)| before(when))
        .map(|(&seq, _)| seq)
        .max()
        .unwrap_or(0);
    let base_seq = base.as_ref().map_or(0, |c| c.seq);
    // The checkpoint is of the window's first commit (or the last one):
    // a reader opened on it needs exactly its state. A window that starts
    // at or below the newest checkpoint moves nothing.
    let cut = current_at_start.max(base_seq).min(last.seq);
    let mut at_cut = base
        .as_ref()
        .map(LogState::from_checkpoint)
        .unwrap_or_default();
    let cut_index = commits.iter().take_while(|c| c.seq <= cut).count();
    for c in &commits[..cut_index] {
        at_cut.apply(tier.url(), c)?;
    }
    let after_cut = commits[cut_index..]
        .iter()
        .flat_map(|c| c.pieces.iter().map(Piece::object))
        .collect();
    Ok(Survey {
        now,
        base,
        checkpoints,
        commit_records,
        cut: at_cut.seq,
        at_cut,
        last,
        after_cut,
        objects: tier.list(OBJECTS)?,
    })
}

/// What the commit log at `tier`'s URL holds, with a retention window of
/// `keep`: live and garbage objects, commit records, checkpoints. Writes
/// nothing.
pub fn du(tier: &RemoteTier, keep: Duration) -> Result<Usage> {
    let s = survey(tier, keep)?;
    let mut live = s.at_cut.objects();
    live.extend(s.after_cut.iter().cloned());
    live.extend(lease::held(tier, s.now)?.objects);
    let mut usage = Usage {
        seq: s.last.seq,
        checkpoint: s.base.as_ref().map(|c| c.seq),
        window_start: s.cut,
        files: s.last.files.len() as u64,
        file_bytes: s.last.bytes(),
        commits: s.commit_records.len() as u64,
        commit_bytes: s.commit_records.iter().map(|o| o.size).sum(),
        checkpoints: s.checkpoints.len() as u64,
        checkpoint_bytes: s.checkpoints.iter().map(|(_, o)| o.size).sum(),
        ..Usage::default()
    };
    for o in &s.objects {
        if live.contains(&o.name) {
            usage.live_objects += 1;
            usage.live_bytes += o.size;
        } else {
            usage.garbage_objects += 1;
            usage.garbage_bytes += o.size;
        }
    }
    Ok(usage)
}

/// Collects the garbage of the commit log at `tier`'s URL (see below):
/// writes the checkpoint of the retention window's
/// first commit (folding files of several pieces into one object
/// each, fetched through the tier), reads the commits published
/// meanwhile, then deletes every object that nothing in the window needs
/// and the grace period does not protect, and the older checkpoints.
/// Safe to run while writers publish and readers refresh.
///
/// Garbage collection of a commit log: [`gc`] deletes the objects that no
/// commit inside the retention window references, and folds the commits
/// up to the window's first into a checkpoint; [`du`] reports what a bucket
/// holds without changing it.
///
/// **The window.** The commit that was current at `now − keep` (the last
/// one whose record the store wrote before then, by the listing's
/// last-modified time, the server's clock) and every commit after it are
/// inside the retention window: a reader that was on the latest commit at
/// any time within `keep` is on one of them, however long ago that commit
/// was written. Let `C` be the window's first commit (the last commit when
/// none was written within `keep`; none, 0, when every commit was). Live
/// are: the objects of every file after commit `C`, and the pieces of
/// every commit after `C`. A reader opened on any commit inside the window
/// holds a state made of those, so gc never breaks it: its refresh applies
/// commits that are all still there, and the files it reads by blocks are
/// still in the store.
///
/// **The checkpoint.** gc writes `checkpoints/<C>.json`: every file after
/// commit `C`. A file made of several pieces (an index log appended by
/// many commits) is folded into one object first, so a checkpoint holds
/// one piece a file and the appended pieces before the window become
/// garbage. A cold open reads the newest checkpoint and the commits after
/// it: the same few requests after a million commits as after ten. Older
/// checkpoints are deleted once a newer one is written. Commit records
/// are kept (a few hundred bytes each; `du` counts them): a reader that is
/// behind catches up one GET a commit, and one whose next commit lost an
/// object to gc moves to the checkpoint instead.
///
/// **The grace period.** An object the store wrote less than `grace` ago
/// is never deleted, referenced or not. Publishers and gcs of this version
/// need none (see the sweeps below). For those of earlier versions it
/// is what protects an upload until its commit and an object reused: a
/// publisher reuses an object already in the store only when the store
/// wrote it within [`REUSE_WITHIN`](crate::REUSE_WITHIN) (30 minutes) and
/// uploads it again otherwise, so with the default grace (an hour) such
/// a publisher that finds an old unreferenced object and commits it
/// loses it only if it sends it again and commits between gc's HEAD of
/// it and its delete.
///
/// **Publishes in flight.** A publish that takes longer than the grace
/// period (a multi-hour push, a long Ray job) holds a lease on every
/// object its commit will name (`lease.rs`); gc keeps them while the
/// lease lives. gc deletes in sweeps of at most [`SWEEP_OBJECTS`]
/// objects: it names them in a sweep record (`sweeps/`), reads the
/// leases and the commits and checkpoints written since, asks for each
/// object again (HEAD) just before it deletes it, keeping it if an upload
/// renewed it within the grace period, and then ends the sweep. A
/// publisher, once its lease is written and before it looks for any
/// object, waits for every sweep that names one of its objects to end:
/// either gc reads the lease, or the publisher finds what gc deleted gone
/// and sends it again, so no commit names an object gc deleted, whatever
/// its age. Lapsed leases and sweeps are deleted.
pub fn gc(tier: &RemoteTier, options: GcOptions) -> Result<GcReport> {
    let s = survey(tier, options.keep)?;
    let mut report = GcReport {
        seq: s.last.seq,
        ..GcReport::default()
    };
    let base_seq = s.base.as_ref().map_or(0, |c| c.seq);
    let newest = if s.cut > base_seq {
        let (cp, folded) = write_checkpoint(tier, &s.at_cut)?;
        report.checkpoint = Some(cp.seq);
        report.folded = folded;
        Some(cp)
    } else {
        s.base.clone()
    };
    let mut live: HashSet<String> = match &newest {
        Some(cp) => cp.pieces.iter().map(Piece::object).collect(),
        None => HashSet::new(),
    };
    live.extend(s.after_cut.iter().cloned());
    // Publishes in flight (their leases), then records written since the
    // survey: what they name stays. In this order, since a publisher
    // deletes its lease only once its record landed.
    let mut held = lease::held(tier, lease::server_now(tier)?)?;
    let mut leased = std::mem::take(&mut held.objects);
    let mut records = Records {
        seq: s.last.seq,
        checkpoint: newest.as_ref().map_or(0, |c| c.seq),
    };
    records.read_new(tier, &mut live)?;
    let young_from = |now: SystemTime| {
        now.checked_sub(options.grace + CLOCK_SLACK)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut unneeded = Vec::new();
    for o in &s.objects {
        if kept(o, &live, &leased, &mut report) {
            continue;
        }
        if o.last_modified >= young_from(s.now) {
            report.young_objects += 1;
            continue;
        }
        unneeded.push(o);
    }
    for batch in unneeded.chunks(SWEEP_OBJECTS) {
        let mut rest: &[&ObjectInfo] = batch;
        while !rest.is_empty() {
            // The sweep first, the leases and records after it: a publisher
            // whose lease this read misses waits for the sweep to end before
            // it looks for any object (the module docs).
            let mut sweep = Sweep::start(tier, rest.iter().map(|o| o.name.clone()))?;
            let again = lease::held(tier, sweep.server_time())?;
            held.lapsed.retain(|l| again.lapsed.contains(l));
            leased.extend(again.objects);
            records.read_new(tier, &mut live)?;
            let mut done = rest.len();
            for (k, o) in rest.iter().enumerate() {
                if kept(o, &live, &leased, &mut report) {
                    continue;
                }
                // Too long since the sweep was written (a slow store, a
                // pause): the rest start over in a new sweep.
                if !sweep.fresh() {
                    done = k;
                    break;
                }
                // The listing may be old: an upload since then renewed the object.
                match tier.head(&o.name) {
                    Ok(info) if info.last_modified >= young_from(SystemTime::now()) => {
                        report.young_objects += 1;
                        continue;
                    }
                    Ok(_) => {}
                    Err(remote_tier::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
                hooks::reached(tier, Stage::Deleting);
                if !sweep.fresh() {
                    done = k;
                    break;
                }
                sweep.delete(&o.name)?;
                report.deleted_objects += 1;
                report.deleted_bytes += o.size;
            }
            sweep.end()?;
            if done < rest.len() {
                report.restarted_sweeps += 1;
            }
            rest = &rest[done..];
        }
    }
    let seq = records.seq;
    report.seq = seq;
    for name in &held.lapsed {
        tier.delete(name)?;
        report.deleted_leases += 1;
    }
    for name in lease::lapsed_sweeps(tier, lease::server_now(tier)?)? {
        tier.delete(&name)?;
        report.deleted_sweeps += 1;
    }
    if let Some(cp) = &newest {
        for (seq, o) in &s.checkpoints {
            if *seq < cp.seq {
                tier.delete(&o.name)?;
                report.deleted_checkpoints += 1;
            }
        }
    }
    Ok(report)
}

/// Whether a commit (`live`) or a lease (`leased`) still needs `o`,
/// counted in `report` if so.
fn kept(
    o: &ObjectInfo,
    live: &HashSet<String>,
    leased: &HashSet<String>,
    report: &mut GcReport,
) -> bool {
    if live.contains(&o.name) {
        report.live_objects += 1;
        report.live_bytes += o.size;
        true
    } else if leased.contains(&o.name) {
        report.leased_objects += 1;
        true
    } else {
        false
    }
}

/// The newest records gc has read: what it reads next starts after them.
struct Records {
    /// The last commit.
    seq: u64,
    /// The newest checkpoint (0: none).
    checkpoint: u64,
}

impl Records {
    /// Reads the commits and checkpoints written after those read so far
    /// (another gc's checkpoint names the object it folded a file into),
    /// adding their pieces' objects to `live`.
    fn read_new(&mut self, tier: &RemoteTier, live: &mut HashSet<String>) -> Result<()> {
        while let Some(next) = self.seq.checked_add(1) {
            let Some(c) = read_commit(tier, next)? else {
                break;
            };
            live.extend(c.pieces.iter().map(Piece::object));
            self.seq = next;
        }
        let newer = checkpoints_after(tier, self.checkpoint)?;
        for seq in &newer {
            // One deleted since the listing stood for an older state.
            if let Some(cp) = read_checkpoint(tier, *seq)? {
                live.extend(cp.pieces.iter().map(Piece::object));
            }
        }
        self.checkpoint = newer.into_iter().fold(self.checkpoint, u64::max);
        Ok(())
    }
}

/// Writes the checkpoint of `state` (conditionally: a gc running at the
/// same time may have written it, whose record is then read and used).
/// Returns it and how many files were folded.
fn write_checkpoint(tier: &RemoteTier, state: &LogState) -> Result<(Checkpoint, u64)> {
    let mut pieces = Vec::with_capacity(state.files.len());
    // The folded objects' leases, held until the checkpoint landed.
    let mut leases = Vec::new();
    for (path, parts) in &state.files {
        match parts.as_slice() {
            [one] => pieces.push(one.clone()),
            [] => {}
            many => {
                let (piece, lease) = fold(tier, path, many)?;
                pieces.push(piece);
                leases.push(lease);
            }
        }
    }
    let folded = leases.len() as u64;
    let cp = Checkpoint {
        version: CHECKPOINT_VERSION,
        seq: state.seq,
        writer: writer_name(),
        pieces,
    };
    let name = checkpoint_name(cp.seq);
    match tier.commit(&name, encode(tier, &name, &cp)?) {
        Ok(()) => Ok((cp, folded)),
        Err(remote_tier::Error::CommitTaken { .. }) => match read_checkpoint(tier, cp.seq)? {
            Some(theirs) => Ok((theirs, folded)),
            None => Err(Error::Corrupt {
                url: tier.url().to_string(),
                name,
                problem: "taken by another gc, then gone".into(),
            }),
        },
        Err(e) => Err(e.into()),
    }
}

/// The file `path`, made of `parts`, as one object (uploaded unless the
/// store has it, recently written): its piece, with a block list when a
/// reader may read it by blocks, and the lease that keeps the object
/// until a checkpoint names it.
fn fold<'t>(tier: &'t RemoteTier, path: &str, parts: &[Piece]) -> Result<(Piece, Lease<'t>)> {
    let dir = tier.tier_dir().join("tmp");
    std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    let tmp = durable_fs::unique_temp_path(&dir, "gc-fold");
    let folded = fold_into(tier, path, parts, &tmp);
    let _ = std::fs::remove_file(&tmp);
    folded
}

fn fold_into<'t>(
    tier: &'t RemoteTier,
    path: &str,
    parts: &[Piece],
    tmp: &Path,
) -> Result<(Piece, Lease<'t>)> {
    let out = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(Error::io("create", tmp))?;
    let mut buf = vec![0u8; 4 << 20];
    for p in parts {
        let hash = blake3::Hash::from_hex(&p.blake3).map_err(|e| Error::Corrupt {
            url: tier.url().to_string(),
            name: p.object(),
            problem: format!("not a BLAKE3 hash: {e}"),
        })?;
        let expected = Expected {
            size: Some(p.size),
            blake3: Some(*hash.as_bytes()),
        };
        if p.size == 0 {
            continue;
        }
        let src = tier.fetch(&p.object(), &expected)?;
        let mut at = 0u64;
        while at < p.size {
            let n = (p.size - at).min(buf.len() as u64) as usize;
            src.file()?
                .read_exact_at(&mut buf[..n], at)
                .map_err(Error::io("read", src.path()))?;
            out.write_all_at(&buf[..n], p.offset + at)
                .map_err(Error::io("write", tmp))?;
            at += n as u64;
        }
    }
    let size = parts.last().map_or(0, |p| p.offset + p.size);
    let block_size = StoreFiles::PLAIN.block_list_size(path, size, tier.config(), &mut 0);
    let (blake3, blocks) = hash_open(&out, tmp, 0, size, block_size)?;
    let piece = Piece {
        path: path.to_string(),
        offset: 0,
        size,
        blake3,
        replace: false,
        blocks: blocks.map(|b| b.to_list()),
    };
    // Another gc may be deleting an object of the same bytes: leased
    // before it is looked for, as a publish does.
    let lease = Lease::take(tier, PUBLISH_LEASE, [piece.object()])?;
    // Sent from the handle it was hashed from, checked as it is sent.
    upload::put_piece(tier, &piece, &out, tmp)?;
    Ok((piece, lease))
}
