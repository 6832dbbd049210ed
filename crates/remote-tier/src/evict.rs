//! Making room: the reservation every fetch takes before it starts, and
//! the eviction pass that frees whole copies and single blocks.
//!
//! A fetch reserves its bytes in `tier.state` first ([`Inner::make_room`]):
//! while the count plus the fetch fits the budget, that is one lock and a
//! few atomics, no scan. Otherwise one eviction pass runs, down to the
//! budget less the fetch and a slack, so that one scan serves many
//! fetches: 1/16 of the budget (at most 64 MiB) by LRU; while a live plan
//! reads some object, 1/64 of what the plans must fetch each epoch anyway
//! (the bytes their epochs read less the budget), since a block a plan
//! would have kept and the slack frees is fetched again (a prefetch's
//! pass, a quarter of that).
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

use crate::engine::Inner;
use crate::format::BlockMap;
use crate::local::{EvictReport, Found, LocalDir, Reservation, TOUCH_GROUP};
use crate::pins;
use crate::state::{PAGE, Stat, units};
use crate::victims::{Admit, Candidate, NEVER, choose};
use crate::{Error, Result};

impl Inner {
    /// Reserves `need` bytes for a fetch: evicts first when the count
    /// plus `need` would pass the budget. A read that finds no room
    /// (everything leased or pinned whole) reserves anyway and is counted
    /// in `over_budget`; a prefetch gets `None` and should skip its block.
    pub(crate) fn make_room(&self, need: u64, admit: Admit) -> Result<Option<Reservation<'_>>> {
        let state = &self.dir.state;
        let budget = self.config.tier_budget;
        let _tier = self.dir.lock_tier()?;
        self.dir.check()?;
        if state.allocated().saturating_add(need) > budget {
            let excess = state
                .allocated()
                .saturating_sub(budget.saturating_sub(need));
            self.dir.pass(excess, Slack::of(budget), admit)?;
            if state.allocated().saturating_add(need) > budget {
                match admit {
                    Admit::Read => state.count(Stat::OverBudget, 1),
                    Admit::Prefetch { .. } => return Ok(None),
                }
            }
        }
        let _changing = state.changing();
        Ok(Some(Reservation::new(&self.dir, need)?))
    }

    /// [`make_room`](Self::make_room) for a read, which always gets its
    /// reservation.
    pub(crate) fn reserve(&self, need: u64) -> Result<Reservation<'_>> {
        match self.make_room(need, Admit::Read)? {
            Some(reserved) => Ok(reserved),
            None => Reservation::new(&self.dir, 0),
        }
    }

    /// Evicts until the count is within the budget (no slack), dead
    /// processes' reservations taken off the count first.
    pub(crate) fn evict_to_budget(&self) -> Result<EvictReport> {
        let _tier = self.dir.lock_tier()?;
        self.dir.check_all()?;
        let excess = self
            .dir
            .state
            .allocated()
            .saturating_sub(self.config.tier_budget);
        self.dir.pass(excess, Slack::NONE, Admit::Read)
    }
}

/// What a pass frees beyond the bytes asked for, so that one scan serves
/// many fetches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slack {
    /// The tier's budget.
    budget: u64,
    /// Without a plan: 1/16 of the budget, at most 64 MiB.
    lru: u64,
}

/// Under a plan the slack is this fraction of the bytes the plans must
/// fetch each epoch anyway (their epoch's blocks less the budget).
const PLANNED_SLACK: u64 = 64;

/// A prefetch's pass under a plan frees this fraction of a read's slack.
const PREFETCH_SHARE: u64 = 4;

impl Slack {
    /// No slack: free exactly what is asked.
    const NONE: Slack = Slack { budget: 0, lru: 0 };

    /// The slack of a tier of `budget` bytes.
    fn of(budget: u64) -> Slack {
        Slack {
            budget,
            lru: (budget / 16).min(64 << 20),
        }
    }

