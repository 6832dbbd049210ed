//! Lazy sequence utilities over anything with a length and random access
//! (loadit's `SequenceView`, `ConcatableSequence`, `InterleaveSequences`,
//! `RepeatSequence` and `chunk_shuffle`).

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::format::StoreItem;
use crate::shards::Item;
use crate::store::ShardStore;

/// A sequence with a length and random access by index.
pub trait RandomAccess {
    /// What `get` returns.
    type Item;

    /// The number of items ([`Error::Unbounded`] for endless sequences).
    fn length(&self) -> Result<usize>;

    /// The item at `index` ([`Error::IndexOutOfRange`] past the end).
    fn at(&self, index: usize) -> Result<Self::Item>;

    /// The item at `index`, negative indices counting from the end.
    fn at_signed(&self, index: i64) -> Result<Self::Item> {
        if index >= 0 {
            return self.at(index as usize);
        }
        let len = self.length()?;
        let back = usize::try_from(index.unsigned_abs()).unwrap_or(usize::MAX);
        match len.checked_sub(back) {
            Some(i) => self.at(i),
            None => Err(Error::IndexOutOfRange { index, len }),
        }
    }
}

fn out_of_range<T>(index: usize, len: usize) -> Result<T> {
    Err(Error::IndexOutOfRange {
        index: i64::try_from(index).unwrap_or(i64::MAX),
        len,
    })
}

impl<T: Clone> RandomAccess for [T] {
    type Item = T;
    fn length(&self) -> Result<usize> {
        Ok(<[T]>::len(self))
    }
    fn at(&self, index: usize) -> Result<T> {
        match <[T]>::get(self, index) {
            Some(x) => Ok(x.clone()),
            None => out_of_range(index, <[T]>::len(self)),
        }
    }
}

impl<T: Clone> RandomAccess for Vec<T> {
    type Item = T;
    fn length(&self) -> Result<usize> {
        Ok(Vec::len(self))
    }
    fn at(&self, index: usize) -> Result<T> {
        self.as_slice()
            .get(index)
            .cloned()
            .map_or_else(|| out_of_range(index, Vec::len(self)), Ok)
    }
}

impl<R: RandomAccess + ?Sized> RandomAccess for &R {
    type Item = R::Item;
    fn length(&self) -> Result<usize> {
        (**self).length()
    }
    fn at(&self, index: usize) -> Result<R::Item> {
        (**self).at(index)
    }
}

impl<R: RandomAccess + ?Sized> RandomAccess for Arc<R> {
    type Item = R::Item;
    fn length(&self) -> Result<usize> {
        (**self).length()
    }
    fn at(&self, index: usize) -> Result<R::Item> {
        (**self).at(index)
    }
}

impl<R: RandomAccess + ?Sized> RandomAccess for Box<R> {
    type Item = R::Item;
    fn length(&self) -> Result<usize> {
        (**self).length()
    }
    fn at(&self, index: usize) -> Result<R::Item> {
        (**self).at(index)
    }
}

impl<T: StoreItem> RandomAccess for ShardStore<T> {
    type Item = Item<T>;
    fn length(&self) -> Result<usize> {
        let n = ShardStore::len(self)?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
    fn at(&self, index: usize) -> Result<Item<T>> {
        ShardStore::get(self, i64::try_from(index).unwrap_or(i64::MAX))
    }
}

/// How a [`SequenceView`] maps its indices to the underlying sequence.
#[derive(Clone)]
pub enum Indices {
    /// Item `i` of the view is item `list[i]` of the sequence.
    List(Arc<[usize]>),
    /// Item `i` (below `len`) of the view is item `f(i)` of the sequence.
    Fn {
        /// The index map.
        f: Arc<dyn Fn(usize) -> usize + Send + Sync>,
        /// The view's length.
        len: usize,
    },
    /// `start, start + step, …` (`len` items): a slice of the sequence.
    Range {
        /// First index.
        start: usize,
        /// Distance between indices.
        step: usize,
        /// Number of items.
        len: usize,
    },
}

impl std::fmt::Debug for Indices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Indices::List(l) => write!(f, "List({} indices)", <[usize]>::len(l)),
            Indices::Fn { len, .. } => write!(f, "Fn {{ len: {len} }}"),
            Indices::Range { start, step, len } => write!(f, "Range({start}, {step}, {len})"),
        }
    }
}

