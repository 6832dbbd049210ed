//! Stages 3–4 of a ranged read: rows of a segment from their offsets
//! and the bytes those bound, each checked as it is read.

use std::ops::Range;
use std::path::Path;

use tensor_core::{DType, Shape, SharedBytes, SharedTensor, Value};

use super::layout::{At, BatchAt, Bytes, Layout, PartAt, TensorAt};
use super::source::{SegmentRanges, read};
use crate::record::Structure;
use crate::{Error, Result};

/// A row read through ranges: its key (`None` when null) and its record.
pub type RangedRow = (Option<String>, Result<Value>);

/// Stages 3–4 planned for some rows of a segment: stage 3 read (each
/// row's validity bytes and offsets), stage 4's ranges asked for (the
/// bytes those offsets bound), and which reads of each stage are each
/// row's.
struct Planned {
    /// Stage 4's ranges, of every row.
    second: Reads,
    /// Per row: its key's read in stage 4 (`None`: a null key), its parts'
    /// spans, and its segment row.
    spans: Vec<(Option<usize>, Vec<Result<PartSpan>>, usize)>,
    /// Stage 3's ranges, of every row.
    first: Reads,
    /// Per row: its reads among stage 3's and stage 4's ranges.
    owned: Vec<(Range<usize>, Range<usize>)>,
}

impl Layout {
    /// of `src`: each row's key and record. An error reading a key (bad
    /// offsets, not UTF-8) fails the call; an error in a record is that
    /// row's, so a row read only to be told apart from another key by its
    /// key does not fail the others.
    pub fn rows_at(
        &self,
        path: &Path,
        src: &dyn SegmentRanges,
        rows: &[usize],
        structure: Structure,
    ) -> Result<Vec<RangedRow>> {
        let bad = |detail: String| Error::corrupt(path, detail);
        let Planned { second, spans, .. } = self.plan(path, src, rows, false)?;
        let got = read(path, src, &second.ranges)?;
        let mut out = Vec::with_capacity(spans.len());
        for (key, parts, row) in spans {
            let key = match key {
                None => None,
                Some(i) => Some(
                    String::from_utf8(got[i].clone())
                        .map_err(|e| bad(format!("row {row}: key is not UTF-8: {e}")))?,
                ),
            };
            let record = parts
                .into_iter()
                .zip(&self.parts)
                .map(|(span, p)| part_value(path, row, p, span?, &got))
                .collect::<Result<Vec<Value>>>()
                .and_then(|values| self.assemble(path, values, structure));
            out.push((key, record));
        }
        Ok(out)
    }

    /// Where the bytes of each of `rows` lie in the file, exactly: the
    /// ranges [`rows_at`](Self::rows_at) reads for it (its validity bytes
    /// and offsets, then the key, blobs and tensors those bound), sorted
    /// and merged. What a plan of reads needs; it reads each row's offsets
    /// (stage 3 of a read) to find them. A part found corrupt spans its
    /// offsets only (reading it is the error).
    pub fn spans_at(
        &self,
        path: &Path,
        src: &dyn SegmentRanges,
        rows: &[usize],
    ) -> Result<Vec<Vec<Range<u64>>>> {
        // Many rows of a batch: their offsets touch, one read a run.
        let planned = self.plan(path, src, rows, true)?;
        Ok(planned
            .owned
            .iter()
            .map(|(first, second)| {
                let spans: Vec<Range<u64>> = planned.first.ranges[first.clone()]
                    .iter()
                    .chain(&planned.second.ranges[second.clone()])
                    .filter(|r| r.end > r.start)
                    .cloned()
                    .collect();
                runs_of(&spans).0
            })
            .collect())
    }

