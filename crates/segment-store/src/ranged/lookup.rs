//! [`SegmentStore::get_batch_ranged`]: `get_batch` over a cache whose
//! segments are not all whole on local disk (a cache in object storage,
//! its segments fetched on demand). Keys found in whole segments take the
//! usual lookup; the others are read row by row through byte ranges
//! (see the `ranged` module), a segment's rows in one pass, the segments at
//! once. A segment that only a whole read can read (see
//! [`Layout::open`]) is made whole and read as usual.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use durable_fs::Pool;
use tensor_core::Value;

use super::{Layout, RangedRow, SegmentRanges};
use crate::Result;
use crate::format;
use crate::lookup;
use crate::reader::Segment;
use crate::record::Structure;
use crate::recover::hint_of;
use crate::state::{Inner, State};
use crate::store::SegmentStore;

/// A key to read through ranges: its position in the call and its
/// candidate locations (segment, row), the index's order.
struct Far {
    i: usize,
    candidates: Vec<(Arc<Segment>, usize)>,
}

/// The segment of `key`'s newest location the index knows, and its row
/// there (by the index alone: a hash's first candidate whose segment is
/// live).
fn newest<'a>(st: &'a State, key: &str) -> Option<(&'a Arc<Segment>, usize)> {
    let h = format::key_hash(key);
    st.index
        .candidates(h)
        .find_map(|loc| Some((st.segments.get(&loc.seg)?, loc.row as usize)))
}

impl SegmentStore {
    /// The segment files that hold `keys` (each key's newest location),
    /// in the order the keys first need them, each once: what a reader
    /// that knows its next reads fetches ahead (a key not found adds
    /// nothing).
    pub fn segment_files_of<K: AsRef<str>>(&self, keys: &[K]) -> Vec<std::path::PathBuf> {
        let st = self.inner().state.read();
        let mut seen = std::collections::HashSet::new();
        let mut files = Vec::new();
        for k in keys {
            if let Some((seg, _)) = newest(&st, k.as_ref())
                && seen.insert(seg.id)
            {
                files.push(seg.path.clone());
            }
        }
        files
    }

    /// The id of the segment that holds each of `keys` (its newest
    /// location, by the index alone: no segment is read), `None` for a
    /// key in no segment. Ids grow with the order segments were written,
    /// so keys of one segment are rows written together: what a sampler
    /// keeps in one block of its shuffle.
    pub fn segment_ids_of<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Option<u32>> {
        let st = self.inner().state.read();
        keys.iter()
            .map(|k| newest(&st, k.as_ref()).map(|(seg, _)| seg.id))
            .collect()
    }

    /// Where the record of each of `keys` lies, for a plan of reads: the
    /// segment file that holds it (its newest location) and the byte
    /// ranges reading its row reads there, exactly (its offsets and the
    /// bytes they bound; the whole file for a segment only a whole read
    /// reads). `None` for a key in no segment. Each segment's layout is
    /// read once (through `src`, as
    /// [`get_batch_ranged`](Self::get_batch_ranged) reads it, and kept),
    /// then the rows' offsets (what their reads read first), the segments
    /// at once; no record is read.
    #[allow(clippy::type_complexity)]
    pub fn row_spans_of<K: AsRef<str>>(
        &self,
        keys: &[K],
        src: &dyn SegmentRanges,
    ) -> Result<Vec<Option<(std::path::PathBuf, Vec<std::ops::Range<u64>>)>>> {
        let inner = self.inner();
        let (hint, located) = {
            let st = inner.state.read();
            let located: Vec<Option<(Arc<Segment>, usize)>> = keys
                .iter()
                .map(|k| newest(&st, k.as_ref()).map(|(seg, row)| (Arc::clone(seg), row)))
                .collect();
            (hint_of(st.schema.as_ref()), located)
        };
        // Each segment's keys (their positions in the call) and rows.
        let mut segments: BTreeMap<u32, (Arc<Segment>, Vec<usize>, Vec<usize>)> = BTreeMap::new();
        for (i, (seg, row)) in located
            .into_iter()
            .enumerate()
            .filter_map(|(i, l)| Some((i, l?)))
        {
            let entry = segments
                .entry(seg.id)
                .or_insert_with(|| (seg, Vec::new(), Vec::new()));
            entry.1.push(i);
            entry.2.push(row);
        }
        let segments: Vec<(Arc<Segment>, Vec<usize>, Vec<usize>)> =
            segments.into_values().collect();
        let spans = Pool::new(SEGMENTS_AT_ONCE).try_map(&segments, |(seg, _, rows)| {
            Ok(match layout(inner, seg, src, hint)? {
                Some(l) => l.spans_at(&seg.path, src, rows)?,
                None => vec![vec![0..seg.file_len()]; rows.len()],
            })
        })?;
        let mut out: Vec<Option<(std::path::PathBuf, Vec<std::ops::Range<u64>>)>> =
            keys.iter().map(|_| None).collect();
        for ((seg, at, _), spans) in segments.iter().zip(spans) {
            for (&i, s) in at.iter().zip(spans) {
                out[i] = Some((seg.path.clone(), s));
            }
        }
        Ok(out)
    }

