//! [`TierReport`]: what a tier directory holds and does — its counters,
//! the budget it was last opened with, the plans registered in it — read
//! from its files alone: no URL, no `tier.lock`, nothing changed. What a
//! user looks at when a job seems slow (`cachex tier DIR`).

use std::path::{Path, PathBuf};

use crate::Result;
use crate::plans::record::RecordHeader;
use crate::plans::registry::each_record;
use crate::state::{TierBudget, TierStats, read_state};

/// A tier directory's state as a report shows it: read by
/// [`TierReport::read`] without a lock, each part as some moment left it.
#[derive(Debug, Clone, PartialEq)]
pub struct TierReport {
    /// The tier directory.
    pub tier_dir: PathBuf,
    /// The counters of `tier.state`.
    pub stats: TierStats,
    /// The budget the last process to open the tier gave it; `None` when
    /// none recorded one (a state file from before budgets were recorded).
    pub budget: Option<TierBudget>,
    /// The plan records in `plans/`, by file name: those of living
    /// registrants, and those of dead ones not yet removed.
    pub plans: Vec<PlanStatus>,
}

/// One plan record of a tier, as [`TierReport`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStatus {
    /// The record's file name in `<tier_dir>/plans/`
    /// (`<host>-<pid>-<nanos>-<n>.plan`).
    pub file: String,
    /// The registrant's host, from the file name (`None` for a name not
    /// of that form).
    pub host: Option<String>,
    /// The registrant's process id on its host, from the file name.
    pub pid: Option<u32>,
    /// Whether the registrant (or a child it forked) still holds the
    /// record's lock. A dead registrant's record counts for nothing; the
    /// tier's next reader removes it.
    pub alive: bool,
    /// The registrant's position in its batch clock
    /// ([`PlanHandle::advance`](crate::PlanHandle::advance)): positions
    /// from `epoch_len` on are the next epoch's. `None` when the record's
    /// header does not read.
    pub progress: Option<u64>,
    /// The batches of the plan's epoch.
    pub epoch_len: Option<u64>,
    /// The objects the plan reads.
    pub objects: Option<u64>,
    /// Why the record's header does not read (another version, cut
    /// short); `None` when it does.
    pub problem: Option<String>,
}

impl TierReport {
    /// Reads the report of the tier at `tier_dir`: its `tier.state` and
    /// the headers of its plan records (not their blocks), with no lock
    /// and no change to anything. [`Error::NotATier`](crate::Error::NotATier)
    /// when the directory has no `tier.state`,
    /// [`Error::DamagedState`](crate::Error::DamagedState) when it is not
    /// one this build reads.
    pub fn read(tier_dir: &Path) -> Result<TierReport> {
        let (stats, budget) = read_state(tier_dir)?;
        let mut plans = Vec::new();
        each_record(tier_dir, |name, file, alive| {
            let (host, pid) = registrant(name);
            let header = RecordHeader::read(file);
            let fields = header.as_ref().ok();
            plans.push(PlanStatus {
                file: name.to_string(),
                host,
                pid,
                alive,
                progress: fields.map(|h| h.progress),
                epoch_len: fields.map(|h| h.epoch_len),
                objects: fields.map(|h| h.objects),
                problem: header.err(),
            });
        })?;
        Ok(TierReport {
            tier_dir: tier_dir.to_path_buf(),
            stats,
            budget,
            plans,
        })
    }

    /// Bytes the tier holds beyond its recorded budget (0 within it);
    /// `None` when no budget is recorded.
    pub fn over_budget_bytes(&self) -> Option<u64> {
        self.budget
            .map(|b| self.stats.allocated.saturating_sub(b.bytes))
    }
}

/// The host and pid of a record's file name,
/// `<host>-<pid>-<nanos>-<n>.plan` (a [`durable_fs::host_pid_token`]).
fn registrant(name: &str) -> (Option<String>, Option<u32>) {
    let stem = name
        .strip_suffix(crate::constants::PLAN_SUFFIX)
        .unwrap_or(name);
    match durable_fs::parse_host_pid_token(stem) {
        Some((host, pid)) => (Some(host.to_string()), Some(pid)),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_name_gives_its_host_and_pid() {
        assert_eq!(
            registrant("node-7.example-4242-1700000000000000000-3.plan"),
            (Some("node-7.example".into()), Some(4242))
        );
        assert_eq!(registrant("odd.plan"), (None, None));
        assert_eq!(registrant("h-notapid-1-2.plan"), (None, None));
    }

    #[test]
    fn a_directory_without_a_state_is_not_a_tier_and_a_damaged_state_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = TierReport::read(dir.path()).unwrap_err();
        assert!(matches!(err, crate::Error::NotATier { .. }), "{err}");
        let state = dir.path().join(crate::constants::STATE_FILE);
        std::fs::write(&state, vec![0u8; 4096]).unwrap();
        let err = TierReport::read(dir.path()).unwrap_err();
        assert!(
            matches!(&err, crate::Error::DamagedState { path, problem }
                if path == &state && problem.contains("bad magic")),
            "{err}"
        );
        std::fs::write(&state, b"CXTIERST").unwrap();
        let err = TierReport::read(dir.path()).unwrap_err();
        assert!(err.to_string().contains("8 bytes"), "{err}");
    }
}
