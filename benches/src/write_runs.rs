//! Write phases measured from a settled disk, each against its own
//! yardstick.
//!
//! How fast a durable write runs depends on the write-back that earlier
//! phases (and the machine's neighbours) left behind, and on *what* is
//! written: one 1 GiB file with one fsync is not forty 8 MiB files, each
//! fsynced, renamed and followed by a directory fsync and a log append.
//! So a write phase is compared with its own **yardstick**: the very files
//! it leaves (same paths' sizes, same file count, same renames and fsync
//! points; a [`WritePattern`] taken from an untimed warm-up run) written
//! plainly from memory with `write(2)`, early write-back of every 8 MiB
//! written (`sync_file_range`, as the stores do) and `fsync(2)`. The yardstick's
//! time is what the phase would take if the store cost nothing but its
//! I/O; the phase's `fraction_of_limit` is the yardstick's time over the
//! phase's.
//!
//! Every timed repetition starts from a settled disk ([`settle_disk`]:
//! `sync`, then waiting until `Dirty` + `Writeback` in `/proc/meminfo` are
//! near zero), right after its yardstick, itself measured from a settled
//! disk; the phase reports the median with min and max.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Ctx, Limit, Line, RunError, median, progress};

/// Removes `dir` and everything under it, if it exists.
pub fn remove_dir_if_any(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Timed repetitions of every write phase.
pub const WRITE_REPS: usize = 3;
/// Dirty + writeback bytes below which the disk counts as settled.
pub const SETTLED_BYTES: u64 = 16 << 20;
/// Longest wait for the disk to settle (a busy neighbour may never let it).
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Dirty + writeback bytes from `/proc/meminfo` (`None` where unavailable).
pub fn dirty_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut total = 0;
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if key == "Dirty" || key == "Writeback" {
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            total += kb * 1024;
            seen += 1;
        }
    }
    (seen == 2).then_some(total)
}

/// `sync`, then waits until dirty + writeback pages are below
/// [`SETTLED_BYTES`] (at most [`SETTLE_TIMEOUT`]). Returns whether the
/// disk settled and the dirty bytes left.
pub fn settle_disk() -> (bool, u64) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() };
        let Some(dirty) = dirty_bytes() else {
            return (true, 0);
        };
        if dirty < SETTLED_BYTES {
            return (true, dirty);
        }
        if Instant::now() >= deadline {
            return (false, dirty);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How a file of a [`WritePattern`] is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// Written under a temporary name in this many equal pieces, each
    /// followed by an fsync (at least one), renamed, and the directory
    /// fsynced (a segment, a shard, a finalized index; a page file whose
    /// footer is fsynced after its pages).
    Renamed(u64),
    /// Appended in this many equal pieces, each followed by an fsync (an
    /// index log, a `.bin` under group commits); at least one.
    Appended(u64),
}

/// One file of a [`WritePattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    /// Bytes written.
    pub bytes: u64,
    /// How they are made durable.
    pub synced: Synced,
}

/// What a write phase leaves on disk, as its yardstick writes it: the
/// files in order, each with its size and fsync points.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritePattern {
    /// The files, written one after the other.
    pub files: Vec<FileWrite>,
}

impl WritePattern {
    /// Every file under `dir` (recursively, in path order), made durable
    /// as `synced(path relative to dir, bytes)` says; `None` leaves a file
    /// out (a lock file, a scratch file).
    pub fn of_dir(
        dir: &Path,
        synced: impl Fn(&Path, u64) -> Option<Synced>,
    ) -> std::io::Result<WritePattern> {
        fn walk(p: &Path, out: &mut Vec<(PathBuf, u64)>) -> std::io::Result<()> {
            let mut entries: Vec<_> = std::fs::read_dir(p)?.collect::<Result<_, _>>()?;
            entries.sort_by_key(|e| e.path());
            for e in entries {
                let m = e.metadata()?;
                if m.is_dir() {
                    walk(&e.path(), out)?;
                } else {
                    out.push((e.path(), m.len()));
                }
            }
            Ok(())
        }
        let mut found = Vec::new();
        walk(dir, &mut found)?;
        let mut pattern = WritePattern::default();
        for (path, bytes) in found {
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            if let Some(s) = synced(rel, bytes) {
                pattern.files.push(FileWrite { bytes, synced: s });
            }
        }
        Ok(pattern)
    }