    /// [`get_batch`](SegmentStore::get_batch) where `src` says which
    /// segments are whole locally and reads byte ranges of the others: a
    /// key whose segment is not whole costs the ranges its row needs
    /// (and, once per segment, its footer and batch metadata), never the
    /// whole segment. Records come back owned, not as views. Errors
    /// fetching bytes, and segments found corrupt on the way, are errors
    /// of the call (the usual path reads such keys as missing).
    pub fn get_batch_ranged<K: AsRef<str>>(
        &self,
        keys: &[K],
        src: &dyn SegmentRanges,
    ) -> Result<(Vec<Option<Value>>, Vec<usize>)> {
        let inner = self.inner();
        inner.take_bg_error()?;
        if src.all_local() {
            return lookup::get(inner, keys);
        }
        let mut far: Vec<Far> = Vec::new();
        let mut near: Vec<usize> = Vec::new();
        let hint;
        {
            let st = inner.state.read();
            hint = hint_of(st.schema.as_ref());
            let mut local: HashMap<u32, bool> = HashMap::new();
            for (i, k) in keys.iter().enumerate() {
                let h = format::key_hash(k.as_ref());
                // Whether a candidate lies in a segment not local, before
                // anything is collected: a key of local segments only (every
                // key, once the cache is warm) costs no allocation here.
                let remote = st.index.candidates(h).any(|loc| {
                    st.segments.get(&loc.seg).is_some_and(|seg| {
                        !*local
                            .entry(seg.id)
                            .or_insert_with(|| src.is_local(&seg.path))
                    })
                });
                if remote {
                    let candidates: Vec<(Arc<Segment>, usize)> = st
                        .index
                        .candidates(h)
                        .filter_map(|loc| {
                            let seg = st.segments.get(&loc.seg)?;
                            Some((Arc::clone(seg), loc.row as usize))
                        })
                        .collect();
                    far.push(Far { i, candidates });
                } else {
                    near.push(i);
                }
            }
        }
        if far.is_empty() {
            return lookup::get(inner, keys);
        }
        let mut out: Vec<Option<Value>> = keys.iter().map(|_| None).collect();
        let mut usual = near;
        // Records not yet in a segment, and those read before, come first,
        // as in the usual lookup.
        far.retain(|f| match unflushed(inner, keys[f.i].as_ref()) {
            Some(v) => {
                out[f.i] = Some(v);
                false
            }
            None => true,
        });
        let structure = hint.unwrap_or(Structure::Tensor);
        // Each key's first candidate, by segment: one pass per segment.
        let mut by_segment: BTreeMap<u32, (Arc<Segment>, Vec<usize>)> = BTreeMap::new();
        for (n, f) in far.iter().enumerate() {
            if let Some((seg, _)) = f.candidates.first() {
                by_segment
                    .entry(seg.id)
                    .or_insert_with(|| (Arc::clone(seg), Vec::new()))
                    .1
                    .push(n);
            }
        }
        let groups: Vec<&(Arc<Segment>, Vec<usize>)> = by_segment.values().collect();
        let read = |(seg, members): &(Arc<Segment>, Vec<usize>)| {
            let rows: Vec<usize> = members.iter().map(|&n| far[n].candidates[0].1).collect();
            read_rows(inner, seg, &rows, src, hint, structure)
        };
        let passes = Pool::new(SEGMENTS_AT_ONCE).try_map(&groups, |g| read(g))?;
        let mut found: Vec<usize> = Vec::new();
        let mut collided: Vec<usize> = Vec::new();
        for ((_, members), pass) in by_segment.values().zip(passes) {
            match pass {
                Pass::Whole => usual.extend(members.iter().map(|&n| far[n].i)),
                Pass::Rows(rows) => {
                    for (&n, (key, record)) in members.iter().zip(rows) {
                        let i = far[n].i;
                        if key.as_deref() == Some(keys[i].as_ref()) {
                            out[i] = Some(record?);
                            found.push(i);
                        } else {
                            collided.push(n);
                        }
                    }
                }
            }
        }
        // A tag shared with another key (rare): the other candidates, one
        // by one.
        for n in collided {
            let f = &far[n];
            for (seg, row) in &f.candidates[1..] {
                match read_rows(inner, seg, &[*row], src, hint, structure)? {
                    Pass::Whole => {
                        usual.push(f.i);
                        break;
                    }
                    Pass::Rows(mut rows) => {
                        if let Some((key, record)) = rows.pop()
                            && key.as_deref() == Some(keys[f.i].as_ref())
                        {
                            out[f.i] = Some(record?);
                            found.push(f.i);
                            break;
                        }
                    }
                }
            }
        }
        if !usual.is_empty() {
            usual.sort_unstable();
            let asked: Vec<&str> = usual.iter().map(|&i| keys[i].as_ref()).collect();
            let (got, _) = lookup::get(inner, &asked)?;
            for (&i, v) in usual.iter().zip(got) {
                out[i] = v;
            }
        }
        inner
            .segment_hits
            .fetch_add(found.len() as u64, Ordering::Relaxed);
        if inner.opts.lru_bytes > 0 && !found.is_empty() {
            let mut lru = inner.lru.lock();
            for &i in &found {
                if let Some(r) = &out[i] {
                    lru.put(keys[i].as_ref(), r);
                }
            }
        }
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        let far_missing = far.iter().filter(|f| out[f.i].is_none()).count();
        inner
            .misses
            .fetch_add(far_missing as u64, Ordering::Relaxed);
        Ok((out, missing))
    }
}

