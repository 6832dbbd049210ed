//! The flush pipeline: pending records become segments, built and
//! written by the call that filled them (or, with `async_write`, by the
//! flush thread), then made durable, logged (the commit point) and made
//! visible by the flush thread, in id order.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use tensor_core::Value;

use parking_lot::Mutex;

use crate::format::{self, SCHEMA_FILE};
use crate::index::Loc;
use crate::reader::Segment;
use crate::recover::hint_of;
use crate::schema::{RecordSchema, to_schema_json};
use crate::state::{Batch, Inner, Pending, State, WriteSide};
use crate::writer::{Unsynced, build_batch, split_runs, write_segment_data};
use crate::{Error, Result};

/// What the flush thread is handed.
enum Job {
    /// Build, write and commit a batch (`async_write`).
    Write(Arc<Batch>),
    /// Commit segments the caller wrote (the default mode).
    Commit(Prepared),
    /// Answer once everything handed before is done.
    Barrier(SyncSender<()>),
}

/// A batch's segments, written (not yet durable) in the order they commit.
struct Prepared {
    batch: Arc<Batch>,
    runs: Vec<Written>,
}

/// One segment of a batch: its id, its rows, its unsynced file.
struct Written {
    id: u32,
    rows: std::ops::Range<usize>,
    file: Unsynced,
}

/// A writer's flush thread.
pub(crate) struct Background {
    tx: SyncSender<Job>,
    handle: JoinHandle<()>,
}

impl Background {
    /// Starts the flush thread of a writer.
    pub(crate) fn spawn(inner: &Arc<Inner>) -> Result<Background> {
        // The default mode hands over one written segment at a time: the
        // send waits until the thread is done with the one before.
        let depth = if inner.opts.async_write {
            inner.opts.queue_depth.max(1)
        } else {
            0
        };
        let (tx, rx) = sync_channel(depth);
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("segment-store-flush".into())
            .spawn(move || background(worker, rx))
            .map_err(Error::io("spawn flush thread", &inner.dir))?;
        Ok(Background { tx, handle })
    }

    /// Lets the thread finish what it was handed, and waits for it.
    pub(crate) fn stop(self) {
        drop(self.tx);
        let _ = self.handle.join();
    }
}

/// [`SegmentStore::put_batch`](crate::SegmentStore::put_batch): checks
/// `items` against the schema, then pends them (or, on a rank that does
/// not persist, keeps them in the LRU) and hands every full run to a flush.
pub(crate) fn put<K: AsRef<str>>(
    inner: &Inner,
    bg: Option<&Background>,
    items: &[(K, Value)],
) -> Result<()> {
    inner.take_bg_error()?;
    if inner.opts.read_only {
        return Err(Error::ReadOnly {
            path: inner.dir.clone(),
            op: "put_batch",
        });
    }
    let Some((first_key, first)) = items.first() else {
        return Ok(());
    };
    let current = inner.state.read().schema.clone();
    let (schema, fresh) = match current {
        Some(s) => (s, false),
        None => (RecordSchema::infer(first), true),
    };
    if fresh {
        schema.check(first_key.as_ref(), first)?;
    }
    for (k, r) in items {
        schema.check(k.as_ref(), r)?;
    }
    if fresh {
        let mut st = inner.state.write();
        if st.schema.is_none() {
            if let Some(write) = &inner.write {
                let multi = write.lock().writer.is_some();
                write_schema(&inner.dir, &schema, multi)?;
            }
            st.schema = Some(schema);
        } else if let Some(s) = &st.schema {
            // Another thread fixed the schema meanwhile: check against it.
            for (k, r) in items {
                s.check(k.as_ref(), r)?;
            }
        }
    }
    if inner.opts.lru_bytes > 0 {
        let mut lru = inner.lru.lock();
        if inner.write.is_none() {
            // A rank that does not persist keeps its records only here.
            for (k, r) in items {
                lru.put(k.as_ref(), r);
            }
        } else if lru.len() > 0 {
            // The writer's records are found among the pending ones,
            // then in their segment: the LRU, filled by reads, only
            // forgets the values these replace.
            for (k, _) in items {
                lru.remove(k.as_ref());
            }
        }
    }
    if inner.write.is_none() {
        return Ok(());
    }
    let full = {
        let mut p = inner.pending.lock();
        for (k, r) in items {
            let i = p.records.len();
            p.records.push((k.as_ref().to_owned(), r.clone()));
            p.by_key.insert(k.as_ref().to_owned(), i);
        }
        p.records.len() >= inner.opts.flush_every
    };
    if full {
        hand_off(inner, bg, false)?;
    }
    Ok(())
}