    /// Adds a file the phase writes but does not leave behind (a manifest
    /// removed when the cache is finalized).
    pub fn with(mut self, bytes: u64, synced: Synced) -> WritePattern {
        self.files.push(FileWrite { bytes, synced });
        self
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// fsyncs of files and directories it takes.
    pub fn fsyncs(&self) -> u64 {
        self.files
            .iter()
            .map(|f| match f.synced {
                Synced::Renamed(k) => k.max(1) + 1,
                Synced::Appended(k) => k.max(1),
            })
            .sum()
    }

    /// Writes the pattern in a fresh directory `scratch` (removed after):
    /// seconds until the last file is durable.
    pub fn write(&self, scratch: &Path) -> std::io::Result<f64> {
        if scratch.exists() {
            std::fs::remove_dir_all(scratch)?;
        }
        std::fs::create_dir_all(scratch)?;
        let chunk: Vec<u8> = (0..(8usize << 20)).map(|i| (i * 7) as u8).collect();
        // `len` bytes in `k` fsynced pieces of equal size (the remainder
        // in the last), each chunk's write-back started as soon as it is
        // written, as the stores' writers do: the disk's best for the
        // pattern, not a naive writer's.
        let fill = |file: &mut File, len: u64, k: u64| -> std::io::Result<()> {
            let k = k.max(1);
            let mut offset = file.metadata()?.len();
            for piece in 0..k {
                let mut left = len / k + if piece + 1 == k { len % k } else { 0 };
                while left > 0 {
                    let n = (chunk.len() as u64).min(left) as usize;
                    file.write_all(&chunk[..n])?;
                    durable_fs::start_writeback(file, offset, n);
                    offset += n as u64;
                    left -= n as u64;
                }
                file.sync_data()?;
            }
            Ok(())
        };
        let start = Instant::now();
        for (i, f) in self.files.iter().enumerate() {
            let path = scratch.join(format!("file_{i:06}"));
            match f.synced {
                Synced::Renamed(k) => {
                    let tmp = scratch.join(format!("file_{i:06}.tmp"));
                    fill(&mut File::create(&tmp)?, f.bytes, k)?;
                    std::fs::rename(&tmp, &path)?;
                    File::open(scratch)?.sync_all()?;
                }
                Synced::Appended(k) => {
                    let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
                    fill(&mut file, f.bytes, k)?;
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        std::fs::remove_dir_all(scratch)?;
        Ok(secs)
    }
}

/// The repetitions of one write phase: seconds, and the seconds its
/// yardstick took right before each.
#[derive(Debug, Default)]
pub struct WriteRuns {
    secs: Vec<f64>,
    yardstick_secs: Vec<f64>,
    pattern: WritePattern,
    warmup_secs: f64,
    unsettled: usize,
}

impl WriteRuns {
    /// Runs `one` once untimed (the warm-up, whose output `pattern` then
    /// describes), then [`WRITE_REPS`] times timed; each timed repetition
    /// follows a write of the pattern in `ctx`'s directory, and both start
    /// from a settled disk, and `clear` removes the phase's previous output
    /// before either. `one(rep)` returns its timed seconds (rep 0 is the
    /// warm-up).
    pub fn measure(
        ctx: &Ctx,
        name: &str,
        mut clear: impl FnMut() -> std::io::Result<()>,
        mut one: impl FnMut(usize) -> Result<f64, RunError>,
        pattern: impl FnOnce() -> std::io::Result<WritePattern>,
    ) -> Result<WriteRuns, RunError> {
        let err = |e| RunError::store("limits", e);
        let mut runs = WriteRuns::default();
        runs.settle();
        runs.warmup_secs = one(0)?;
        runs.pattern = pattern().map_err(err)?;
        progress!(
            "{name}: warm-up {:.2}s; yardstick {} files, {:.1} MB, {} fsyncs",
            runs.warmup_secs,
            runs.pattern.files.len(),
            runs.pattern.bytes() as f64 / 1e6,
            runs.pattern.fsyncs()
        );
        let scratch = ctx.dir.join("yardstick");
        for rep in 1..=WRITE_REPS {
            // The previous output goes before the disk settles: on a file
            // system mounted with `discard` (this machine's), freeing
            // 400 MB issues discards at the next journal commit, which the
            // settle's `sync` absorbs instead of the timed write.
            clear().map_err(err)?;
            runs.settle();
            runs.yardstick_secs
                .push(runs.pattern.write(&scratch).map_err(err)?);
            runs.settle();
            let secs = one(rep)?;
            progress!(
                "{name} rep {rep}: {secs:.2}s (yardstick {:.2}s)",
                runs.yardstick_secs[rep - 1]
            );
            runs.secs.push(secs);
        }
        Ok(runs)
    }

    fn settle(&mut self) {
        let (settled, _) = settle_disk();
        self.unsettled += usize::from(!settled);
    }

    /// The phase's line: `bytes` (the phase's own measure of what it
    /// wrote) over its median time, against the same bytes over the
    /// yardstick's median time (`limit` `durable_write_same_files`), so
    /// `fraction_of_limit` = yardstick time / phase time; with each
    /// repetition's ratio to the yardstick right before it, and min and
    /// max of both.
    pub fn line(&self, workload: &str, phase: &str, items: usize, bytes: u64) -> Line {
        let mut secs = self.secs.clone();
        let mut yard = self.yardstick_secs.clone();
        let mb = |s: f64| bytes as f64 / s.max(1e-9) / 1e6;
        let fractions: Vec<f64> = self
            .secs
            .iter()
            .zip(&self.yardstick_secs)
            .map(|(&s, &y)| y / s.max(1e-9))
            .collect();
        let median_secs = median(&mut secs);
        let median_yard = median(&mut yard);
        let (fastest, slowest) = (secs[0], secs[secs.len() - 1]);
        let yard_mb = |s: f64| self.pattern.bytes() as f64 / s.max(1e-9) / 1e6;
        Line::new(workload, phase, items, bytes, median_secs)
            .limit_measured(
                Limit::DurableWriteSameFiles,
                bytes as f64 / median_yard.max(1e-9),
            )
            .with("repetitions", self.secs.len())
            .with("secs", self.secs.clone())
            .with("mb_per_s_min", mb(slowest))
            .with("mb_per_s_max", mb(fastest))
            .with("rep_fractions", fractions)
            .with("warmup_secs", self.warmup_secs)
            .with("yardstick_secs", self.yardstick_secs.clone())
            .with("yardstick_files", self.pattern.files.len())
            .with("yardstick_bytes", self.pattern.bytes())
            .with("yardstick_fsyncs", self.pattern.fsyncs())
            .with("yardstick_disk_mb_per_s_min", yard_mb(yard[yard.len() - 1]))
            .with("yardstick_disk_mb_per_s_max", yard_mb(yard[0]))
            .with("unsettled_reps", self.unsettled)
    }
}