    /// Stage 3 of reading `rows` (read; its touching ranges as one when
    /// `coalesce`) and stage 4 (asked for).
    fn plan(
        &self,
        path: &Path,
        src: &dyn SegmentRanges,
        rows: &[usize],
        coalesce: bool,
    ) -> Result<Planned> {
        let bad = |detail: String| Error::corrupt(path, detail);
        let located: Vec<(&BatchAt, usize, usize)> = rows
            .iter()
            .map(|&row| {
                let (b, r) = self
                    .locate(row)
                    .ok_or_else(|| bad(format!("row {row} beyond {} rows", self.rows)))?;
                Ok((b, r, row))
            })
            .collect::<Result<_>>()?;
        // Stage 3: each column's validity byte and offsets of every row.
        let mut first = Reads::default();
        let mut firsts = Vec::with_capacity(located.len());
        let plans: Vec<RowPlan> = located
            .iter()
            .map(|&(b, r, _)| {
                let from = first.ranges.len();
                let key = first.bounds(b, self.key.at, r, width(self.key.large));
                let parts = self
                    .parts
                    .iter()
                    .map(|p| match p {
                        PartAt::Blob(c) => PartPlan::Blob(first.bounds(b, c.at, r, width(c.large))),
                        PartAt::Tensor(t) => PartPlan::Tensor(
                            first.bounds(b, t.data, r, 4),
                            first.bounds(b, t.shape, r, 4),
                        ),
                    })
                    .collect();
                firsts.push(from..first.ranges.len());
                RowPlan { key, parts }
            })
            .collect();
        let got = if coalesce {
            read_coalesced(path, src, &first.ranges)?
        } else {
            read(path, src, &first.ranges)?
        };
        // Stage 4: the bytes each row's offsets bound.
        let mut second = Reads::default();
        let mut spans = Vec::with_capacity(plans.len());
        let mut owned = Vec::with_capacity(plans.len());
        for ((plan, &(b, r, row)), first_reads) in plans.iter().zip(&located).zip(firsts) {
            let from = second.ranges.len();
            let key = second
                .values(b, &self.key, &plan.key, &got, r, row)
                .map_err(&bad)?;
            let parts: Vec<Result<PartSpan>> = self
                .parts
                .iter()
                .zip(&plan.parts)
                .map(|(p, pp)| match (p, pp) {
                    (PartAt::Blob(c), PartPlan::Blob(bounds)) => second
                        .values(b, c, bounds, &got, r, row)
                        .map(PartSpan::Blob)
                        .map_err(&bad),
                    (PartAt::Tensor(t), PartPlan::Tensor(data, shape)) => {
                        second.tensor(b, t, data, shape, &got, r, row).map_err(&bad)
                    }
                    _ => Err(bad("a part planned as another kind".into())),
                })
                .collect();
            owned.push((first_reads, from..second.ranges.len()));
            spans.push((key, parts, row));
        }
        Ok(Planned {
            second,
            spans,
            first,
            owned,
        })
    }

    /// A record from its parts, shaped as the full read shapes it
    /// (`Decoded::record_of`).
    fn assemble(&self, path: &Path, mut parts: Vec<Value>, structure: Structure) -> Result<Value> {
        let structure = match (self.schema.structure, structure) {
            (Structure::Tuple, Structure::List) => Structure::List,
            (s, _) => s,
        };
        Ok(match structure {
            Structure::Tensor => match parts.pop() {
                Some(t @ Value::Tensor(_)) => t,
                _ => return Err(Error::corrupt(path, "tensor record without a tensor")),
            },
            Structure::Blob => match parts.pop() {
                Some(b @ Value::Blob(_)) => b,
                _ => return Err(Error::corrupt(path, "blob record without a blob")),
            },
            Structure::Dict => Value::Dict(self.names.iter().cloned().zip(parts).collect()),
            Structure::Tuple => Value::Tuple(parts),
            Structure::List => Value::List(parts),
        })
    }
}

/// The runs `ranges` make (overlapping and touching ones as one, in
/// order) and each range's run (an index into them).
fn runs_of(ranges: &[Range<u64>]) -> (Vec<Range<u64>>, Vec<usize>) {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_unstable_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut runs: Vec<Range<u64>> = Vec::new();
    let mut run_of = vec![0usize; ranges.len()];
    for i in order {
        let r = &ranges[i];
        match runs.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => runs.push(r.clone()),
        }
        run_of[i] = runs.len() - 1;
    }
    (runs, run_of)
}

