//! The eviction pass: frees whole copies and single blocks so that a
//! fetch fits the budget.
//!
//! A fetch reserves its bytes in `tier.state` first
//! ([`Inner::make_room`](crate::engine::Inner::make_room)): while the
//! count plus the fetch fits the budget, that is one lock and a few
//! atomics, no scan. Otherwise one pass runs, down to the budget less the
//! fetch and a slack ([`Slack`]), so that one scan serves many fetches:
//! by LRU, a share of the budget; while a live plan reads some object, a
//! share of what the plans must fetch each epoch anyway (the bytes their
//! epochs read less the budget), since a block a plan would have kept and
//! the slack frees is fetched again (a prefetch's pass, a share of that).
//! The shares are in `constants.rs`.
//!
//! The pass lists `objects/`, reads the pin records and the live plans,
//! and builds its candidates:
//! - an object no process has open is a whole candidate (LRU by its
//!   copy's mtime), unless a live plan reads it: then its present blocks
//!   are, so a page file between epochs keeps its planned blocks;
//! - an object open only by handles of
//!   [`open_leased`](crate::RemoteTier::open_leased) gives its present
//!   blocks (LRU by their touch clock, or by next planned use), except
//!   leased ones and those not aligned to 4 KiB pages;
//! - an object some handle needs whole is never a candidate.
//!
//! [`victims::choose`](crate::victims::choose) orders them. A block is
//! freed by clearing its bit in the block map on disk (written durably),
//! bumping the generation, and only then punching its bytes out of the
//! sparse file (`fallocate(PUNCH_HOLE | KEEP_SIZE)`): a handle that reads
//! a block leases it first and then compares the generation, so it either
//! holds a block no pass may free or learns that its map is stale. Where
//! the file system cannot punch holes, the object is evicted whole once
//! no process has it open. Maps are read only for open or planned objects.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::time::SystemTime;

use crate::constants::{LRU_SLACK_MAX, LRU_SLACK_SHARE, PAGE, PLANNED_SLACK, PREFETCH_SHARE};
use crate::format::BlockMap;
use crate::local::{EvictReport, Found, LocalDir};
use crate::pins;
use crate::state::{Stat, units};
use crate::victims::{Admit, Candidate, NEVER, choose};
use crate::{Error, Result};

/// What a pass frees beyond the bytes asked for, so that one scan serves
/// many fetches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slack {
    /// The tier's budget.
    budget: u64,
    /// Without a plan: 1/[`LRU_SLACK_SHARE`] of the budget, at most
    /// [`LRU_SLACK_MAX`].
    lru: u64,
}

impl Slack {
    /// No slack: free exactly what is asked.
    pub(crate) const NONE: Slack = Slack { budget: 0, lru: 0 };

    /// The slack of a tier of `budget` bytes.
    pub(crate) fn of(budget: u64) -> Slack {
        Slack {
            budget,
            lru: (budget / LRU_SLACK_SHARE).min(LRU_SLACK_MAX),
        }
    }

    /// The slack under live plans whose epochs read `working` bytes of
    /// this tier: 1/[`PLANNED_SLACK`] of what they must fetch each epoch
    /// beyond the budget (at most the LRU's slack). A block a pass frees
    /// early is one the plan would have kept, and is fetched again, so
    /// the fetches over the floor follow the slack. Scaled by the epoch's
    /// misses, they stay the same small share of the floor at every
    /// budget, with a pass every 1/`PLANNED_SLACK` of the epoch's
    /// fetches; a slack fixed as a share of the budget costs either many
    /// passes at small budgets or fetches over the floor at large ones
    /// (the measurements: `BENCHMARKS.md`, W9).
    fn planned(&self, working: u64) -> u64 {
        (working.saturating_sub(self.budget) / PLANNED_SLACK).min(self.lru)
    }
}

/// One object's part in a pass.
struct Object {
    found: Found,
    /// Some process has it open.
    open: bool,
    /// Its block map, read when its blocks are candidates.
    map: Option<BlockMap>,
}

