//! Write phases measured from a settled disk.
//!
//! How fast a durable write runs depends on the write-back that earlier
//! phases (and the machine's neighbours) left behind. So every timed write
//! repetition starts from a settled disk ([`settle_disk`]: `sync`, then
//! waiting until `Dirty` + `Writeback` in `/proc/meminfo` are near zero),
//! right after a fresh measurement of the durable-write limit on the same
//! file system, and the phase reports the median with min and max.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::{Ctx, Limit, Line, RunError, limits, median, progress};

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

/// The repetitions of one write phase: seconds and the durable-write
/// limit measured right before each.
#[derive(Debug, Default)]
pub struct WriteRuns {
    secs: Vec<f64>,
    durable_write: Vec<f64>,
    unsettled: usize,
}

impl WriteRuns {
    /// Runs `one` [`WRITE_REPS`] times; each repetition starts from a
    /// settled disk, after the durable-write limit is measured in `ctx`'s
    /// directory. `one(rep)` returns its timed seconds.
    pub fn measure(
        ctx: &Ctx,
        name: &str,
        mut one: impl FnMut(usize) -> Result<f64, RunError>,
    ) -> Result<WriteRuns, RunError> {
        let mut runs = WriteRuns::default();
        let probe = ctx.dir.join("write-limit.bin");
        for rep in 0..WRITE_REPS {
            runs.settle();
            runs.durable_write.push(durable_write(&probe, ctx)?);
            runs.settle();
            let secs = one(rep)?;
            progress!("{name} rep {rep}: {secs:.2}s");
            runs.secs.push(secs);
        }
        Ok(runs)
    }

    fn settle(&mut self) {
        let (settled, _) = settle_disk();
        self.unsettled += usize::from(!settled);
    }

    /// The phase's line: median time against the median of the limits
    /// measured next to it, with min and max of both.
    pub fn line(&self, workload: &str, phase: &str, items: usize, bytes: u64) -> Line {
        let mut secs = self.secs.clone();
        let mut limit = self.durable_write.clone();
        let mb = |s: f64| bytes as f64 / s.max(1e-9) / 1e6;
        let fractions: Vec<f64> = self
            .secs
            .iter()
            .zip(&self.durable_write)
            .map(|(&s, &l)| bytes as f64 / s.max(1e-9) / l.max(1.0))
            .collect();
        let median_secs = median(&mut secs);
        let median_limit = median(&mut limit);
        let (fastest, slowest) = (secs[0], secs[secs.len() - 1]);
        Line::new(workload, phase, items, bytes, median_secs)
            .limit_measured(Limit::DurableWrite, median_limit)
            .with("repetitions", self.secs.len())
            .with("mb_per_s_min", mb(slowest))
            .with("mb_per_s_max", mb(fastest))
            .with("rep_fractions", fractions)
            .with("durable_write_mb_per_s_min", limit[0] / 1e6)
            .with("durable_write_mb_per_s_max", limit[limit.len() - 1] / 1e6)
            .with("unsettled_reps", self.unsettled)
    }
}

/// One durable-write measurement of the run's limit size in `path`'s
/// directory; the file is removed after.
fn durable_write(path: &Path, ctx: &Ctx) -> Result<f64, RunError> {
    let err = |e| RunError::store("limits", e);
    let bytes_per_s =
        limits::measure_durable_write(path, ctx.limits.durable_write_bytes).map_err(err)?;
    std::fs::remove_file(path).map_err(err)?;
    Ok(bytes_per_s)
}