impl Indices {
    fn len(&self) -> usize {
        match self {
            Indices::List(l) => <[usize]>::len(l),
            Indices::Fn { len, .. } | Indices::Range { len, .. } => *len,
        }
    }

    fn map(&self, i: usize) -> Option<usize> {
        if i >= self.len() {
            return None;
        }
        Some(match self {
            Indices::List(l) => l[i],
            Indices::Fn { f, .. } => f(i),
            Indices::Range { start, step, .. } => start + step * i,
        })
    }
}

/// A lazy view of a sequence through an index list or index function.
/// Views of views compose (`view.view(...)`).
#[derive(Debug, Clone)]
pub struct SequenceView<S> {
    seq: S,
    indices: Indices,
}

impl<S: RandomAccess> SequenceView<S> {
    /// Item `i` of the view is item `indices[i]` of `seq`.
    pub fn new(seq: S, indices: impl Into<Arc<[usize]>>) -> SequenceView<S> {
        SequenceView {
            seq,
            indices: Indices::List(indices.into()),
        }
    }

    /// Item `i < len` of the view is item `f(i)` of `seq`.
    pub fn from_fn(
        seq: S,
        len: usize,
        f: impl Fn(usize) -> usize + Send + Sync + 'static,
    ) -> SequenceView<S> {
        SequenceView {
            seq,
            indices: Indices::Fn {
                f: Arc::new(f),
                len,
            },
        }
    }

    /// The slice `range` of `seq` taking every `step`-th item (Python's
    /// `seq[start:stop:step]` with non-negative bounds).
    pub fn slice(seq: S, range: std::ops::Range<usize>, step: usize) -> Result<SequenceView<S>> {
        if step == 0 {
            return Err(Error::InvalidOption {
                option: "step",
                reason: "must be positive".into(),
            });
        }
        let end = range.end.min(seq.length()?);
        let len = end.saturating_sub(range.start).div_ceil(step);
        Ok(SequenceView {
            seq,
            indices: Indices::Range {
                start: range.start,
                step,
                len,
            },
        })
    }

    /// A view of this view.
    pub fn view(self, indices: impl Into<Arc<[usize]>>) -> SequenceView<SequenceView<S>> {
        SequenceView::new(self, indices)
    }

    /// The underlying sequence.
    pub fn inner(&self) -> &S {
        &self.seq
    }
}

impl<S: RandomAccess> RandomAccess for SequenceView<S> {
    type Item = S::Item;
    fn length(&self) -> Result<usize> {
        Ok(self.indices.len())
    }
    fn at(&self, index: usize) -> Result<S::Item> {
        match self.indices.map(index) {
            Some(j) => self.seq.at(j),
            None => out_of_range(index, self.indices.len()),
        }
    }
}

/// Where [`concat_locate`] sends an index of a concatenation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcatStep {
    /// Item `offset` of part `part`, whose length is known to exceed it.
    At {
        /// The part.
        part: usize,
        /// The index within the part.
        offset: usize,
    },
    /// Item `offset` of part `part`, whose length is not known yet: read it,
    /// and if the part is too short learn its length and locate again.
    Probe {
        /// The part.
        part: usize,
        /// The index within the part.
        offset: usize,
    },
    /// Past the end of every part.
    OutOfRange,
}

/// The index arithmetic of a lazy concatenation of `parts` sequences, of
/// which `known_len(k)` gives the lengths learnt so far. Shared by
/// [`Concat`] and the Python binding, so both place an index alike.
pub fn concat_locate(
    parts: usize,
    known_len: impl Fn(usize) -> Option<usize>,
    index: usize,
) -> ConcatStep {
    let mut i = index;
    for part in 0..parts {
        match known_len(part) {
            Some(l) if i >= l => i -= l,
            Some(_) => return ConcatStep::At { part, offset: i },
            None => return ConcatStep::Probe { part, offset: i },
        }
    }
    ConcatStep::OutOfRange
}

/// Sequences one after another. Lengths of the parts are asked for only
/// when needed (a part's length may be costly: a store drives its source).
pub struct Concat<S> {
    parts: Vec<S>,
    lens: Vec<OnceLock<usize>>,
}

impl<S: RandomAccess> Concat<S> {
    /// Concatenates `parts`.
    pub fn new(parts: Vec<S>) -> Concat<S> {
        let lens = parts.iter().map(|_| OnceLock::new()).collect();
        Concat { parts, lens }
    }