/// One eviction pass freeing at least `need` counted bytes where it
/// can (call with `tier.lock` held and the count checked).
pub(crate) fn pass(dir: &LocalDir, need: u64, slack: Slack, admit: Admit) -> Result<EvictReport> {
    let found = dir.scan()?;
    let total: u64 = found.values().map(|f| f.bytes).sum();
    let mut report = EvictReport {
        bytes_before: total,
        bytes_after: total,
        ..EvictReport::default()
    };
    if need == 0 {
        return Ok(report);
    }
    let held = dir.held()?;
    let plans = crate::plans::next_uses(&dir.root);
    let planned: HashSet<&str> = plans.keys().collect();
    // Under a plan the slack proper is small (a block freed early is
    // one the plan would have kept); up to the LRU's slack more comes
    // from blocks no plan reads again, which cost nothing to free now.
    //
    // A prefetch under a plan frees 1/PREFETCH_SHARE of that slack.
    // Prefetches run ahead of the reads (a warmed next batch: nearly
    // every fetch of a planned epoch), and what their passes free early
    // costs more fetches than a read's pass does; no slack at all costs
    // more passes instead (`BENCHMARKS.md`, W9).
    let (need, extra) = match (planned.is_empty(), admit) {
        (true, _) => (need.saturating_add(slack.lru), 0),
        (false, Admit::Read) => {
            let planned = slack.planned(plans.epoch_bytes());
            (
                need.saturating_add(planned),
                slack.lru.saturating_sub(planned),
            )
        }
        (false, Admit::Prefetch { .. }) => (
            need.saturating_add(slack.planned(plans.epoch_bytes()) / PREFETCH_SHARE),
            0,
        ),
    };
    let mut objects: HashMap<String, Object> = HashMap::new();
    let mut cands: Vec<Candidate> = Vec::new();
    for (key, f) in found {
        let open = held.has(&key);
        let shared: std::rc::Rc<str> = key.as_str().into();
        let whole = |protected: bool| Candidate {
            key: shared.clone(),
            block: None,
            bytes: f.bytes,
            last_use: nanos(f.used),
            next_use: None,
            protected,
        };
        let by_blocks = f.sparse
            && !f.whole
            && if open {
                !held.whole(&key)
            } else {
                planned.contains(key.as_str())
            };
        let map = by_blocks.then(|| dir.read_map(&key)).flatten();
        let Some(map) = map else {
            if open {
                report.pinned += 1;
            }
            cands.push(whole(open));
            objects.insert(
                key,
                Object {
                    found: f,
                    open,
                    map: None,
                },
            );
            continue;
        };
        let clocks = dir.read_touch(&key, map.blocks());
        let uses = plans.object(&key);
        let idle = planned.contains(key.as_str()).then_some(NEVER);
        for b in (0..map.blocks()).filter(|&b| map.has(b)) {
            let r = map.block_range(b);
            let aligned = r.start % PAGE == 0 && (r.end % PAGE == 0 || r.end == map.size);
            cands.push(Candidate {
                key: shared.clone(),
                block: Some(b),
                bytes: units(r),
                last_use: clocks.get(b as usize).copied().unwrap_or(0),
                next_use: uses.distance(b).or(idle),
                // Leases are looked up for the chosen blocks only.
                protected: !aligned,
            });
        }
        objects.insert(
            key,
            Object {
                found: f,
                open,
                map: Some(map),
            },
        );
    }
    let chosen = choose_unleased(&mut cands, need, extra, admit, &held);
    if chosen.is_empty() {
        return Ok(report);
    }
    let _changing = dir.state.changing();
    let freed = free(dir, &chosen, &cands, &mut objects, &mut report);
    // Bumped once every map changed is written (and after a failure
    // part-way): a reader that saw the new generation reads the new
    // maps. Bumped before, a reader could take the old map for the
    // new generation and never look again at the blocks freed since.
    dir.state.bump_generation();
    freed?;
    Ok(report)
}