    /// The slack under live plans whose epochs read `working` bytes of
    /// this tier: 1/64 of what they must fetch each epoch beyond the
    /// budget (at most the LRU's slack). A block a pass frees early is
    /// one the plan would have kept, and is fetched again: W9 measured
    /// about 0.6 × the slack an epoch over the floor. Scaled by the
    /// epoch's misses, that is about 1% of the floor at every budget,
    /// and a pass every 1/64 of the epoch's fetches (a fixed slack of
    /// the budget was either many passes at small budgets, 6–16 × the
    /// LRU's for a segment store in 4 KiB blocks, or several % over the
    /// floor at large ones: 1/256 of the budget gave 1.04 × at b = 0.9).
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

impl LocalDir {
    /// The block map of `key` on disk, if there is a valid one, without
    /// the unsynced blocks of another boot (their bytes may be gone).
    pub(crate) fn read_map(&self, key: &str) -> Option<BlockMap> {
        let bytes = durable_fs::read_capped(&self.map(key), crate::format::MAX_MAP_BYTES).ok()?;
        let mut map = BlockMap::decode(&bytes).ok()?;
        map.keep_unsynced_of(durable_fs::boot_id());
        Some(map)
    }

    /// The touch clocks of `key`'s blocks (0 where never leased): each
    /// block its group's (see [`TOUCH_GROUP`]).
    fn read_touch(&self, key: &str, blocks: u64) -> Vec<u64> {
        let mut groups = vec![0u64; blocks.div_ceil(TOUCH_GROUP) as usize];
        if let Ok(bytes) = std::fs::read(self.touch(key)) {
            for (c, w) in groups.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                *c = u64::from_le_bytes(b);
            }
        }
        (0..blocks)
            .map(|b| groups[(b / TOUCH_GROUP) as usize])
            .collect()
    }

    /// One eviction pass freeing at least `need` counted bytes where it
    /// can (call with `tier.lock` held and the count checked).
    pub(crate) fn pass(&self, need: u64, slack: Slack, admit: Admit) -> Result<EvictReport> {
        let found = self.scan()?;
        let total: u64 = found.values().map(|f| f.bytes).sum();
        let mut report = EvictReport {
            bytes_before: total,
            bytes_after: total,
            ..EvictReport::default()
        };
        if need == 0 {
            return Ok(report);
        }
        let held = self.held()?;
        let plans = crate::plans::next_uses(&self.root);
        let planned: HashSet<&str> = plans.keys().collect();
        // Under a plan the slack proper is small (a block freed early is
        // one the plan would have kept); up to the LRU's slack more comes
        // from blocks no plan reads again, which cost nothing to free now.
        //
        // A prefetch under a plan frees a quarter of that slack. Prefetches
        // run ahead of the reads (a warmed next batch: nearly every fetch
        // of a planned epoch), and what their passes free early costs
        // more than the model's 0.6 × the slack: W9's page file, N =
        // 1,500, fetched 1.03 × the floor at b = 0.75 and 1.03–1.06 × at
        // 0.9 with the whole slack, 1.001 × and 1.01–1.03 × with none
        // (but more passes, 10–25% slower), 1.006–1.008 × and 1.02–1.03 ×
        // with a quarter.
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
            let map = by_blocks.then(|| self.read_map(&key)).flatten();
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
            let clocks = self.read_touch(&key, map.blocks());
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
        let _changing = self.state.changing();
        let freed = self.free(&chosen, &cands, &mut objects, &mut report);
        // Bumped once every map changed is written (and after a failure
        // part-way): a reader that saw the new generation reads the new
        // maps. Bumped before, a reader could take the old map for the
        // new generation and never look again at the blocks freed since.
        self.state.bump_generation();
        freed?;
        Ok(report)
    }

