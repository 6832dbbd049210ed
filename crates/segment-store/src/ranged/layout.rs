//! Stages 1–2 of a ranged read: a segment's [`Layout`] from its footer
//! and batch metadata, checked as the full decode checks them.

use std::path::Path;
use std::sync::Arc;

use arrow_ipc::reader::read_footer_length;
use arrow_schema::{DataType, Schema};
use tensor_core::DType;

use super::source::{SegmentRanges, read, read_one};
use crate::record::Structure;
use crate::schema::{PartKind, RecordSchema};
use crate::validate::plain_type;
use crate::{Error, Result};

/// The first read takes the file's tail from a boundary of this many
/// bytes (a page): the footer of a segment (its schema, one block) most
/// often fits.
const TAIL: u64 = 4 << 10;

/// Where one top-level column's arrays are in every batch: its field
/// node and its first buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) node: usize,
    pub(super) buffer: usize,
}

/// A string or binary column: the key, or a blob part.
#[derive(Debug, Clone)]
pub(super) struct Bytes {
    pub(super) at: At,
    /// 64-bit offsets (`LargeUtf8`, `LargeBinary`).
    pub(super) large: bool,
    pub(super) nullable: bool,
    pub(super) name: String,
}

/// A tensor part: its data (`list<T>`) and shape (`list<int64>`) columns.
#[derive(Debug, Clone)]
pub(super) struct TensorAt {
    pub(super) data: At,
    pub(super) shape: At,
    pub(super) dtype: DType,
    pub(super) rank: Option<usize>,
    pub(super) name: String,
}

#[derive(Debug, Clone)]
pub(super) enum PartAt {
    Blob(Bytes),
    Tensor(TensorAt),
}

/// One record batch: where its body starts, its rows, field nodes and
/// buffers (offset in the body, length), all checked against the body.
#[derive(Debug)]
pub(super) struct BatchAt {
    pub(super) body: u64,
    pub(super) rows: usize,
    pub(super) nodes: Vec<(u64, u64)>,
    pub(super) buffers: Vec<(u64, u64)>,
}

/// What a segment's footer and batch metadata say: enough to read any row
/// through byte ranges.
#[derive(Debug)]
pub struct Layout {
    pub(super) len: u64,
    pub(super) schema: RecordSchema,
    pub(super) names: Vec<Arc<str>>,
    pub(super) key: Bytes,
    pub(super) parts: Vec<PartAt>,
    pub(super) batches: Vec<BatchAt>,
    pub(super) starts: Vec<usize>,
    pub(super) rows: usize,
}

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

    /// The batch and row within it of segment row `row`.
    pub(super) fn locate(&self, row: usize) -> Option<(&BatchAt, usize)> {
        if row >= self.rows {
            return None;
        }
        let b = self.starts.partition_point(|&s| s <= row).checked_sub(1)?;
        Some((self.batches.get(b)?, row - self.starts[b]))
    }
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