/// Frees the candidates `chosen` of `cands`: idle objects removed,
/// blocks of open ones punched (see [`punch`]).
fn free(
    dir: &LocalDir,
    chosen: &[usize],
    cands: &[Candidate],
    objects: &mut HashMap<String, Object>,
    report: &mut EvictReport,
) -> Result<()> {
    let mut blocks: HashMap<&str, Vec<u64>> = HashMap::new();
    for &i in chosen {
        let c = &cands[i];
        match c.block {
            Some(b) => blocks.entry(&*c.key).or_default().push(b),
            None => {
                let freed = remove_object(dir, &c.key, &objects[&*c.key].found)?;
                if freed > 0 {
                    report.evicted += 1;
                } else {
                    report.pinned += 1;
                }
                report.bytes_after = report.bytes_after.saturating_sub(freed);
            }
        }
    }
    // Every map first, each written and renamed into place, then one
    // fsync of their directory (not one per map: a pass under a plan
    // may touch many objects, a segment store's) when a durable bit
    // was cleared, then the punches: a block's bytes go only once no
    // map on disk can say it is here.
    let mut written: Vec<(&str, Vec<std::ops::Range<u64>>)> = Vec::new();
    let mut durable = false;
    let mut failed = None;
    for (key, victims) in blocks {
        let Some(object) = objects.get_mut(key) else {
            continue;
        };
        match clear_bits(dir, key, object, &victims) {
            Ok(Some((ranges, synced))) => {
                durable |= synced;
                written.push((key, ranges));
            }
            Ok(None) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if durable {
        durable_fs::sync_parent_dir(&dir.map(written[0].0))?;
    }
    for (key, ranges) in written {
        let Some(object) = objects.get_mut(key) else {
            continue;
        };
        let freed = punch(dir, key, object, &ranges, report)?;
        report.bytes_after = report.bytes_after.saturating_sub(freed);
    }
    failed.map_or(Ok(()), Err)
}

/// Clears the bits of blocks `victims` in the map of `key` and writes
/// it, renamed into place: synced when some victim was durable (the
/// caller then syncs the directory before punching), else not. The
/// byte ranges of the blocks and whether the map was written durably;
/// `None` for an object read without a map.
fn clear_bits(
    dir: &LocalDir,
    key: &str,
    object: &mut Object,
    victims: &[u64],
) -> Result<Option<(Vec<std::ops::Range<u64>>, bool)>> {
    let Some(map) = object.map.as_mut() else {
        return Ok(None);
    };
    let ranges: Vec<std::ops::Range<u64>> = victims.iter().map(|&b| map.block_range(b)).collect();
    // A block whose bit is unsynced (written in this boot, never
    // fsynced) needs no durable map to go: a map of before that comes
    // back after a crash holds its bit as another boot's, which every
    // reader drops. Only a durable bit must be durably cleared before
    // its bytes are punched.
    let durable = victims.iter().any(|&b| map.has(b) && !map.is_unsynced(b));
    for &b in victims {
        map.clear(b);
    }
    let map_path = dir.map(key);
    if !durable {
        durable_fs::replace_unsynced(&map_path, &map.encode())?;
        return Ok(Some((ranges, false)));
    }
    let tmp = durable_fs::temp_path(&map_path);
    durable_fs::write_synced(&tmp, &map.encode())?;
    if let Err(e) = durable_fs::rename(&tmp, &map_path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    Ok(Some((ranges, true)))
}

/// Removes every file of the idle object `key` (as a scan `found`
/// it) and takes off the count what it counted for them
/// ([`LocalDir::counted`]: a sparse copy's allowance included).
fn remove_object(dir: &LocalDir, key: &str, found: &Found) -> Result<u64> {
    let bytes = dir.counted(key, found);
    // The map goes first: a sparse file without a map is only space,
    // never mistaken for fetched blocks.
    durable_fs::remove_and_sync(&dir.map(key))?;
    durable_fs::remove_and_sync(&dir.sparse(key))?;
    durable_fs::remove_and_sync(&dir.touch(key))?;
    durable_fs::remove_and_sync(&dir.whole(key))?;
    dir.state.sub(bytes);
    dir.state.count(Stat::EvictedBytes, bytes);
    Ok(bytes)
}

/// Punches the bytes of `ranges` (blocks whose bits
/// [`clear_bits`] cleared, durably) out of the
/// sparse copy of `key` (the caller bumps the generation once every
/// map is written). An idle object left without a block is removed;
/// one whose file system cannot punch is removed whole when idle (else
/// only its bits go, its bytes stay counted). Returns the bytes freed.
fn punch(
    dir: &LocalDir,
    key: &str,
    object: &mut Object,
    ranges: &[std::ops::Range<u64>],
    report: &mut EvictReport,
) -> Result<u64> {
    let Some(map) = object.map.as_ref() else {
        return Ok(0);
    };
    let sparse = dir.sparse(key);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&sparse)
        .map_err(Error::io("open", &sparse))?;
    let mut freed = 0u64;
    for (at, r) in ranges.iter().enumerate() {
        let len = units(r.clone());
        // SAFETY: fallocate on a descriptor this function owns; it
        // takes no pointer. The range lies inside the file and on page
        // boundaries (unaligned blocks are never candidates), so it
        // frees exactly this block, whose bit is already cleared.
        let done = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                r.start as libc::off_t,
                len as libc::off_t,
            )
        };
        if done != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                drop(file);
                // The count follows the maps: blocks no map marks are
                // not counted, punched or not.
                let unmarked: u64 = ranges[at..].iter().map(|r| units(r.clone())).sum();
                dir.state.sub(unmarked);
                if !object.open {
                    let gone = remove_object(dir, key, &object.found)?;
                    report.evicted += u64::from(gone > 0);
                    return Ok(freed + unmarked + gone);
                }
                return Ok(freed + unmarked);
            }
            return Err(Error::io("punch a hole in", &sparse)(e));
        }
        let bytes = units(r.clone());
        freed += bytes;
        dir.state.sub(bytes);
        dir.state.count(Stat::EvictedBytes, bytes);
        dir.state.count(Stat::PunchedBlocks, 1);
        report.punched += 1;
    }
    drop(file);
    if !object.open && map.present() == 0 {
        let gone = remove_object(dir, key, &object.found)?;
        report.evicted += u64::from(gone > 0);
        freed += gone;
    }
    Ok(freed)
}

