//! The lookup pipeline of `get_batch`: the LRU, records not yet flushed,
//! then the index and the segments, in a software pipeline that overlaps
//! the cache misses of a batch's keys.

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tensor_core::Value;

use crate::decode::{Decoded, Row};
use crate::format;
use crate::index::Loc;
use crate::reader::Segment;
use crate::record::part_bytes;
use crate::recover::hint_of;
use crate::state::{Inner, State, note_problem};
use crate::{Error, Result};

/// How many keys each stage of `get_batch`'s lookup
/// pipeline runs behind the stage before it: enough work in between for a
/// cache miss (a few hundred ns) to complete, few enough that the
/// outstanding misses fit the CPU's miss buffers.
const AHEAD: usize = 16;

/// [`SegmentStore::get_batch`](crate::SegmentStore::get_batch): the LRU,
/// records not yet flushed, then the index and segments.
pub(crate) fn get<K: AsRef<str>>(
    inner: &Inner,
    keys: &[K],
) -> Result<(Vec<Option<Value>>, Vec<usize>)> {
    inner.take_bg_error()?;
    let mut out: Vec<Option<Value>> = keys.iter().map(|_| None).collect();
    let use_lru = inner.opts.lru_bytes > 0;
    if use_lru {
        let mut lru = inner.lru.lock();
        for (i, k) in keys.iter().enumerate() {
            out[i] = lru.get(k.as_ref());
        }
        inner.lru_hits.fetch_add(
            out.iter().filter(|o| o.is_some()).count() as u64,
            Ordering::Relaxed,
        );
    }
    if inner.write.is_some() {
        let p = inner.pending.lock();
        if !p.records.is_empty() {
            let mut n = 0;
            for (i, k) in keys.iter().enumerate() {
                if out[i].is_none()
                    && let Some(&j) = p.by_key.get(k.as_ref())
                {
                    out[i] = Some(p.records[j].1.clone());
                    n += 1;
                }
            }
            inner.pending_hits.fetch_add(n, Ordering::Relaxed);
        }
    }
    let mut found: Vec<usize> = Vec::new();
    {
        let st = inner.state.read();
        let hint = hint_of(st.schema.as_ref());
        let structure = hint.unwrap_or(crate::Structure::Tensor);
        let mut n = 0;
        let mut wanted: Vec<usize> = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            if !st.inflight.is_empty() {
                let key = k.as_ref();
                if let Some(r) = st
                    .inflight
                    .iter()
                    .rev()
                    .find_map(|b| b.by_key.get(key).map(|&j| b.records[j].1.clone()))
                {
                    out[i] = Some(r);
                    n += 1;
                    continue;
                }
            }
            wanted.push(i);
        }
        if n > 0 {
            inner.pending_hits.fetch_add(n, Ordering::Relaxed);
        }
        // Random lookups are bound by cache misses, each key's on the
        // one before: its table slot, then its key offset, then its
        // key bytes. A software pipeline keeps every stage `AHEAD`
        // keys behind the one before, so each miss has the work on
        // later keys (hashing, mostly) to hide behind and the misses
        // of the batch overlap.
        let mut hashes: Vec<u64> = Vec::with_capacity(wanted.len());
        let mut first: Vec<Option<(&Segment, &Decoded, Row<'_>)>> =
            Vec::with_capacity(wanted.len());
        let segs = SegmentTable::new(&st.segments, hint, wanted.len());
        let mut hits = 0;
        let total = wanted.len();
        for step in 0..total + 3 * AHEAD {
            // Stage 1: hash, and ask for the table slot.
            if let Some(&i) = wanted.get(step) {
                let h = format::key_hash(keys[i].as_ref());
                st.index.prefetch(h);
                hashes.push(h);
            }
            // Stage 2: read the slot, locate the first candidate's row
            // and ask for its key offset.
            if let Some(&h) = step.checked_sub(AHEAD).and_then(|k| hashes.get(k)) {
                let located = st.index.candidates(h).next().and_then(|loc| {
                    let (seg, d) = segs.get(loc.seg)?;
                    let row = d.row(loc.row as usize)?;
                    d.prefetch_row(&row);
                    Some((seg, d, row))
                });
                first.push(located);
            }
            // Stage 3: ask for the candidate's key bytes.
            if let Some(Some((_, d, row))) = step.checked_sub(2 * AHEAD).and_then(|k| first.get(k))
            {
                d.prefetch_key(row);
            }
            // Stage 4: confirm the key and hand out the record.
            let Some(k) = step.checked_sub(3 * AHEAD).filter(|&k| k < total) else {
                continue;
            };
            let (i, h) = (wanted[k], hashes[k]);
            let key = keys[i].as_ref();
            let noted = |path: &Path, e: Error| note_problem(inner, path, e.to_string());
            let rec = match &first[k] {
                // The common case: the first candidate is the key.
                Some((seg, d, row)) if d.key_of(row) == Some(key) => d
                    .record_of(&seg.path, row, structure)
                    .map_err(|e| noted(&seg.path, e))
                    .ok(),
                // A tag collision or an unreadable segment: walk every
                // candidate.
                _ => lookup(inner, &st, key, h).and_then(|hit| {
                    hit.decoded
                        .record(&hit.segment.path, hit.loc.row as usize, structure)
                        .map_err(|e| noted(&hit.segment.path, e))
                        .ok()
                }),
            };
            if let Some(r) = rec {
                out[i] = Some(r);
                hits += 1;
                if use_lru {
                    found.push(i);
                }
            }
        }
        inner.segment_hits.fetch_add(hits, Ordering::Relaxed);
    }
    warm(&out);
    if use_lru && !found.is_empty() {
        let mut lru = inner.lru.lock();
        for &i in &found {
            if let Some(r) = &out[i] {
                lru.put(keys[i].as_ref(), r);
            }
        }
    }
    let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
    inner
        .misses
        .fetch_add(missing.len() as u64, Ordering::Relaxed);
    Ok((out, missing))
}