    fn part_len(&self, k: usize) -> Result<usize> {
        if let Some(&l) = self.lens[k].get() {
            return Ok(l);
        }
        let l = self.parts[k].length()?;
        Ok(*self.lens[k].get_or_init(|| l))
    }
}

impl<S: RandomAccess> RandomAccess for Concat<S> {
    type Item = S::Item;
    fn length(&self) -> Result<usize> {
        let mut total = 0usize;
        for k in 0..self.parts.len() {
            total = total.saturating_add(self.part_len(k)?);
        }
        Ok(total)
    }
    fn at(&self, index: usize) -> Result<S::Item> {
        loop {
            match concat_locate(self.parts.len(), |k| self.lens[k].get().copied(), index) {
                ConcatStep::At { part, offset } => return self.parts[part].at(offset),
                ConcatStep::Probe { part, offset } => match self.parts[part].at(offset) {
                    Err(Error::IndexOutOfRange { .. }) => {
                        self.part_len(part)?;
                    }
                    other => return other,
                },
                ConcatStep::OutOfRange => {
                    let len = self.length()?;
                    return out_of_range(index, len);
                }
            }
        }
    }
}

/// The index arithmetic of a round-robin interleave: item `i` of the
/// interleave is item `offset` of part `part`. When the shorter parts run
/// out the rest continue in turn (`[a0, b0, a1, b1, b2, b3]` for lengths 2
/// and 4). Shared by [`Interleave`] and the Python binding.
#[derive(Debug, Clone)]
pub struct InterleaveIndex {
    /// Phases: (first index of the phase, offset within each part, parts active).
    phases: Vec<(usize, usize, Vec<usize>)>,
    len: usize,
}

impl InterleaveIndex {
    /// The interleave of parts of lengths `lens`.
    pub fn new(lens: &[usize]) -> InterleaveIndex {
        let mut levels: Vec<usize> = lens.to_vec();
        levels.sort_unstable();
        levels.dedup();
        let mut phases = Vec::new();
        let (mut first, mut offset) = (0usize, 0usize);
        for level in levels {
            let active: Vec<usize> = (0..lens.len()).filter(|&k| lens[k] > offset).collect();
            if active.is_empty() || level == offset {
                continue;
            }
            phases.push((first, offset, active.clone()));
            first += (level - offset) * active.len();
            offset = level;
        }
        InterleaveIndex { phases, len: first }
    }

