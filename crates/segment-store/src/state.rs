//! The state of one opened store, shared by its handle, its flush thread
//! and its lookups.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use tensor_core::Value;

use durable_fs::FileLock;
use parking_lot::{Mutex, RwLock};

use crate::format;
use crate::index::KeyIndex;
use crate::lru::Lru;
use crate::options::Options;
use crate::reader::{Segment, SegmentMaps};
use crate::recover::LogCursor;
use crate::schema::RecordSchema;
use crate::writer::IndexLog;
use crate::{Error, Result};
use cache_check::{Problem, ProblemKind};

/// Records of one flush, readable until their segment is indexed.
pub(crate) struct Batch {
    pub(crate) records: Vec<(String, Value)>,
    pub(crate) by_key: HashMap<String, usize>,
}

/// Records put and not yet handed to a flush.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) records: Vec<(String, Value)>,
    pub(crate) by_key: HashMap<String, usize>,
}

/// What lookups read: the schema, the index and the segments.
pub(crate) struct State {
    pub(crate) schema: Option<RecordSchema>,
    pub(crate) index: KeyIndex,
    pub(crate) segments: BTreeMap<u32, Arc<Segment>>,
    /// Batches handed to a flush and not yet committed (or failed).
    pub(crate) inflight: Vec<Arc<Batch>>,
}

/// What only the writer has: its index log and the next segment id.
pub(crate) struct WriteSide {
    pub(crate) log: IndexLog,
    pub(crate) next_id: u32,
    /// The multi-writer id, whose residue class the ids stay in.
    pub(crate) writer: Option<u32>,
}

impl WriteSide {
    /// Takes the next segment id.
    pub(crate) fn take_id(&mut self, dir: &Path) -> Result<u32> {
        let id = self.next_id;
        let next = match self.writer {
            Some(w) => format::next_writer_segment(w, Some(id)),
            None => id.checked_add(1),
        };
        self.next_id = next.ok_or_else(|| {
            Error::InvalidInput(format!(
                "{}: segment ids exhausted; run compact()",
                dir.display()
            ))
        })?;
        Ok(id)
    }
}

/// Everything of one opened store: what the handle, its flush thread and
/// its lookups share.
pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    pub(crate) opts: Options,
    /// The segments' live mappings.
    pub(crate) maps: Arc<SegmentMaps>,
    pub(crate) state: RwLock<State>,
    pub(crate) pending: Mutex<Pending>,
    pub(crate) write: Option<Mutex<WriteSide>>,
    /// Held while a caller takes pending records and writes their
    /// segments (the default mode), so segments commit in id order.
    pub(crate) preparing: Mutex<()>,
    pub(crate) lru: Mutex<Lru>,
    /// The layouts of segments read through byte ranges, by id (`None`:
    /// read whole).
    pub(crate) layouts: Mutex<HashMap<u32, Option<Arc<crate::ranged::Layout>>>>,
    pub(crate) bg_error: Mutex<Option<Error>>,
    pub(crate) problems: Mutex<Vec<Problem>>,
    /// Where this handle stopped reading each other index log.
    pub(crate) cursors: Mutex<BTreeMap<PathBuf, LogCursor>>,
    /// Whether the cache has writer logs (or this handle writes one).
    pub(crate) multi: AtomicBool,
    pub(crate) lru_hits: AtomicU64,
    pub(crate) pending_hits: AtomicU64,
    pub(crate) segment_hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) _locks: Vec<FileLock>,
}

impl Inner {
    /// The first error the flush thread hit since the last call, once.
    pub(crate) fn take_bg_error(&self) -> Result<()> {
        match self.bg_error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

pub(crate) fn note_problem(inner: &Inner, path: &Path, detail: String) {
    let mut p = inner.problems.lock();
    if !p.iter().any(|q| q.path == path && q.detail == detail) {
        p.push(Problem {
            path: path.to_path_buf(),
            kind: ProblemKind::Structure,
            detail,
        });
    }
}