/// [`read`] of `ranges` where overlapping and touching ones are read as
/// one range, each answer cut out of its run's.
fn read_coalesced(
    path: &Path,
    src: &dyn SegmentRanges,
    ranges: &[Range<u64>],
) -> Result<Vec<Vec<u8>>> {
    let (runs, run_of) = runs_of(ranges);
    let got = read(path, src, &runs)?;
    Ok(ranges
        .iter()
        .zip(run_of)
        .map(|(r, k)| {
            let at = (r.start - runs[k].start) as usize;
            got[k][at..at + (r.end - r.start) as usize].to_vec()
        })
        .collect())
}

fn width(large: bool) -> u64 {
    if large { 8 } else { 4 }
}

/// The ranges one stage asks for.
#[derive(Default)]
struct Reads {
    ranges: Vec<Range<u64>>,
}

/// Where a row's bounds in one column are among a stage's reads: its
/// validity byte (when the column has nulls) and its two offsets.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    validity: Option<usize>,
    offsets: usize,
    width: u64,
}

struct RowPlan {
    key: Bounds,
    parts: Vec<PartPlan>,
}

enum PartPlan {
    Blob(Bounds),
    Tensor(Bounds, Bounds),
}

/// Where a row's values are among the second stage's reads.
enum PartSpan {
    Blob(Option<usize>),
    Tensor { elements: ElementSpan, dims: usize },
}

/// A tensor's elements: `count` elements from bit `bit` of read `read`
/// (bool tensors), or the bytes of read `read`.
enum ElementSpan {
    Bytes(usize),
    Bits { read: usize, bit: u64, count: u64 },
}

impl Reads {
    fn add(&mut self, r: Range<u64>) -> usize {
        self.ranges.push(r);
        self.ranges.len() - 1
    }

    /// Asks for row `r`'s validity byte (if the array has nulls) and its
    /// two offsets (`width` bytes each) in the array at `at` of batch `b`.
    /// The batch's buffers were checked to hold every row's offsets.
    fn bounds(&mut self, b: &BatchAt, at: At, r: usize, width: u64) -> Bounds {
        let r = r as u64;
        let validity = (b.nodes[at.node].1 > 0).then(|| {
            let (off, _) = b.buffers[at.buffer];
            self.add(b.body + off + r / 8..b.body + off + r / 8 + 1)
        });
        let (off, _) = b.buffers[at.buffer + 1];
        let start = b.body + off + r * width;
        let offsets = self.add(start..start + 2 * width);
        Bounds {
            validity,
            offsets,
            width,
        }
    }

    /// Asks for the values of a string or binary column's row, bounded by
    /// the offsets read: `None` for a null.
    fn values(
        &mut self,
        b: &BatchAt,
        c: &Bytes,
        bounds: &Bounds,
        got: &[Vec<u8>],
        r: usize,
        row: usize,
    ) -> std::result::Result<Option<usize>, String> {
        if is_null(bounds, got, r) {
            if !c.nullable {
                return Err(format!("row {row}: null in column {:?}", c.name));
            }
            return Ok(None);
        }
        let (data_off, data_len) = b.buffers[c.at.buffer + 2];
        let (start, end) = offsets(bounds, got, data_len, &c.name, row)?;
        Ok(Some(
            self.add(b.body + data_off + start..b.body + data_off + end),
        ))
    }

    /// Asks for a tensor row's elements and dims.
    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &mut self,
        b: &BatchAt,
        t: &TensorAt,
        data: &Bounds,
        shape: &Bounds,
        got: &[Vec<u8>],
        r: usize,
        row: usize,
    ) -> std::result::Result<PartSpan, String> {
        if is_null(data, got, r) || is_null(shape, got, r) {
            return Err(format!("row {row}: null tensor in column {:?}", t.name));
        }
        // The child arrays: node after the list's, buffers after its two.
        let (child_len, child_nulls) = b.nodes[t.data.node + 1];
        if child_nulls > 0 {
            return Err(format!("column {:?} holds null elements", t.name));
        }
        let (start, end) = offsets(data, got, child_len, &t.name, row)?;
        let (values_off, _) = b.buffers[t.data.buffer + 3];
        let base = b.body + values_off;
        let elements = if t.dtype == DType::Bool {
            if start == end {
                ElementSpan::Bits {
                    read: self.add(base..base),
                    bit: 0,
                    count: 0,
                }
            } else {
                ElementSpan::Bits {
                    read: self.add(base + start / 8..base + end.div_ceil(8)),
                    bit: start % 8,
                    count: end - start,
                }
            }
        } else {
            let size = t.dtype.size() as u64;
            ElementSpan::Bytes(self.add(base + start * size..base + end * size))
        };
        let shape_name = format!("{} shape", t.name);
        let (dims_len, _) = b.nodes[t.shape.node + 1];
        let (s0, s1) = offsets(shape, got, dims_len, &shape_name, row)?;
        let (dims_off, _) = b.buffers[t.shape.buffer + 3];
        let dims = self.add(b.body + dims_off + s0 * 8..b.body + dims_off + s1 * 8);
        Ok(PartSpan::Tensor { elements, dims })
    }
}

