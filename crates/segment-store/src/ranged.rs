//! Reading single rows of a segment through byte ranges, without the
//! whole file: for segments that live elsewhere (object storage) and are
//! fetched on demand.
//!
//! A segment is an Arrow IPC file: magic, the schema message, one record
//! batch message (its metadata, then its body of buffers), the footer and
//! its length. A row needs little of it:
//!
//! 1. the file's tail: the footer (schema, where each batch is);
//! 2. each batch's metadata (its field nodes and where each buffer lies
//!    in its body) and the file's magic;
//! 3. per row, the two offsets that bound it in each offset buffer (and
//!    its validity byte, where a column has nulls);
//! 4. per row, the bytes those offsets bound: the key, each tensor's
//!    elements and dims, each blob.
//!
//! Stages 1–2 happen once per segment ([`Layout::open`]); 3–4 once per
//! batch of rows ([`Layout::rows`]), every range of a stage asked for at
//! once. What the full decode validates for a whole batch is checked here
//! for what a row reads: the footer, the batch metadata (every buffer
//! inside its body and long enough for its field node), both offsets of
//! the row within their buffer (in order, inside the values), the key's
//! UTF-8, no null where the schema allows none, each tensor's dims
//! against its elements. Files this path does not know (dictionaries,
//! compression, types segments never hold) are left to the full read.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_ipc::reader::read_footer_length;
use arrow_schema::{DataType, Schema};
use tensor_core::{DType, Shape, SharedBytes, SharedTensor, Value};

use crate::options::BoxError;
use crate::record::Structure;
use crate::schema::{PartKind, RecordSchema};
use crate::validate::plain_type;
use crate::{Error, Result};

/// Byte ranges of segment files that are not whole on local disk.
pub trait SegmentRanges: Sync {
    /// Whether the segment at `path` is whole locally: the store then maps
    /// and reads it as usual.
    fn is_local(&self, path: &Path) -> bool;