/// A key found in a segment.
pub(crate) struct Hit {
    loc: Loc,
    segment: Arc<Segment>,
    decoded: Arc<Decoded>,
}

/// The indexed location of `key` (hash `hash`), confirmed against the
/// segment's key column.
pub(crate) fn lookup(inner: &Inner, st: &State, key: &str, hash: u64) -> Option<Hit> {
    let hint = hint_of(st.schema.as_ref());
    for loc in st.index.candidates(hash) {
        let Some(seg) = st.segments.get(&loc.seg) else {
            continue;
        };
        match seg.decoded(hint) {
            Ok(d) => {
                if d.key(loc.row as usize) == Some(key) {
                    return Some(Hit {
                        loc,
                        segment: seg.clone(),
                        decoded: d,
                    });
                }
            }
            Err(e) => note_problem(
                inner,
                &seg.path,
                format!("excluded, its keys read as missing: {e}"),
            ),
        }
    }
    None
}

/// Bytes of a batch's tensors that `get_batch` asks the CPU
/// to bring into its caches before returning (about half an L2 cache).
const WARM_BYTES: usize = 512 << 10;

/// A segment of a [`SegmentTable`] and its decoded columns (`None` when
/// it is absent or unreadable).
type Resolved<'a> = Option<(&'a Segment, Arc<Decoded>)>;

/// The segments one `get_batch` call reads, resolved and decoded once per
/// segment rather than once per key, and held (mapped) until the call
/// returns: a table indexed by id when the ids span not much more than the
/// keys asked for, slots taken in order of first use otherwise.
struct SegmentTable<'a> {
    map: &'a BTreeMap<u32, Arc<Segment>>,
    hint: Option<crate::Structure>,
    /// Smallest segment id.
    base: u32,
    /// Whether `cells` is indexed by `id - base`.
    dense: bool,
    /// Each resolved once: the segment and its decoded columns (`None`
    /// when it is absent or unreadable).
    cells: Vec<OnceCell<Resolved<'a>>>,
    /// Sparse: the cell of each id met so far.
    sparse: RefCell<HashMap<u32, usize>>,
}

impl<'a> SegmentTable<'a> {
    /// A table for at most `lookups` calls of [`SegmentTable::get`].
    fn new(
        map: &'a BTreeMap<u32, Arc<Segment>>,
        hint: Option<crate::Structure>,
        lookups: usize,
    ) -> SegmentTable<'a> {
        let (base, span) = match (map.first_key_value(), map.last_key_value()) {
            (Some((&lo, _)), Some((&hi, _))) => (lo, (hi - lo) as usize + 1),
            _ => (0, 0),
        };
        let dense = span <= lookups.saturating_mul(4);
        let cells = std::iter::repeat_with(OnceCell::new)
            .take(if dense { span } else { lookups })
            .collect();
        SegmentTable {
            map,
            hint,
            base,
            dense,
            cells,
            sparse: RefCell::new(HashMap::new()),
        }
    }

    fn get(&self, id: u32) -> Option<(&'a Segment, &Decoded)> {
        let cell = if self.dense {
            self.cells.get(id.checked_sub(self.base)? as usize)?
        } else {
            let mut sparse = self.sparse.borrow_mut();
            let next = sparse.len();
            let i = *sparse.entry(id).or_insert(next);
            // More ids than lookups cannot happen; the caller's slow path
            // finds such a key anyway.
            self.cells.get(i)?
        };
        let (seg, d) = cell
            .get_or_init(|| {
                let seg = self.map.get(&id)?;
                let d = seg.decoded(self.hint).ok()?;
                Some((&**seg, d))
            })
            .as_ref()?;
        Some((*seg, &**d))
    }
}

/// Asks the CPU to fetch the bytes of the batch's records, up to
/// [`WARM_BYTES`], in one tight pass: the caller reads them next, and
/// requests issued back to back overlap their misses far better than the
/// caller's pass, which waits for each record's first lines in turn.
fn warm(out: &[Option<Value>]) {
    let mut budget = WARM_BYTES;
    for rec in out.iter().flatten() {
        let mut each = |bytes: &[u8]| {
            let n = bytes.len().min(budget);
            budget -= n;
            crate::index::prefetch_lines(&bytes[..n]);
        };
        match rec {
            Value::Dict(parts) => parts
                .iter()
                .filter_map(|(_, p)| part_bytes(p))
                .for_each(&mut each),
            Value::Tuple(parts) | Value::List(parts) => {
                parts.iter().filter_map(part_bytes).for_each(&mut each)
            }
            Value::Tensor(_) | Value::Blob(_) => part_bytes(rec).into_iter().for_each(&mut each),
        }
        if budget == 0 {
            return;
        }
    }
}