/// Hands pending records to a flush: every full `flush_every` run, and
/// the remainder too when `all`.
pub(crate) fn hand_off(inner: &Inner, bg: Option<&Background>, all: bool) -> Result<()> {
    let Some(write) = &inner.write else {
        return Ok(());
    };
    let every = inner.opts.flush_every;
    let Some(bg) = bg else {
        return Ok(());
    };
    let stopped =
        || Error::io("hand off flush", &inner.dir)(std::io::Error::other("flush thread stopped"));
    if inner.opts.async_write {
        let mut p = inner.pending.lock();
        while p.records.len() >= every || (all && !p.records.is_empty()) {
            let batch = take_batch(&mut p, every);
            inner.state.write().inflight.push(batch.clone());
            if bg.tx.send(Job::Write(batch)).is_err() {
                return Err(stopped());
            }
        }
        Ok(())
    } else {
        // The caller builds and writes each full run's segment (the
        // disk starts on its bytes at once) while the thread commits
        // the one before.
        let _order = inner.preparing.lock();
        loop {
            let batch = {
                let mut p = inner.pending.lock();
                if !(p.records.len() >= every || (all && !p.records.is_empty())) {
                    return Ok(());
                }
                let batch = take_batch(&mut p, every);
                inner.state.write().inflight.push(batch.clone());
                batch
            };
            let prepared = prepare(inner, write, batch)?;
            if bg.tx.send(Job::Commit(prepared)).is_err() {
                return Err(stopped());
            }
            // The thread took it, so it is done with the segment
            // before: report that one's error now.
            inner.take_bg_error()?;
        }
    }
}

/// [`SegmentStore::flush`](crate::SegmentStore::flush): hands off every
/// pending record and waits until the flush thread has committed them.
pub(crate) fn flush(inner: &Inner, bg: Option<&Background>) -> Result<()> {
    inner.take_bg_error()?;
    hand_off(inner, bg, true)?;
    if let Some(bg) = bg {
        let (tx, rx) = sync_channel(1);
        if bg.tx.send(Job::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
    inner.take_bg_error()
}

/// Takes up to `every` pending records as one batch.
fn take_batch(p: &mut Pending, every: usize) -> Arc<Batch> {
    let n = p.records.len().min(every);
    if n == p.records.len() {
        // Everything pending (the common case: batches that add up to
        // `every`): the key map moves with the records, and the next
        // pending run starts with room for a whole segment (up to 64k
        // records: `flush_every` may be far larger).
        let room = every.min(1 << 16);
        let records = std::mem::replace(&mut p.records, Vec::with_capacity(room));
        let by_key = std::mem::replace(&mut p.by_key, HashMap::with_capacity(room));
        return Arc::new(Batch { records, by_key });
    }
    let records: Vec<(String, Value)> = p.records.drain(..n).collect();
    let rest: Vec<(String, Value)> = std::mem::take(&mut p.records);
    p.by_key.clear();
    for (i, (k, r)) in rest.into_iter().enumerate() {
        p.by_key.insert(k.clone(), i);
        p.records.push((k, r));
    }
    let by_key = records
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.clone(), i))
        .collect();
    Arc::new(Batch { records, by_key })
}

/// Builds, writes and commits one batch (`async_write`'s thread).
fn persist(inner: &Inner, write: &Mutex<WriteSide>, batch: Arc<Batch>) -> Result<()> {
    commit(inner, write, prepare(inner, write, batch)?)
}

/// Builds and writes the segment(s) of `batch`, not yet durable. On
/// failure the batch leaves the in-flight list and nothing stays on disk.
fn prepare(inner: &Inner, write: &Mutex<WriteSide>, batch: Arc<Batch>) -> Result<Prepared> {
    let mut runs = Vec::new();
    match prepare_runs(inner, write, &batch, &mut runs) {
        Ok(()) => Ok(Prepared { batch, runs }),
        Err(e) => {
            runs.into_iter().for_each(|w| w.file.discard());
            retire(inner, &batch);
            Err(e)
        }
    }
}

fn prepare_runs(
    inner: &Inner,
    write: &Mutex<WriteSide>,
    batch: &Batch,
    runs: &mut Vec<Written>,
) -> Result<()> {
    let schema = inner
        .state
        .read()
        .schema
        .clone()
        .ok_or_else(|| Error::InvalidInput("flush before any schema".into()))?;
    for rows in split_runs(&batch.records, &schema) {
        // A run that fails to build leaves its id unused: ids need not be
        // dense.
        let id = write.lock().take_id(&inner.dir)?;
        let rb = build_batch(&schema, &batch.records[rows.clone()]).map_err(|e| Error::Arrow {
            path: format::segment_path(&inner.dir, id),
            source: e,
        })?;
        let file = write_segment_data(&inner.dir, id, &rb)?;
        runs.push(Written { id, rows, file });
    }
    Ok(())
}