/// [`choose`] with the blocks some process leases protected, looked up
/// for the chosen blocks only (a lease is a hash of the object's key and
/// block: thousands of candidates a pass, a few dozen chosen). A chosen
/// block found leased is protected and the choice made again, until it
/// holds no leased block: each round protects at least one more, and a
/// leased block is one being read (next use 0, or the latest touch), so
/// it comes last in the order and one round is the rule.
fn choose_unleased(
    cands: &mut [Candidate],
    need: u64,
    extra: u64,
    admit: Admit,
    held: &pins::Held,
) -> Vec<usize> {
    loop {
        let chosen = choose(cands, need, extra, admit);
        let leased: Vec<usize> = chosen
            .iter()
            .copied()
            .filter(|&i| {
                cands[i]
                    .block
                    .is_some_and(|b| held.leased(&cands[i].key, b))
            })
            .collect();
        if leased.is_empty() {
            return chosen;
        }
        for i in leased {
            cands[i].protected = true;
        }
    }
}

/// `t` in nanoseconds since the epoch (0 before it).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn under_a_plan_the_slack_is_a_64th_of_the_epochs_misses() {
        let slack = super::Slack::of(64 << 20);
        assert_eq!(slack.planned(0), 0, "nothing planned");
        assert_eq!(slack.planned(64 << 20), 0, "the epoch fits the budget");
        // An epoch of 128 MiB on a 64 MiB budget must fetch 64 MiB again.
        assert_eq!(slack.planned(128 << 20), 1 << 20);
        // Never more than the LRU's slack (1/16 of the budget).
        assert_eq!(slack.planned(1 << 40), 4 << 20);
        assert_eq!(super::Slack::NONE.planned(1 << 40), 0, "no slack asked");
    }
}