    /// The total length (the sum of the parts').
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether every part is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(part, offset)` of item `index`, `None` past the end.
    pub fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let p = self.phases.partition_point(|(first, _, _)| *first <= index) - 1;
        let (first, offset, active) = &self.phases[p];
        let rel = index - first;
        Some((active[rel % active.len()], offset + rel / active.len()))
    }
}

/// Round-robin over several sequences; when the shorter ones run out the
/// rest continue in turn (`[a0, b0, a1, b1, b2, b3]` for lengths 2 and 4).
pub struct Interleave<S> {
    parts: Vec<S>,
    index: InterleaveIndex,
}

impl<S: RandomAccess> Interleave<S> {
    /// Interleaves `parts` (their lengths are read now).
    pub fn new(parts: Vec<S>) -> Result<Interleave<S>> {
        let lens = parts
            .iter()
            .map(|p| p.length())
            .collect::<Result<Vec<_>>>()?;
        Ok(Interleave {
            index: InterleaveIndex::new(&lens),
            parts,
        })
    }
}

impl<S: RandomAccess> RandomAccess for Interleave<S> {
    type Item = S::Item;
    fn length(&self) -> Result<usize> {
        Ok(self.index.len())
    }
    fn at(&self, index: usize) -> Result<S::Item> {
        match self.index.locate(index) {
            Some((part, offset)) => self.parts[part].at(offset),
            None => out_of_range(index, self.index.len()),
        }
    }
}

/// A sequence repeated `n` times, or forever.
pub struct Repeat<S> {
    seq: S,
    times: Option<usize>,
}

impl<S: RandomAccess> Repeat<S> {
    /// `seq` repeated `times` times.
    pub fn new(seq: S, times: usize) -> Repeat<S> {
        Repeat {
            seq,
            times: Some(times),
        }
    }

    /// `seq` repeated forever (`len` is [`Error::Unbounded`]).
    pub fn forever(seq: S) -> Repeat<S> {
        Repeat { seq, times: None }
    }
}

impl<S: RandomAccess> RandomAccess for Repeat<S> {
    type Item = S::Item;
    fn length(&self) -> Result<usize> {
        match self.times {
            Some(t) => Ok(self.seq.length()?.saturating_mul(t)),
            None => Err(Error::Unbounded),
        }
    }
    fn at(&self, index: usize) -> Result<S::Item> {
        let n = self.seq.length()?;
        match repeat_index(index, n, self.times) {
            Some(i) => self.seq.at(i),
            None => out_of_range(index, self.length()?),
        }
    }
}

/// The index arithmetic of a sequence of length `len` repeated `times`
/// times (forever when `None`): item `index` is item `repeat_index(..)` of
/// the sequence, `None` past the end. Shared by [`Repeat`] and the Python
/// binding.
pub fn repeat_index(index: usize, len: usize, times: Option<usize>) -> Option<usize> {
    if len == 0 || times.is_some_and(|t| index / len >= t) {
        return None;
    }
    Some(index % len)
}

/// A view of `seq` shuffled within consecutive chunks of `chunk_size`
/// items (the whole sequence when `None`), over its first `length` items
/// (all when `None`). Deterministic for a `seed`, on every platform.
pub fn chunk_shuffle<S: RandomAccess>(
    seq: S,
    chunk_size: Option<usize>,
    length: Option<usize>,
    seed: u64,
) -> Result<SequenceView<S>> {
    let length = match length {
        Some(l) => l,
        None => seq.length()?,
    };
    let chunk = chunk_size.unwrap_or(length).max(1);
    Ok(SequenceView::new(
        seq,
        chunk_shuffle_indices(chunk, length, seed),
    ))
}

/// The permutation used by [`chunk_shuffle`]: each chunk
/// `[k*chunk, (k+1)*chunk)` (and the shorter last one) is permuted in place.
pub fn chunk_shuffle_indices(chunk_size: usize, length: usize, seed: u64) -> Vec<usize> {
    let chunk = chunk_size.max(1);
    let mut rng = SplitMix64(seed);
    let mut out: Vec<usize> = (0..length).collect();
    for block in out.chunks_mut(chunk) {
        rng.shuffle(block);
    }
    out
}

/// A block-shuffled permutation of `0..blocks.iter().sum()`: the blocks
/// (runs of consecutive indices of the given sizes) in a random order,
/// the indices within each block shuffled (the order a sampling plan
/// reads a store in: consecutive indices come from one block). One
/// Fisher-Yates pass over the blocks and one over each block's indices;
/// deterministic for a `seed`, on every platform.
pub fn block_shuffle_indices(blocks: &[usize], seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut starts = Vec::with_capacity(blocks.len());
    let mut total = 0usize;
    for &size in blocks {
        starts.push(total);
        total += size;
    }
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    rng.shuffle(&mut order);
    let mut out = Vec::with_capacity(total);
    for b in order {
        let at = out.len();
        out.extend(starts[b]..starts[b] + blocks[b]);
        rng.shuffle(&mut out[at..]);
    }
    out
}

/// A tiny, stable PRNG (SplitMix64) so shuffles never change with a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fisher-Yates, as [`chunk_shuffle_indices`] draws it.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

impl<T: StoreItem> ShardStore<T> {
    /// A lazy view of the items at `indices` (loadit's `store[[i, j, k]]`).
    pub fn view(&self, indices: impl Into<Arc<[usize]>>) -> SequenceView<ShardStore<T>> {
        SequenceView::new(self.clone(), indices)
    }

    /// A lazy slice `store[start:stop:step]` as in Python: negative bounds
    /// count from the end (which needs the length), `None` is the end.
    pub fn slice(
        &self,
        start: i64,
        stop: Option<i64>,
        step: usize,
    ) -> Result<SequenceView<ShardStore<T>>> {
        let resolve = |i: i64| -> Result<usize> {
            if i >= 0 {
                return Ok(usize::try_from(i).unwrap_or(usize::MAX));
            }
            let len = RandomAccess::length(self)?;
            Ok(len.saturating_sub(usize::try_from(i.unsigned_abs()).unwrap_or(usize::MAX)))
        };
        let a = resolve(start)?;
        let b = match stop {
            Some(s) => resolve(s)?,
            None => RandomAccess::length(self)?,
        };
        SequenceView::slice(self.clone(), a..b, step)
    }
}