    /// The bytes of each of `ranges` of the segment at `path`, fetched as
    /// needed and checked against what their publisher recorded; all of a
    /// call's ranges may be fetched at once.
    fn read_ranges(
        &self,
        path: &Path,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, BoxError>;

    /// Whether to read the segment at `path` whole (made whole, then
    /// mapped, as the usual read does) rather than `rows` of its `of`
    /// rows through ranges: where many of its rows are read, a few large
    /// requests beat many small ones. Never, unless the reader says so.
    fn read_whole(&self, path: &Path, rows: usize, of: usize) -> bool {
        let _ = (path, rows, of);
        false
    }
}

/// The first read takes the file's tail from a boundary of this many
/// bytes (a page): the footer of a segment (its schema, one block) most
/// often fits.
const TAIL: u64 = 4 << 10;

/// Where one top-level column's arrays are in every batch: its field
/// node and its first buffer.
#[derive(Debug, Clone, Copy)]
struct At {
    node: usize,
    buffer: usize,
}

/// A string or binary column: the key, or a blob part.
#[derive(Debug, Clone)]
struct Bytes {
    at: At,
    /// 64-bit offsets (`LargeUtf8`, `LargeBinary`).
    large: bool,
    nullable: bool,
    name: String,
}

/// A tensor part: its data (`list<T>`) and shape (`list<int64>`) columns.
#[derive(Debug, Clone)]
struct TensorAt {
    data: At,
    shape: At,
    dtype: DType,
    rank: Option<usize>,
    name: String,
}

#[derive(Debug, Clone)]
enum PartAt {
    Blob(Bytes),
    Tensor(TensorAt),
}

/// One record batch: where its body starts, its rows, field nodes and
/// buffers (offset in the body, length), all checked against the body.
#[derive(Debug)]
struct BatchAt {
    body: u64,
    rows: usize,
    nodes: Vec<(u64, u64)>,
    buffers: Vec<(u64, u64)>,
}

/// What a segment's footer and batch metadata say: enough to read any row
/// through byte ranges.
#[derive(Debug)]
pub struct Layout {
    len: u64,
    schema: RecordSchema,
    names: Vec<Arc<str>>,
    key: Bytes,
    parts: Vec<PartAt>,
    batches: Vec<BatchAt>,
    starts: Vec<usize>,
    rows: usize,
}

/// A row read through ranges: its key (`None` when null) and its record.
pub type RangedRow = (Option<String>, Result<Value>);

impl Layout {
    /// Reads the footer and batch metadata of the segment at `path` (`len`
    /// bytes): two requests of `src`. `Ok(None)` for a valid file this
    /// path does not read (dictionaries, compression, big-endian, types
    /// segments never hold): read it whole instead.
    pub fn open(
        path: &Path,
        len: u64,
        src: &dyn SegmentRanges,
        hint: Option<Structure>,
    ) -> Result<Option<Layout>> {
        let bad = |detail: String| Error::corrupt(path, detail);
        if len < 18 {
            return Err(bad(format!("{len} bytes, too short for an Arrow IPC file")));
        }
        // The tail from a page boundary: where blocks are pages, one
        // block (two when the trailer straddles one) rather than two.
        let tail_start = (len - 10) / TAIL * TAIL;
        let tail = read_one(path, src, tail_start..len)?;
        let mut trailer = [0u8; 10];
        trailer.copy_from_slice(&tail[tail.len() - 10..]);
        let footer_len = read_footer_length(trailer).map_err(|e| bad(e.to_string()))? as u64;
        let footer_start = (len - 10)
            .checked_sub(footer_len)
            .filter(|&s| s >= 8)
            .ok_or_else(|| {
                bad(format!(
                    "footer of {footer_len} bytes does not fit the {len}-byte file"
                ))
            })?;
        let footer_bytes = if footer_start >= tail_start {
            tail[(footer_start - tail_start) as usize..tail.len() - 10].to_vec()
        } else {
            let mut head = read_one(path, src, footer_start..tail_start)?;
            head.extend_from_slice(&tail[..tail.len() - 10]);
            head
        };
        let footer =
            arrow_ipc::root_as_footer(&footer_bytes).map_err(|e| bad(format!("footer: {e}")))?;
        let fb_schema = footer
            .schema()
            .ok_or_else(|| bad("footer has no schema".into()))?;
        if footer.dictionaries().is_some_and(|d| !d.is_empty())
            || fb_schema.endianness() != arrow_ipc::Endianness::Little
        {
            return Ok(None);
        }
        let schema =
            arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| bad(e.to_string()))?;
        if !schema.fields().iter().all(|f| plain_type(f.data_type())) {
            return Ok(None);
        }
        let record_schema = RecordSchema::from_arrow(&schema, hint).map_err(&bad)?;
        let (key, parts) = columns(&schema, &record_schema).map_err(&bad)?;
        let mut blocks = Vec::new();
        for (i, block) in footer.recordBatches().iter().flatten().enumerate() {
            let off = u64::try_from(block.offset()).ok();
            let meta = u64::try_from(block.metaDataLength())
                .ok()
                .filter(|&m| m >= 8);
            let body = u64::try_from(block.bodyLength()).ok();
            let (Some(off), Some(meta), Some(body)) = (off, meta, body) else {
                return Err(bad(format!(
                    "record batch {i}: block with a negative or tiny offset/length"
                )));
            };
            off.checked_add(meta)
                .and_then(|e| e.checked_add(body))
                .filter(|&e| e <= footer_start)
                .ok_or_else(|| {
                    bad(format!(
                        "record batch {i}: block at {off} runs past the footer at {footer_start}"
                    ))
                })?;
            blocks.push((off, meta, body));
        }
        let mut ranges = Vec::with_capacity(blocks.len() + 1);
        ranges.push(0..8);
        ranges.extend(blocks.iter().map(|&(off, meta, _)| off..off + meta));
        let got = read(path, src, &ranges)?;
        if &got[0][..6] != b"ARROW1" {
            return Err(bad("no ARROW1 magic at the start".into()));
        }
        let mut batches = Vec::with_capacity(blocks.len());
        let mut starts = Vec::with_capacity(blocks.len());
        let mut rows = 0usize;
        for (i, (&(off, meta, body), header)) in blocks.iter().zip(&got[1..]).enumerate() {
            let Some(batch) = batch_at(&schema, header, off + meta, body)
                .map_err(|e| bad(format!("record batch {i}: {e}")))?
            else {
                return Ok(None);
            };
            starts.push(rows);
            rows = rows
                .checked_add(batch.rows)
                .ok_or_else(|| bad("row count overflows".into()))?;
            batches.push(batch);
        }
        Ok(Some(Layout {
            len,
            names: record_schema
                .parts
                .iter()
                .map(|p| Arc::from(p.name.as_str()))
                .collect(),
            schema: record_schema,
            key,
            parts,
            batches,
            starts,
            rows,
        }))
    }

    /// Rows of the segment.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The file's length when its layout was read.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// The schema of the segment's records.
    pub fn schema(&self) -> &RecordSchema {
        &self.schema
    }

    /// Reads `rows` (rows of the segment at `path`) through two requests
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
        let plans: Vec<RowPlan> = located
            .iter()
            .map(|&(b, r, _)| {
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
                RowPlan { key, parts }
            })
            .collect();
        let got = read(path, src, &first.ranges)?;
        // Stage 4: the bytes each row's offsets bound.
        let mut second = Reads::default();
        let mut spans = Vec::with_capacity(plans.len());
        for (plan, &(b, r, row)) in plans.iter().zip(&located) {
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
            spans.push((key, parts, row));
        }
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

