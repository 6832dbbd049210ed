//! The node's next use of each planned block: the live plan records
//! (see [`registry`](super::registry)), each decoded and indexed by
//! object and block once per process, and looked up at its registrant's
//! progress. The ranks of a node move in lockstep (their collectives), so
//! their batch indices are one clock, and the node's distance to a block
//! is the minimum over the records of each one's
//! [`BlockUse::distance`].

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::constants::PLANS_DIR;
use crate::plans::record::{BlockUse, NONE, PlanRecord};
use crate::plans::registry::{live_records, read_progress};

/// The node's next use of every planned block: the nearest over the live
/// plan records, each at its own progress, looked up block by block (a
/// record is decoded and indexed once per process, see [`indexed_records`]).
#[derive(Debug, Default)]
pub(crate) struct NextUses {
    /// Each live record's progress and its indexed uses.
    records: Vec<(u64, Arc<Indexed>)>,
}

/// A decoded record, indexed by object and block.
#[derive(Debug)]
struct Indexed {
    objects: HashMap<String, IndexedObject>,
    /// The bytes of the blocks the record reads this epoch.
    epoch_bytes: u64,
}

/// One object's uses in a record.
#[derive(Debug)]
struct IndexedObject {
    /// The block size the block indices count in.
    block_size: u64,
    uses: HashMap<u32, BlockUse>,
    /// The last position any block is read at (this epoch or the next):
    /// past it the record reads the object no more.
    horizon: Option<u64>,
}

impl Indexed {
    fn of(record: PlanRecord) -> Indexed {
        let epoch_bytes = record
            .objects
            .iter()
            .map(|o| {
                let read = o.uses.iter().filter(|u| u.first != NONE).count() as u64;
                read.saturating_mul(o.block_size)
            })
            .fold(0u64, u64::saturating_add);
        let objects = record
            .objects
            .into_iter()
            .map(|o| {
                let horizon = o
                    .uses
                    .iter()
                    .flat_map(|u| [u.last, u.next_first])
                    .filter(|&p| p != NONE)
                    .max()
                    .map(u64::from);
                let uses = o.uses.into_iter().map(|u| (u.block, u)).collect();
                (
                    o.key,
                    IndexedObject {
                        block_size: o.block_size,
                        uses,
                        horizon,
                    },
                )
            })
            .collect();
        Indexed {
            objects,
            epoch_bytes,
        }
    }
}

impl NextUses {
    /// How many batches until `block` of the object `key` is read next,
    /// `None` when no live plan reads it again (see [`ObjectUses`]; the
    /// tier looks an object up once for all its blocks).
    #[cfg(test)]
    pub(crate) fn distance(&self, key: &str, block: u64) -> Option<u64> {
        self.object(key).distance(block)
    }