/// Makes the prepared segments durable, appends their index groups (the
/// commit point) and makes them visible; then the batch leaves the
/// in-flight list, committed or not.
fn commit(inner: &Inner, write: &Mutex<WriteSide>, prepared: Prepared) -> Result<()> {
    let Prepared { batch, runs } = prepared;
    let mut runs = runs.into_iter();
    let mut result = Ok(());
    for w in runs.by_ref() {
        result = commit_run(inner, write, &batch, w);
        if result.is_err() {
            break;
        }
    }
    runs.for_each(|w| w.file.discard());
    retire(inner, &batch);
    result
}

fn retire(inner: &Inner, batch: &Arc<Batch>) {
    inner
        .state
        .write()
        .inflight
        .retain(|b| !Arc::ptr_eq(b, batch));
}

fn commit_run(inner: &Inner, write: &Mutex<WriteSide>, batch: &Batch, w: Written) -> Result<()> {
    let Written { id, rows, file } = w;
    let records = &batch.records[rows];
    let path = format::segment_path(&inner.dir, id);
    let (len, content) = (file.len, file.content);
    file.commit()?;
    let hashes: Vec<u64> = records.iter().map(|(k, _)| format::key_hash(k)).collect();
    if let Err(e) = write
        .lock()
        .log
        .append(&format::encode_group(id, len, content, &hashes))
    {
        // Uncommitted: remove it so a later open does not index it.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    let seg = Arc::new(Segment::open(&path, id, &inner.maps)?);
    let mut st = inner.state.write();
    let State {
        index,
        segments,
        schema,
        ..
    } = &mut *st;
    let hint = hint_of(schema.as_ref());
    segments.insert(id, seg);
    for (row, (key, _)) in records.iter().enumerate() {
        if let Some(&ahead) = hashes.get(row + 16) {
            index.prefetch(ahead);
        }
        let loc = Loc {
            seg: id,
            row: row as u32,
        };
        index.insert(hashes[row], loc, |old| {
            if old.seg == id {
                records[old.row as usize].0 == *key
            } else {
                segments
                    .get(&old.seg)
                    .and_then(|s| s.decoded(hint).ok())
                    .and_then(|d| d.key(old.row as usize).map(|k| k == key))
                    .unwrap_or(false)
            }
        });
    }
    Ok(())
}

/// Writes `schema.json` for the first record. A multi-writer may race
/// others doing the same: it builds the file under a name of its own, and
/// when another writer's schema is already there it checks against it
/// instead.
fn write_schema(dir: &Path, schema: &RecordSchema, multi: bool) -> Result<()> {
    let path = dir.join(SCHEMA_FILE);
    let json = to_schema_json(schema);
    if !multi {
        return durable_fs::write_atomic(&path, json.as_bytes()).map_err(Error::durable);
    }
    if let Ok(text) = crate::schema::read_schema_text(&path)
        && let Ok(theirs) = crate::schema::parse_schema_json(&text)
    {
        if &theirs != schema {
            return Err(Error::SchemaMismatch {
                key: String::new(),
                field: "schema.json".into(),
                detail: format!(
                    "{}: another writer fixed a different schema: {text}",
                    path.display()
                ),
            });
        }
        return Ok(());
    }
    durable_fs::write_atomic_shared(&path, json.as_bytes()).map_err(Error::durable)
}

fn background(inner: Arc<Inner>, rx: Receiver<Job>) {
    for job in rx {
        match job {
            Job::Write(batch) => {
                let Some(write) = &inner.write else {
                    continue;
                };
                let records = batch.records.len();
                if let Err(e) = persist(&inner, write, batch) {
                    note_bg_error(&inner, records, e);
                }
            }
            Job::Commit(prepared) => {
                let Some(write) = &inner.write else {
                    continue;
                };
                let records = prepared.batch.records.len();
                if let Err(e) = commit(&inner, write, prepared) {
                    note_bg_error(&inner, records, e);
                }
            }
            Job::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Keeps the first error of the flush thread for the next call.
fn note_bg_error(inner: &Inner, records: usize, e: Error) {
    let mut slot = inner.bg_error.lock();
    if slot.is_none() {
        *slot = Some(Error::Background {
            records,
            source: Box::new(e),
        });
    }
}