/// Whether the row's validity bit, where read, says null.
fn is_null(bounds: &Bounds, got: &[Vec<u8>], r: usize) -> bool {
    bounds
        .validity
        .is_some_and(|v| got[v][0] & (1 << (r % 8)) == 0)
}

/// The row's two offsets, checked: in order, and within `limit` (the
/// values' bytes, or the child array's length).
fn offsets(
    bounds: &Bounds,
    got: &[Vec<u8>],
    limit: u64,
    column: &str,
    row: usize,
) -> std::result::Result<(u64, u64), String> {
    let bytes = &got[bounds.offsets];
    let (a, b) = if bounds.width == 8 {
        let a = i64::from_le_bytes(bytes[..8].try_into().map_err(|_| "short offsets")?);
        let b = i64::from_le_bytes(bytes[8..16].try_into().map_err(|_| "short offsets")?);
        (a, b)
    } else {
        let a = i32::from_le_bytes(bytes[..4].try_into().map_err(|_| "short offsets")?);
        let b = i32::from_le_bytes(bytes[4..8].try_into().map_err(|_| "short offsets")?);
        (i64::from(a), i64::from(b))
    };
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) if a <= b && b <= limit => Ok((a, b)),
        _ => Err(format!(
            "row {row}: offsets {a}..{b} of column {column:?} decrease or lie outside its {limit} values"
        )),
    }
}

/// A part's value from the bytes read for it.
fn part_value(
    path: &Path,
    row: usize,
    p: &PartAt,
    span: PartSpan,
    got: &[Vec<u8>],
) -> Result<Value> {
    match (p, span) {
        (PartAt::Blob(c), PartSpan::Blob(read)) => match read {
            Some(i) => Ok(Value::Blob(SharedBytes::from(got[i].clone()))),
            None => Err(Error::corrupt(
                path,
                format!("row {row}: null in column {:?}", c.name),
            )),
        },
        (PartAt::Tensor(t), PartSpan::Tensor { elements, dims }) => {
            let dims: Vec<i64> = got[dims]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            if let Some(d) = dims.iter().find(|&&d| d < 0) {
                return Err(Error::corrupt(
                    path,
                    format!("row {row}: negative dimension {d} in column {:?}", t.name),
                ));
            }
            if let Some(rank) = t.rank
                && dims.len() != rank
            {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "row {row}: rank {} in column {:?}, schema says {rank}",
                        dims.len(),
                        t.name
                    ),
                ));
            }
            let shape = Shape::new(dims.iter().map(|&d| d as usize));
            let bytes = match elements {
                ElementSpan::Bytes(i) => got[i].clone(),
                ElementSpan::Bits { read, bit, count } => (0..count)
                    .map(|k| {
                        let at = bit + k;
                        (got[read][(at / 8) as usize] >> (at % 8)) & 1
                    })
                    .collect(),
            };
            let tensor =
                SharedTensor::new(t.dtype, shape, SharedBytes::from(bytes)).map_err(|source| {
                    Error::Tensor {
                        path: path.to_path_buf(),
                        row,
                        column: t.name.clone(),
                        source,
                    }
                })?;
            Ok(Value::Tensor(tensor))
        }
        _ => Err(Error::corrupt(path, "a part read as another kind")),
    }
}