    /// The uses of the object `key` in every live record, resolved once
    /// for the lookups of its blocks. Block indices count in the block
    /// size of the first record that plans the object (a record of
    /// another block size, made for a copy under another block list, is
    /// left out).
    pub(crate) fn object(&self, key: &str) -> ObjectUses<'_> {
        let mut block_size = None;
        let records = self
            .records
            .iter()
            .filter_map(|(progress, record)| Some((*progress, record.objects.get(key)?)))
            .filter(|(_, o)| *block_size.get_or_insert(o.block_size) == o.block_size)
            .collect();
        ObjectUses { records }
    }

    /// The bytes of the blocks the live plans read this epoch, summed
    /// over the records (a block two records read counts twice: the
    /// ranks of a node read their own samples, and few blocks hold two
    /// ranks' samples).
    pub(crate) fn epoch_bytes(&self) -> u64 {
        self.records
            .iter()
            .map(|(_, r)| r.epoch_bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Whether some live plan reads the object `key` again.
    pub(crate) fn plans(&self, key: &str) -> bool {
        self.records.iter().any(|(progress, record)| {
            record
                .objects
                .get(key)
                .and_then(|o| o.horizon)
                .is_some_and(|h| *progress <= h)
        })
    }

    /// The keys of the objects some live plan reads again.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        let mut keys: Vec<&str> = self
            .records
            .iter()
            .flat_map(|(_, r)| r.objects.keys())
            .map(String::as_str)
            .filter(|k| self.plans(k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
    }
}

/// One object's uses in the live records, each at its record's progress
/// ([`NextUses::object`]).
#[derive(Debug)]
pub(crate) struct ObjectUses<'a> {
    records: Vec<(u64, &'a IndexedObject)>,
}

impl ObjectUses<'_> {
    /// How many batches until `block` is read next: the nearest over the
    /// records, `None` when none reads it again.
    pub(crate) fn distance(&self, block: u64) -> Option<u64> {
        let block = u32::try_from(block).ok()?;
        self.records
            .iter()
            .filter_map(|(progress, o)| o.uses.get(&block)?.distance(*progress))
            .min()
    }
}

/// The next uses the live plan records under `<tier_root>/plans/` give;
/// a record that is unreadable, torn or of another version counts as
/// absent (eviction then falls back to LRU for its blocks), and one whose
/// registrant is gone is removed.
pub(crate) fn next_uses(tier_root: &Path) -> NextUses {
    NextUses {
        records: indexed_records(tier_root),
    }
}

/// Records decoded in this process, by path: their inode and length when
/// read, and their uses. A record is written whole and renamed into
/// place, and only its progress changes after: one of the same inode and
/// length is read again for its progress alone (8 bytes), not decoded.
type Decoded = HashMap<PathBuf, (u64, u64, Arc<Indexed>)>;

fn decoded() -> std::sync::MutexGuard<'static, Decoded> {
    static DECODED: std::sync::OnceLock<Mutex<Decoded>> = std::sync::OnceLock::new();
    DECODED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The progress and uses of the live registrants' records of the tier at
/// `tier_root`, in no order (see [`live_records`]): a record read before
/// is read again for its progress alone, a new or changed one decoded and
/// indexed, one that does not decode left out.
fn indexed_records(tier_root: &Path) -> Vec<(u64, Arc<Indexed>)> {
    let mut records = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    let listed = live_records(tier_root, |path, file| {
        if let Some(found) = indexed(path, file) {
            seen.push(path.to_path_buf());
            records.push(found);
        }
    });
    if listed {
        // Records of this tier that are gone (or no longer read) leave.
        let dir = tier_root.join(PLANS_DIR);
        decoded().retain(|p, _| !p.starts_with(&dir) || seen.contains(p));
    }
    records
}

/// The progress and uses of the live record `file` at `path`, from the
/// records decoded before while its inode and length are unchanged.
fn indexed(path: &Path, file: &File) -> Option<(u64, Arc<Indexed>)> {
    let meta = file.metadata().ok()?;
    let (ino, len) = (meta.ino(), meta.len());
    let known = decoded()
        .get(path)
        .filter(|(i, l, _)| (*i, *l) == (ino, len))
        .map(|(_, _, r)| Arc::clone(r));
    match known {
        Some(indexed) => Some((read_progress(file)?, indexed)),
        None => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &*file, &mut bytes).ok()?;
            let record = PlanRecord::decode(&bytes).ok()?;
            let progress = record.progress;
            let indexed = Arc::new(Indexed::of(record));
            decoded().insert(path.to_path_buf(), (ino, len, Arc::clone(&indexed)));
            Some((progress, indexed))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::plans::record::tests::plan;
    use crate::plans::registry::register;

    /// Set in the environment of the child of
    /// `a_dead_registrants_record_is_removed`: the tier directory.
    const CHILD_ROOT: &str = "REMOTE_TIER_PLAN_CHILD";

    fn records_in(root: &Path) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(root.join(PLANS_DIR))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    #[test]
    fn next_uses_is_the_minimum_over_live_records_each_at_its_progress() {
        let dir = tempfile::tempdir().unwrap();
        let a = register(
            dir.path(),
            vec![plan(
                "k",
                &[(0, 1, 1, NONE), (1, 6, 7, NONE), (2, NONE, NONE, 9)],
            )],
            8,
        )
        .unwrap();
        let b = register(
            dir.path(),
            vec![plan("k", &[(0, 5, 5, NONE), (1, 3, 3, NONE)])],
            8,
        )
        .unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.keys().collect::<Vec<_>>(), ["k"]);
        assert_eq!(
            [0, 1, 2, 3].map(|b| uses.distance("k", b)),
            [Some(1), Some(3), Some(9), None]
        );
        // This epoch a reads blocks 0 and 1, b blocks 0 and 1 (block 2 is
        // a's next epoch only): four blocks of 4 KiB, shared ones twice.
        assert_eq!(uses.epoch_bytes(), 4 * 4096);
        let k = uses.object("k");
        assert_eq!(
            [0, 1, 2, 3].map(|b| k.distance(b)),
            [Some(1), Some(3), Some(9), None]
        );
        assert_eq!(uses.object("absent").distance(0), None);
        a.advance(2).unwrap();
        b.advance(4).unwrap();
        let uses = next_uses(dir.path());
        // a: block 0 is done (next none), block 1 at 6 → 4, block 2 at 9 → 7;
        // b: block 0 at 5 → 1, block 1 is done.
        assert_eq!(
            [0, 1, 2].map(|b| uses.distance("k", b)),
            [Some(1), Some(4), Some(7)]
        );
        drop(a);
        drop(b);
        assert_eq!(next_uses(dir.path()).keys().count(), 0);
        assert!(
            records_in(dir.path()).is_empty(),
            "dropping removes the record"
        );
    }

    #[test]
    fn a_torn_record_of_a_live_registrant_is_ignored_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let handle = register(dir.path(), vec![plan("k", &[(0, 0, 0, NONE)])], 2).unwrap();
        let torn = handle.path().to_path_buf();
        let len = std::fs::metadata(&torn).unwrap().len();
        let live = register(dir.path(), vec![plan("j", &[(3, 1, 1, NONE)])], 2).unwrap();
        // Torn: the tail is gone (a registrant that wrote it some other way).
        File::options()
            .write(true)
            .open(&torn)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.keys().collect::<Vec<_>>(), ["j"]);
        assert_eq!(uses.distance("k", 0), None);
        assert_eq!(uses.distance("j", 3), Some(1));
        assert!(torn.exists(), "a live registrant's record stays");
        drop((handle, live));
    }

    #[test]
    fn a_record_read_before_is_read_again_when_its_bytes_change() {
        let dir = tempfile::tempdir().unwrap();
        let handle = register(dir.path(), vec![plan("k", &[(0, 2, 2, NONE)])], 4).unwrap();
        let path = handle.path().to_path_buf();
        assert_eq!(next_uses(dir.path()).distance("k", 0), Some(2));
        assert!(decoded().contains_key(&path), "indexed once");
        // Only the progress moved: read from the record, not the index.
        handle.advance(1).unwrap();
        assert_eq!(next_uses(dir.path()).distance("k", 0), Some(1));
        handle.advance(3).unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.distance("k", 0), None);
        assert!(!uses.plans("k") && uses.keys().count() == 0, "read no more");
        // Cut in place (same inode): its length tells, and it no longer decodes.
        let len = std::fs::metadata(&path).unwrap().len();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        handle.advance(0).unwrap();
        assert_eq!(next_uses(dir.path()).distance("k", 0), None);
        assert!(
            !decoded().contains_key(&path),
            "a record that no longer decodes leaves"
        );
        drop(handle);
        assert_eq!(next_uses(dir.path()).keys().count(), 0);
    }

    /// The child half of `a_dead_registrants_record_is_removed` (does
    /// nothing unless spawned by it): registers a plan, says so, and
    /// waits to be killed.
    #[test]
    fn registrant_child() {
        let Ok(root) = std::env::var(CHILD_ROOT) else {
            return;
        };
        let _handle = register(Path::new(&root), vec![plan("k", &[(0, 0, 0, 2)])], 2).unwrap();
        println!("\nREGISTERED");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
        // Killed before stdin closes; never drops its handle itself.
        std::thread::sleep(Duration::from_secs(60));
    }

    #[test]
    fn a_dead_registrants_record_is_removed() {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "plans::next_uses::tests::registrant_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ROOT, dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let registered = lines.any(|l| l.is_ok_and(|l| l == "REGISTERED"));
        let live = next_uses(dir.path()).distance("k", 0);
        // SAFETY: kill takes no pointer; the pid is our own child's, not
        // yet waited for.
        let killed = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(registered, "the child registered its plan");
        assert_eq!(killed, 0);
        assert!(!status.success());
        assert_eq!(live, Some(0), "the live child's plan counts");
        assert_eq!(records_in(dir.path()).len(), 1);
        assert_eq!(
            next_uses(dir.path()).keys().count(),
            0,
            "a dead registrant's plan does not"
        );
        assert!(
            records_in(dir.path()).is_empty(),
            "and its record is removed"
        );
    }
}