    /// Frees the candidates `chosen` of `cands`: idle objects removed,
    /// blocks of open ones punched (see [`punch`](Self::punch)).
    fn free(
        &self,
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
                    let freed = self.remove_object(&c.key, &objects[&*c.key].found)?;
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
            match self.clear_bits(key, object, &victims) {
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
            durable_fs::sync_parent_dir(&self.map(written[0].0))?;
        }
        for (key, ranges) in written {
            let Some(object) = objects.get_mut(key) else {
                continue;
            };
            let freed = self.punch(key, object, &ranges, report)?;
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
        &self,
        key: &str,
        object: &mut Object,
        victims: &[u64],
    ) -> Result<Option<(Vec<std::ops::Range<u64>>, bool)>> {
        let Some(map) = object.map.as_mut() else {
            return Ok(None);
        };
        let ranges: Vec<std::ops::Range<u64>> =
            victims.iter().map(|&b| map.block_range(b)).collect();
        // A block whose bit is unsynced (written in this boot, never
        // fsynced) needs no durable map to go: a map of before that comes
        // back after a crash holds its bit as another boot's, which every
        // reader drops. Only a durable bit must be durably cleared before
        // its bytes are punched.
        let durable = victims.iter().any(|&b| map.has(b) && !map.is_unsynced(b));
        for &b in victims {
            map.clear(b);
        }
        let map_path = self.map(key);
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
    fn remove_object(&self, key: &str, found: &Found) -> Result<u64> {
        let bytes = self.counted(key, found);
        // The map goes first: a sparse file without a map is only space,
        // never mistaken for fetched blocks.
        durable_fs::remove_and_sync(&self.map(key))?;
        durable_fs::remove_and_sync(&self.sparse(key))?;
        durable_fs::remove_and_sync(&self.touch(key))?;
        durable_fs::remove_and_sync(&self.whole(key))?;
        self.state.sub(bytes);
        self.state.count(Stat::EvictedBytes, bytes);
        Ok(bytes)
    }

    /// Punches the bytes of `ranges` (blocks whose bits
    /// [`clear_bits`](Self::clear_bits) cleared, durably) out of the
    /// sparse copy of `key` (the caller bumps the generation once every
    /// map is written). An idle object left without a block is removed;
    /// one whose file system cannot punch is removed whole when idle (else
    /// only its bits go, its bytes stay counted). Returns the bytes freed.
    fn punch(
        &self,
        key: &str,
        object: &mut Object,
        ranges: &[std::ops::Range<u64>],
        report: &mut EvictReport,
    ) -> Result<u64> {
        let Some(map) = object.map.as_ref() else {
            return Ok(0);
        };
        let sparse = self.sparse(key);
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
                    self.state.sub(unmarked);
                    if !object.open {
                        let gone = self.remove_object(key, &object.found)?;
                        report.evicted += u64::from(gone > 0);
                        return Ok(freed + unmarked + gone);
                    }
                    return Ok(freed + unmarked);
                }
                return Err(Error::io("punch a hole in", &sparse)(e));
            }
            let bytes = units(r.clone());
            freed += bytes;
            self.state.sub(bytes);
            self.state.count(Stat::EvictedBytes, bytes);
            self.state.count(Stat::PunchedBlocks, 1);
            report.punched += 1;
        }
        drop(file);
        if !object.open && map.present() == 0 {
            let gone = self.remove_object(key, &object.found)?;
            report.evicted += u64::from(gone > 0);
            freed += gone;
        }
        Ok(freed)
    }
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
    use std::sync::atomic::Ordering;

    use crate::{RemoteTier, TierConfig};

    /// A tier over a fresh in-memory store, 64 KiB blocks, no read-ahead.
    fn tier(dir: &std::path::Path, budget: u64) -> RemoteTier {
        let mut config = TierConfig::new(dir, budget);
        config.block_size = 64 << 10;
        config.whole_file_max = 64 << 10;
        config.prefetch_blocks = 0;
        let url = format!("memory:///evict-{}", crate::open_files::new_id());
        RemoteTier::open(&url, config).unwrap()
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

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

    #[test]
    fn blocks_share_a_touch_clock_by_group() {
        use crate::local::TOUCH_GROUP;
        let dir = tempfile::tempdir().unwrap();
        let tier = tier(dir.path(), 1 << 30);
        let block = 64u64 << 10;
        let blocks = 2 * TOUCH_GROUP + 8;
        tier.put_bytes("o", bytes((blocks * block) as usize, 3))
            .unwrap();
        let f = tier.open_leased("o", None).unwrap();
        let at = |b: u64| b * block + 5..b * block + 10;
        // Block 0, then 17 (the second group), then 1 (the first again).
        for b in [0, TOUCH_GROUP + 1, 1] {
            drop(f.lease(&[at(b)]).unwrap());
        }
        let key = crate::local::LocalDir::key("o");
        let clocks = tier.inner.dir.read_touch(&key, blocks);
        let (first, second) = (clocks[0], clocks[TOUCH_GROUP as usize]);
        assert!(first > second && second > 0, "{clocks:?}");
        for (b, &c) in clocks.iter().enumerate() {
            let want = match b as u64 / TOUCH_GROUP {
                0 => first,
                1 => second,
                _ => 0,
            };
            assert_eq!(c, want, "block {b}");
        }
        // A clock a group: 8 bytes for each of the three.
        let len = std::fs::metadata(tier.inner.dir.touch(&key)).unwrap().len();
        assert_eq!(len, 8 * 2, "the third group was never touched");
        // Counted: a page of map, of clocks and of extent tree.
        assert_eq!(crate::state::meta_bytes(blocks, 32), 3 * 4096);
        // 1 TiB of 4 KiB blocks: 128 MiB of clocks (2 GiB at 8 bytes a
        // block), beside 64 MiB of map (2 bits a block) and the page.
        let map = crate::state::units(0..512 + 32 + (1 << 26));
        assert_eq!(
            crate::state::meta_bytes(1 << 28, 32),
            map + (128 << 20) + 4096
        );
    }

    #[test]
    fn fetches_within_the_budget_scan_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tier = tier(dir.path(), 1 << 30);
        let data = bytes(4 << 20, 1);
        tier.put_bytes("big", data.clone()).unwrap();
        let f = tier.open_object("big").unwrap();
        let before = tier.inner.dir.scans.load(Ordering::Relaxed);
        let mut buf = vec![0u8; 100];
        for b in 0..64u64 {
            f.read_at(b * (64 << 10) + 7, &mut buf).unwrap();
            assert_eq!(buf, data[(b * (64 << 10) + 7) as usize..][..100]);
        }
        let scans = tier.inner.dir.scans.load(Ordering::Relaxed) - before;
        let stats = tier.stats().unwrap();
        // No scan: the new tier's count was made when it opened.
        assert_eq!(
            (scans, stats.rebuilds),
            (0, 1),
            "64 fetches within the budget"
        );
        assert_eq!(stats.get_requests, 64);
        assert_eq!(stats.fetched_bytes, 4 << 20);
        let usage = tier.local_usage().unwrap();
        assert!(
            stats.allocated >= usage && stats.allocated <= usage + (64 << 10),
            "counted {} for {usage} on disk",
            stats.allocated
        );
    }

    #[test]
    fn a_tier_over_budget_scans_once_per_slack_not_per_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 1 << 20;
        let tier = tier(dir.path(), budget);
        // 48 idle objects of 64 KiB (fetched whole), three budgets' worth.
        let mut fetches = 0u64;
        let mut scans = 0;
        for i in 0..48u8 {
            let name = format!("o{i}");
            let data = bytes(60 << 10, i);
            tier.put_bytes(&name, data.clone()).unwrap();
            let before = tier.inner.dir.scans.load(Ordering::Relaxed);
            let f = tier.open_object(&name).unwrap();
            let mut got = vec![0u8; data.len()];
            f.read_at(0, &mut got).unwrap();
            scans += tier.inner.dir.scans.load(Ordering::Relaxed) - before;
            assert!(got == data);
            fetches += 1;
            let stats = tier.stats().unwrap();
            assert!(stats.allocated <= budget, "{stats:?}");
            assert!(tier.local_usage().unwrap() <= budget);
        }
        // Each pass frees a sixteenth of the budget beyond the fetch (here
        // one more object): one pass per two fetches once full, and none
        // before (the first scan is the count's rebuild).
        assert!(
            scans <= fetches / 2 + 2,
            "{scans} scans for {fetches} fetches"
        );
        let stats = tier.stats().unwrap();
        assert!(
            stats.evicted_bytes > 0 && stats.over_budget == 0,
            "{stats:?}"
        );
    }
}