/// Segments read through ranges at once by one call: each waits on its
/// requests, so a few threads keep many in flight (the tier fetches the
/// blocks of each in parallel too).
const SEGMENTS_AT_ONCE: usize = 8;

/// What reading rows of one segment came to.
enum Pass {
    /// Each row's key and record.
    Rows(Vec<RangedRow>),
    /// The segment is read whole (by the usual lookup).
    Whole,
}

/// Reads `rows` of `seg`: through ranges when it is not whole locally and
/// its layout and the reader allow, else [`Pass::Whole`] (made whole now
/// when it was not).
fn read_rows(
    inner: &Inner,
    seg: &Segment,
    rows: &[usize],
    src: &dyn SegmentRanges,
    hint: Option<Structure>,
    structure: Structure,
) -> Result<Pass> {
    if src.is_local(&seg.path) {
        return Ok(Pass::Whole);
    }
    match layout(inner, seg, src, hint)? {
        Some(l) if !src.read_whole(&seg.path, rows.len(), l.rows()) => {
            Ok(Pass::Rows(l.rows_at(&seg.path, src, rows, structure)?))
        }
        _ => {
            // Made whole and decoded here, so that a failed fetch is this
            // call's error, as on the ranged path (the usual lookup would
            // read its keys as missing), and segments are fetched at once.
            seg.decoded(hint)?;
            Ok(Pass::Whole)
        }
    }
}

/// The layout of `seg`, read once per segment and kept with the store.
fn layout(
    inner: &Inner,
    seg: &Segment,
    src: &dyn SegmentRanges,
    hint: Option<Structure>,
) -> Result<Option<Arc<Layout>>> {
    if let Some(l) = inner.layouts.lock().get(&seg.id)
        && l.as_ref().is_none_or(|l| l.file_len() == seg.file_len())
    {
        return Ok(l.clone());
    }
    let l = Layout::open(&seg.path, seg.file_len(), src, hint)?.map(Arc::new);
    let mut layouts = inner.layouts.lock();
    // Segments compacted away leave: the map holds only live ids.
    let live = inner.state.read();
    layouts.retain(|id, _| live.segments.contains_key(id));
    layouts.insert(seg.id, l.clone());
    Ok(l)
}

/// A record the usual lookup would answer before any segment: read before
/// (the LRU), or put and not yet in a segment.
fn unflushed(inner: &Inner, key: &str) -> Option<Value> {
    if inner.opts.lru_bytes > 0
        && let Some(v) = inner.lru.lock().get(key)
    {
        inner.lru_hits.fetch_add(1, Ordering::Relaxed);
        return Some(v);
    }
    if inner.write.is_some()
        && let Some(v) = {
            let p = inner.pending.lock();
            p.by_key.get(key).map(|&j| p.records[j].1.clone())
        }
    {
        inner.pending_hits.fetch_add(1, Ordering::Relaxed);
        return Some(v);
    }
    let st = inner.state.read();
    let v = st
        .inflight
        .iter()
        .rev()
        .find_map(|b| b.by_key.get(key).map(|&j| b.records[j].1.clone()))?;
    inner.pending_hits.fetch_add(1, Ordering::Relaxed);
    Some(v)
}