    /// The batch and row within it of segment row `row`.
    fn locate(&self, row: usize) -> Option<(&BatchAt, usize)> {
        if row >= self.rows {
            return None;
        }
        let b = self.starts.partition_point(|&s| s <= row).checked_sub(1)?;
        Some((self.batches.get(b)?, row - self.starts[b]))
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

fn width(large: bool) -> u64 {
    if large { 8 } else { 4 }
}

/// `src.read_ranges`, its answer checked for shape.
fn read(path: &Path, src: &dyn SegmentRanges, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
    let got = src
        .read_ranges(path, ranges)
        .map_err(|source| Error::Fetch {
            path: path.to_path_buf(),
            source,
        })?;
    let fits = got.len() == ranges.len()
        && got
            .iter()
            .zip(ranges)
            .all(|(g, r)| g.len() as u64 == r.end - r.start);
    if !fits {
        return Err(Error::Fetch {
            path: path.to_path_buf(),
            source: "the reader returned other lengths than the ranges asked".into(),
        });
    }
    Ok(got)
}

/// [`read`] of one range.
fn read_one(path: &Path, src: &dyn SegmentRanges, range: Range<u64>) -> Result<Vec<u8>> {
    let mut got = read(path, src, std::slice::from_ref(&range))?;
    Ok(got.pop().unwrap_or_default())
}

/// The key column and each part's columns, as the full read finds them.
fn columns(
    schema: &Schema,
    record: &RecordSchema,
) -> std::result::Result<(Bytes, Vec<PartAt>), String> {
    let mut at = Vec::with_capacity(schema.fields().len());
    let (mut node, mut buffer) = (0, 0);
    for f in schema.fields() {
        at.push(At { node, buffer });
        count(f.data_type(), &mut node, &mut buffer);
    }
    let field = |name: &str| -> std::result::Result<(At, &DataType, bool), String> {
        let i = schema
            .index_of(name)
            .map_err(|_| format!("no column {name:?}"))?;
        let f = schema.field(i);
        Ok((at[i], f.data_type(), f.is_nullable()))
    };
    let bytes = |name: String, strings: bool| -> std::result::Result<Bytes, String> {
        let (at, t, nullable) = field(&name)?;
        let large = match (t, strings) {
            (DataType::Utf8, true) | (DataType::Binary, false) => false,
            (DataType::LargeUtf8, true) | (DataType::LargeBinary, false) => true,
            (t, _) => return Err(format!("column {name:?} is {t}")),
        };
        Ok(Bytes {
            at,
            large,
            nullable,
            name,
        })
    };
    let key = bytes("key".into(), true)?;
    let mut parts = Vec::with_capacity(record.parts.len());
    for spec in &record.parts {
        match spec.kind {
            PartKind::Blob => parts.push(PartAt::Blob(bytes(spec.blob_column(), false)?)),
            PartKind::Tensor { dtype, rank } => {
                let name = spec.data_column();
                let (data, t, _) = field(&name)?;
                let DataType::List(child) = t else {
                    return Err(format!("column {name:?} is not a list"));
                };
                let fits = match (dtype, child.data_type()) {
                    (DType::Bool, DataType::Boolean) => true,
                    (DType::Bool, _) => false,
                    (d, t) => t.primitive_width() == Some(d.size()),
                };
                if !fits {
                    return Err(format!(
                        "column {name:?} holds {}, the schema says {dtype:?}",
                        child.data_type()
                    ));
                }
                let shape_name = spec.shape_column();
                let (shape, t, _) = field(&shape_name)?;
                if !matches!(t, DataType::List(c) if *c.data_type() == DataType::Int64) {
                    return Err(format!("column {shape_name:?} is not list<int64>"));
                }
                parts.push(PartAt::Tensor(TensorAt {
                    data,
                    shape,
                    dtype,
                    rank,
                    name,
                }));
            }
        }
    }
    Ok((key, parts))
}

/// Advances `node` and `buffer` past an array of type `t` (a plain type:
/// see `validate::plain_type`) and its children, in IPC order.
fn count(t: &DataType, node: &mut usize, buffer: &mut usize) {
    *node += 1;
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => {
            *buffer += 3
        }
        DataType::List(f) | DataType::LargeList(f) => {
            *buffer += 2;
            count(f.data_type(), node, buffer);
        }
        _ => *buffer += 2,
    }
}

/// The layout of one record batch from its message (`header`: the
/// block's metadata bytes), every buffer checked to lie in the body and
/// to be long enough for its field node, as the full read checks it.
/// `None` for a compressed batch.
fn batch_at(
    schema: &Schema,
    header: &[u8],
    body: u64,
    body_len: u64,
) -> std::result::Result<Option<BatchAt>, String> {
    if header.len() < 8 {
        return Err("short message".into());
    }
    let (size, start) = if header[..4] == [0xff; 4] {
        (
            u32::from_le_bytes([header[4], header[5], header[6], header[7]]),
            8,
        )
    } else {
        (
            u32::from_le_bytes([header[0], header[1], header[2], header[3]]),
            4,
        )
    };
    let message = header
        .get(start..start + size as usize)
        .ok_or_else(|| format!("message of {size} bytes in {} of metadata", header.len()))?;
    let message = arrow_ipc::root_as_message(message).map_err(|e| format!("message: {e}"))?;
    let batch = message
        .header_as_record_batch()
        .ok_or("the block is not a record batch")?;
    if batch.compression().is_some() {
        return Ok(None);
    }
    let rows = usize::try_from(batch.length()).map_err(|_| "negative row count")?;
    let buffers: Vec<(u64, u64)> = batch
        .buffers()
        .into_iter()
        .flatten()
        .map(|b| {
            let (o, l) = (u64::try_from(b.offset()), u64::try_from(b.length()));
            match (o, l) {
                (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|e| e <= body_len) => Ok((o, l)),
                _ => Err(format!(
                    "buffer at {} of {} bytes is outside the {body_len}-byte body",
                    b.offset(),
                    b.length()
                )),
            }
        })
        .collect::<std::result::Result<_, _>>()?;
    let nodes: Vec<(u64, u64)> = batch
        .nodes()
        .into_iter()
        .flatten()
        .map(
            |n| match (u64::try_from(n.length()), u64::try_from(n.null_count())) {
                (Ok(l), Ok(z)) if z <= l => Ok((l, z)),
                _ => Err(format!(
                    "field node of length {} with {} nulls",
                    n.length(),
                    n.null_count()
                )),
            },
        )
        .collect::<std::result::Result<_, _>>()?;
    let (mut node, mut buffer) = (0, 0);
    for f in schema.fields() {
        let len = nodes.get(node).ok_or("fewer field nodes than fields")?.0;
        if len != rows as u64 {
            return Err(format!(
                "column {:?} holds {len} rows, the batch {rows}",
                f.name()
            ));
        }
        if !f.is_nullable() && nodes[node].1 > 0 {
            return Err(format!(
                "column {:?} is not nullable but holds nulls",
                f.name()
            ));
        }
        sizes(f.data_type(), &nodes, &buffers, &mut node, &mut buffer)?;
    }
    Ok(Some(BatchAt {
        body,
        rows,
        nodes,
        buffers,
    }))
}

/// Checks the buffers of an array of type `t` and its children against
/// their field nodes (`validate::check_layout`'s rule).
fn sizes(
    t: &DataType,
    nodes: &[(u64, u64)],
    buffers: &[(u64, u64)],
    node: &mut usize,
    buffer: &mut usize,
) -> std::result::Result<(), String> {
    let &(len, nulls) = nodes.get(*node).ok_or("fewer field nodes than fields")?;
    *node += 1;
    let mut next = |need: Option<u64>, what: &str| -> std::result::Result<(), String> {
        let have = buffers
            .get(*buffer)
            .ok_or("fewer buffers than the fields need")?
            .1;
        *buffer += 1;
        let need =
            need.ok_or_else(|| format!("{what} of a field node of length {len} overflow"))?;
        if have < need {
            return Err(format!("{what} buffer of {have} bytes, {need} needed"));
        }
        Ok(())
    };
    let bits = |n: u64| n.div_ceil(8);
    let offsets = |w: u64| {
        if len == 0 {
            Some(0)
        } else {
            len.checked_add(1).and_then(|n| n.checked_mul(w))
        }
    };
    next(Some(if nulls > 0 { bits(len) } else { 0 }), "validity")?;
    match t {
        DataType::Utf8 | DataType::Binary => {
            next(offsets(4), "offsets")?;
            next(Some(0), "values")
        }
        DataType::LargeUtf8 | DataType::LargeBinary => {
            next(offsets(8), "offsets")?;
            next(Some(0), "values")
        }
        DataType::Boolean => next(Some(bits(len)), "values"),
        DataType::List(f) | DataType::LargeList(f) => {
            let w = if matches!(t, DataType::List(_)) { 4 } else { 8 };
            next(offsets(w), "offsets")?;
            sizes(f.data_type(), nodes, buffers, node, buffer)
        }
        t => {
            let width = t.primitive_width().ok_or("not a plain type")? as u64;
            next(len.checked_mul(width), "values")
        }
    }
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
