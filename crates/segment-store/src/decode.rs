//! Decoding a mapped segment lazily with arrow-rs' zero-copy
//! `FileDecoder`, and handing out rows as views into the map.

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, GenericBinaryArray, GenericStringArray, ListArray, RecordBatch,
};
use arrow_buffer::{Buffer, ScalarBuffer};
use arrow_ipc::reader::{FileDecoder, read_footer_length};
use arrow_schema::DataType;
use tensor_core::{DType, Shape, SharedBytes, SharedTensor, Tensor, Value};

use crate::index::prefetch;
use crate::record::Structure;
use crate::schema::{PartKind, RecordSchema};
use crate::validate::{check_layout, plain_type, validate_batch};
use crate::{Error, Result};

/// A decoded segment: typed columns over the mapped bytes.
pub struct Decoded {
    /// The layout of this segment.
    pub schema: RecordSchema,
    /// The schema's part names, shared by every dict record read here.
    names: Vec<Arc<str>>,
    batches: Vec<BatchColumns>,
    starts: Vec<usize>,
    rows: usize,
}

enum KeyColumn {
    Utf8(GenericStringArray<i32>),
    Large(GenericStringArray<i64>),
}

enum BlobColumn {
    Small(GenericBinaryArray<i32>),
    Large(GenericBinaryArray<i64>),
}

// One value per column per segment: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum PartColumn {
    Tensor {
        dtype: DType,
        rank: Option<usize>,
        column: String,
        data: ListArray,
        /// Element bytes of `data`'s values (not for bool), shared by
        /// every tensor read from this column.
        values: SharedBytes,
        shape: ListArray,
        dims: ScalarBuffer<i64>,
        /// Set when every row has the same shape and the lists hold no
        /// nulls: rows are then located without reading their offsets.
        uniform: Option<Uniform>,
    },
    Blob {
        column: BlobColumn,
        name: String,
        /// The column's value bytes, shared by every blob read from it.
        values: SharedBytes,
    },
}

/// The layout of a column whose rows all have one shape.
struct Uniform {
    shape: Shape,
    numel: usize,
    /// Offset of row 0's first element.
    base: usize,
}

impl Uniform {
    /// Detects a uniform column (O(rows), once per segment).
    fn detect(
        data: &ListArray,
        shape: &ListArray,
        dims: &[i64],
        rank: Option<usize>,
    ) -> Option<Uniform> {
        if data.null_count() > 0 || shape.null_count() > 0 || data.is_empty() {
            return None;
        }
        let so = shape.value_offsets();
        let (s0, s1) = (so[0] as usize, so[1] as usize);
        let first = dims.get(s0..s1)?;
        if first.iter().any(|&d| d < 0) || rank.is_some_and(|r| r != first.len()) {
            return None;
        }
        let k = first.len();
        // Every row holds `k` dims (offsets step by `k`) ...
        let k32 = i32::try_from(k).ok()?;
        if !steps_by(so, k32) {
            return None;
        }
        // ... and the same ones: the dims repeat with period `k`, compared
        // in one pass rather than row by row.
        let end = *so.last()? as usize;
        let all = dims.get(s0..end)?;
        if all.get(k..)? != all.get(..all.len().checked_sub(k)?)? {
            return None;
        }
        let shape_v = Shape::new(first.iter().map(|&d| d as usize));
        let numel = shape_v.numel()?;
        let o = data.value_offsets();
        let base = o[0] as usize;
        // Row `i` starts at `base + i * numel`.
        if !steps_by(o, i32::try_from(numel).ok()?) {
            return None;
        }
        Some(Uniform {
            shape: shape_v,
            numel,
            base,
        })
    }
}

/// A row of a [`Decoded`] segment, located in its record batch.
pub struct Row<'a> {
    batch: &'a BatchColumns,
    /// Row within `batch`.
    r: usize,
    /// Row within the segment.
    row: usize,
}

/// Whether consecutive `offsets` differ by exactly `step` (a branch-free
/// pass the compiler vectorizes).
fn steps_by(offsets: &[i32], step: i32) -> bool {
    offsets
        .windows(2)
        .fold(true, |ok, w| ok & (w[1].wrapping_sub(w[0]) == step))
}

struct BatchColumns {
    keys: KeyColumn,
    parts: Vec<PartColumn>,
}

impl Decoded {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn locate(&self, row: usize) -> Option<(&BatchColumns, usize)> {
        if row >= self.rows {
            return None;
        }
        // Segments written by this crate hold one record batch.
        if let [b] = self.batches.as_slice() {
            return Some((b, row));
        }
        let b = self.starts.partition_point(|&s| s <= row) - 1;
        Some((&self.batches[b], row - self.starts[b]))
    }

    /// Locates `row` once for the calls below (`None` beyond the end).
    pub fn row(&self, row: usize) -> Option<Row<'_>> {
        let (batch, r) = self.locate(row)?;
        Some(Row { batch, r, row })
    }

    /// Hints the CPU to fetch what locating `row`'s values touches first:
    /// its key offsets and, unless the column is uniform, each tensor's
    /// offsets. The tensor bytes themselves are fetched once the whole
    /// batch is located (`get_batch`'s warm pass).
    pub fn prefetch_row(&self, row: &Row<'_>) {
        let (b, r) = (row.batch, row.r);
        match &b.keys {
            KeyColumn::Utf8(a) => prefetch(&a.value_offsets()[r]),
            KeyColumn::Large(a) => prefetch(&a.value_offsets()[r]),
        }
        for p in &b.parts {
            if let PartColumn::Tensor {
                data,
                shape,
                uniform: None,
                ..
            } = p
            {
                prefetch(&data.value_offsets()[r]);
                prefetch(&shape.value_offsets()[r]);
            }
        }
    }

    /// Hints the CPU to fetch the key bytes of `row` (after
    /// [`Decoded::prefetch_row`] brought its offsets in).
    pub fn prefetch_key(&self, row: &Row<'_>) {
        if let KeyColumn::Utf8(a) = &row.batch.keys
            && let Some(byte) = a.value_data().get(a.value_offsets()[row.r] as usize)
        {
            prefetch(byte);
        }
    }

    /// The key of a located row (`None` when null).
    pub fn key_of<'a>(&'a self, row: &Row<'a>) -> Option<&'a str> {
        let r = row.r;
        match &row.batch.keys {
            KeyColumn::Utf8(a) => (!a.is_null(r)).then(|| a.value(r)),
            KeyColumn::Large(a) => (!a.is_null(r)).then(|| a.value(r)),
        }
    }

    /// The key of `row` (`None` beyond the end or when null).
    pub fn key(&self, row: usize) -> Option<&str> {
        let at = self.row(row)?;
        self.key_of(&at)
    }

    /// The record of `row`, its tensors borrowing the mapped file.
    pub fn record(&self, path: &Path, row: usize, structure: Structure) -> Result<Value> {
        let at = self
            .row(row)
            .ok_or_else(|| Error::corrupt(path, format!("row {row} beyond {} rows", self.rows)))?;
        self.record_of(path, &at, structure)
    }

    /// The record of a located row, its tensors borrowing the mapped file.
    pub fn record_of(&self, path: &Path, at: &Row<'_>, structure: Structure) -> Result<Value> {
        let (b, r, row) = (at.batch, at.r, at.row);
        if let (Structure::Tensor, [p]) = (self.schema.structure, b.parts.as_slice()) {
            return match read_part(path, row, p, r)? {
                t @ Value::Tensor(_) => Ok(t),
                _ => Err(Error::corrupt(path, "tensor record without a tensor")),
            };
        }
        let structure = match (self.schema.structure, structure) {
            (Structure::Tuple, Structure::List) => Structure::List,
            (s, _) => s,
        };
        let parts = || b.parts.iter().map(|p| read_part(path, row, p, r));
        let last = || parts().collect::<Result<Vec<_>>>().map(|mut v| v.pop());
        Ok(match structure {
            Structure::Tensor => match last()? {
                Some(t @ Value::Tensor(_)) => t,
                _ => return Err(Error::corrupt(path, "tensor record without a tensor")),
            },
            Structure::Blob => match last()? {
                Some(b @ Value::Blob(_)) => b,
                _ => return Err(Error::corrupt(path, "blob record without a blob")),
            },
            // Straight into the record's own vector: one allocation per
            // record, the names shared.
            Structure::Dict => {
                let mut v = Vec::with_capacity(b.parts.len());
                for (name, p) in self.names.iter().zip(&b.parts) {
                    v.push((name.clone(), read_part(path, row, p, r)?));
                }
                Value::Dict(v)
            }
            Structure::Tuple => Value::Tuple(parts().collect::<Result<_>>()?),
            Structure::List => Value::List(parts().collect::<Result<_>>()?),
        })
    }
}

/// The part of row `r` in column `p`, its bytes a slice of the column's
/// shared buffer (one reference count, no copy). A tensor of a uniform
/// column, the common case, is located inline: no call, and no result
/// passed back through memory for each part.
#[inline(always)]
fn read_part(path: &Path, row: usize, p: &PartColumn, r: usize) -> Result<Value> {
    if let PartColumn::Tensor {
        dtype,
        values,
        uniform: Some(u),
        ..
    } = p
        && *dtype != DType::Bool
    {
        let size = dtype.size();
        let start = (u.base + r * u.numel) * size;
        if let Some(bytes) = values.slice(start..start + u.numel * size)
            && let Ok(t) = SharedTensor::new(*dtype, u.shape.clone(), bytes)
        {
            return Ok(Value::Tensor(t));
        }
    }
    read_part_general(path, row, p, r)
}

/// [`read_part`] for blobs, bool tensors and columns of mixed shapes.
#[inline(never)]
fn read_part_general(path: &Path, row: usize, p: &PartColumn, r: usize) -> Result<Value> {
    let outside = |column: &str, start: usize, end: usize| {
        Error::corrupt(
            path,
            format!("row {row}: bytes {start}..{end} of column {column:?} lie outside its buffer"),
        )
    };
    match p {
        PartColumn::Blob {
            column,
            name,
            values,
        } => {
            // Zero-copy: a slice of the column's value buffer.
            let (start, end) = match column {
                BlobColumn::Small(a) if !a.is_null(r) => {
                    let o = a.value_offsets();
                    (o[r] as usize, o[r + 1] as usize)
                }
                BlobColumn::Large(a) if !a.is_null(r) => {
                    let o = a.value_offsets();
                    (o[r] as usize, o[r + 1] as usize)
                }
                _ => {
                    return Err(Error::corrupt(
                        path,
                        format!("row {row}: null in column {name:?}"),
                    ));
                }
            };
            let bytes = values
                .slice(start..end)
                .ok_or_else(|| outside(name, start, end))?;
            Ok(Value::Blob(bytes))
        }
        PartColumn::Tensor {
            dtype,
            rank,
            column,
            data,
            values,
            shape,
            dims,
            ..
        } => {
            let size = dtype.size();
            if data.is_null(r) || shape.is_null(r) {
                return Err(Error::corrupt(
                    path,
                    format!("row {row}: null tensor in column {column:?}"),
                ));
            }
            let so = shape.value_offsets();
            let (s0, s1) = (so[r] as usize, so[r + 1] as usize);
            let dim_slice = &dims[s0..s1];
            if let Some(d) = dim_slice.iter().find(|&&d| d < 0) {
                return Err(Error::corrupt(
                    path,
                    format!("row {row}: negative dimension {d} in column {column:?}"),
                ));
            }
            if let Some(rank) = rank
                && dim_slice.len() != *rank
            {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "row {row}: rank {} in column {column:?}, schema says {rank}",
                        dim_slice.len()
                    ),
                ));
            }
            // Non-negative i64 fits usize on the 64-bit targets arrow supports.
            let shape = Shape::new(dim_slice.iter().map(|&d| d as usize));
            let o = data.value_offsets();
            let (start, end) = (o[r] as usize, o[r + 1] as usize);
            let bad = |e| Error::Tensor {
                path: path.to_path_buf(),
                row,
                column: column.clone(),
                source: e,
            };
            let tensor = if *dtype == DType::Bool {
                let bools = data.values().as_boolean();
                let v: Vec<u8> = (start..end).map(|i| u8::from(bools.value(i))).collect();
                SharedTensor::from(Tensor::new(DType::Bool, shape, &v).map_err(bad)?)
            } else {
                let (from, to) = (start * size, end * size);
                let bytes = values
                    .slice(from..to)
                    .ok_or_else(|| outside(column, from, to))?;
                SharedTensor::new(*dtype, shape, bytes).map_err(bad)?
            };
            Ok(Value::Tensor(tensor))
        }
    }
}

/// An Arrow buffer as shared bytes: one allocation per column, after which
/// every value read from the column is a slice of it.
fn shared(buffer: &Buffer) -> SharedBytes {
    SharedBytes::from_owner(buffer.clone())
}

pub(crate) fn decode(
    buffer: &Buffer,
    hint: Option<Structure>,
) -> std::result::Result<Decoded, String> {
    let len = buffer.len();
    if len < 18 {
        return Err(format!("{len} bytes, too short for an Arrow IPC file"));
    }
    if &buffer[..6] != b"ARROW1" {
        return Err("no ARROW1 magic at the start".into());
    }
    let mut trailer = [0u8; 10];
    trailer.copy_from_slice(&buffer[len - 10..]);
    let footer_len = read_footer_length(trailer).map_err(|e| e.to_string())?;
    let footer_start = (len - 10)
        .checked_sub(footer_len)
        .filter(|&s| s >= 8)
        .ok_or_else(|| format!("footer of {footer_len} bytes does not fit the {len}-byte file"))?;
    let footer = arrow_ipc::root_as_footer(&buffer[footer_start..len - 10])
        .map_err(|e| format!("footer: {e}"))?;
    let fb_schema = footer.schema().ok_or("footer has no schema")?;
    let schema = arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| e.to_string())?;
    let record_schema = RecordSchema::from_arrow(&schema, hint)?;
    let schema = Arc::new(schema);
    // Arrow's own validation is replaced by `validate_batch` (see the
    // `validate` module for the contract it upholds), which
    // checks the same invariants in vectorized passes: on a fresh reader
    // the per-offset checks were half the cost of the first batch. Not in a
    // file with dictionaries (segments never hold any): reading a delta
    // dictionary runs Arrow's `concat` over the arrays it decodes, before
    // any check of ours could run.
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let skip = footer.dictionaries().is_none_or(|d| d.is_empty())
        && schema.fields().iter().all(|f| plain_type(f.data_type()));
    if skip {
        // SAFETY: with no dictionary blocks, decoding a record batch only
        // builds arrays: it reads no offsets or values, and its own bounds
        // and alignment assertions panic (`Segment::decoded` turns a panic
        // into an error). Nothing reads the arrays before `validate_batch`
        // has checked every column of the batch: buffer sizes, null counts,
        // in-bounds monotonic offsets, UTF-8, column types and lengths, no
        // nulls in a non-nullable field (Arrow's full validation for any
        // type it does not check itself).
        decoder = unsafe { decoder.with_skip_validation(true) };
    }
    let block_data = |block: &arrow_ipc::Block| -> std::result::Result<Buffer, String> {
        let off = usize::try_from(block.offset()).ok();
        let meta = usize::try_from(block.metaDataLength())
            .ok()
            .filter(|&m| m >= 8);
        let body = usize::try_from(block.bodyLength()).ok();
        let (Some(off), Some(meta), Some(body)) = (off, meta, body) else {
            return Err("block with a negative or tiny offset/length".into());
        };
        let end = off
            .checked_add(meta)
            .and_then(|e| e.checked_add(body))
            .filter(|&e| e <= footer_start)
            .ok_or_else(|| format!("block at {off} runs past the footer at {footer_start}"))?;
        Ok(buffer.slice_with_length(off, end - off))
    };
    for block in footer.dictionaries().iter().flatten() {
        let data = block_data(block)?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| format!("dictionary: {e}"))?;
    }
    let mut batches = Vec::new();
    let mut starts = Vec::new();
    let mut rows = 0usize;
    for (i, block) in footer.recordBatches().iter().flatten().enumerate() {
        let data = block_data(block)?;
        if skip {
            check_layout(&schema, block, &data).map_err(|e| format!("record batch {i}: {e}"))?;
        }
        let batch = decoder
            .read_record_batch(block, &data)
            .map_err(|e| format!("record batch {i}: {e}"))?
            .ok_or_else(|| format!("record batch {i} is empty"))?;
        validate_batch(&batch).map_err(|e| format!("record batch {i}: {e}"))?;
        starts.push(rows);
        rows = rows
            .checked_add(batch.num_rows())
            .ok_or("row count overflows")?;
        batches.push(columns_of(&batch, &record_schema)?);
    }
    Ok(Decoded {
        names: record_schema
            .parts
            .iter()
            .map(|p| Arc::from(p.name.as_str()))
            .collect(),
        schema: record_schema,
        batches,
        starts,
        rows,
    })
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> std::result::Result<&'a ArrayRef, String> {
    batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name:?}"))
}

fn columns_of(
    batch: &RecordBatch,
    schema: &RecordSchema,
) -> std::result::Result<BatchColumns, String> {
    let k = column(batch, "key")?;
    let keys = match k.data_type() {
        DataType::Utf8 => KeyColumn::Utf8(k.as_string::<i32>().clone()),
        DataType::LargeUtf8 => KeyColumn::Large(k.as_string::<i64>().clone()),
        t => return Err(format!("column \"key\" is {t}")),
    };
    let mut parts = Vec::with_capacity(schema.parts.len());
    for spec in &schema.parts {
        match spec.kind {
            PartKind::Blob => {
                let name = spec.blob_column();
                let c = column(batch, &name)?;
                let (column, values) = match c.data_type() {
                    DataType::Binary => {
                        let a = c.as_binary::<i32>();
                        (BlobColumn::Small(a.clone()), shared(a.values()))
                    }
                    DataType::LargeBinary => {
                        let a = c.as_binary::<i64>();
                        (BlobColumn::Large(a.clone()), shared(a.values()))
                    }
                    t => return Err(format!("column {name:?} is {t}")),
                };
                parts.push(PartColumn::Blob {
                    column,
                    name,
                    values,
                });
            }
            PartKind::Tensor { dtype, rank } => {
                let name = spec.data_column();
                let data = column(batch, &name)?
                    .as_list_opt::<i32>()
                    .ok_or_else(|| format!("column {name:?} is not a list"))?
                    .clone();
                if data.values().null_count() > 0 {
                    return Err(format!("column {name:?} holds null elements"));
                }
                let vd = data.values().to_data();
                let values = if dtype == DType::Bool {
                    SharedBytes::from(Vec::<u8>::new())
                } else {
                    let size = dtype.size();
                    let buf = vd
                        .buffers()
                        .first()
                        .ok_or_else(|| format!("column {name:?} has no value buffer"))?;
                    let start = vd.offset().checked_mul(size);
                    let n = vd.len().checked_mul(size);
                    match (start, n) {
                        (Some(s), Some(n)) if s.checked_add(n).is_some_and(|e| e <= buf.len()) => {
                            shared(&buf.slice_with_length(s, n))
                        }
                        _ => return Err(format!("column {name:?}: value buffer too short")),
                    }
                };
                let shape_name = spec.shape_column();
                let shape = column(batch, &shape_name)?
                    .as_list_opt::<i32>()
                    .ok_or_else(|| format!("column {shape_name:?} is not a list"))?
                    .clone();
                let dims = shape
                    .values()
                    .as_primitive_opt::<Int64Type>()
                    .ok_or_else(|| format!("column {shape_name:?} is not list<int64>"))?
                    .values()
                    .clone();
                let uniform = Uniform::detect(&data, &shape, &dims, rank);
                parts.push(PartColumn::Tensor {
                    dtype,
                    rank,
                    column: name,
                    data,
                    values,
                    shape,
                    dims,
                    uniform,
                });
            }
        }
    }
    Ok(BatchColumns { keys, parts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::utf8;
    use arrow_schema::Field;

    #[test]
    fn a_corrupt_delta_dictionary_is_refused_by_arrows_own_checks() {
        // Reading a delta dictionary concatenates the decoded arrays inside
        // Arrow; with a nested dictionary that reads string offsets, so the
        // decoder must not skip its validation for such a file.
        use arrow_array::types::Int32Type;
        use arrow_array::{BinaryArray, DictionaryArray, Int32Array, StringArray, StructArray};
        use arrow_ipc::writer::{DictionaryHandling, FileWriter, IpcWriteOptions};
        use arrow_schema::{Fields, Schema};
        let inner_t = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let st = DataType::Struct(Fields::from(vec![Field::new("x", inner_t, true)]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("a_blob", DataType::Binary, false),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(st)),
                true,
            ),
        ]));
        let batch = |inner: &[&str], xkeys: Vec<i32>, okeys: Vec<i32>| {
            let vals: ArrayRef = Arc::new(StringArray::from(inner.to_vec()));
            let x = DictionaryArray::<Int32Type>::try_new(Int32Array::from(xkeys), vals).unwrap();
            let fields = Fields::from(vec![Field::new("x", x.data_type().clone(), true)]);
            let st = StructArray::new(fields, vec![Arc::new(x) as ArrayRef], None);
            let n = okeys.len();
            let d = DictionaryArray::<Int32Type>::try_new(Int32Array::from(okeys), Arc::new(st))
                .unwrap();
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let blobs: Vec<&[u8]> = (0..n).map(|_| &b"z"[..]).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(keys)),
                    Arc::new(BinaryArray::from_vec(blobs)),
                    Arc::new(d),
                ],
            )
            .unwrap()
        };
        let mut file = Vec::new();
        let opts = IpcWriteOptions::default().with_dictionary_handling(DictionaryHandling::Delta);
        let mut w = FileWriter::try_new_with_options(&mut file, &schema, opts).unwrap();
        w.write(&batch(&["aaaaa", "bbbbbbb"], vec![0, 1], vec![0, 1]))
            .unwrap();
        w.write(&batch(&["aaaaa", "bbbbbbb", "ccc"], vec![0, 1, 2], vec![2]))
            .unwrap();
        w.finish().unwrap();
        drop(w);
        assert_eq!(
            decode(&Buffer::from_vec(file.clone()), None)
                .ok()
                .map(|d| d.rows()),
            Some(3)
        );
        // The inner strings' offsets [0, 5, 12]: the middle one now points
        // far past the values.
        let pattern: Vec<u8> = [0i32, 5, 12].iter().flat_map(|v| v.to_le_bytes()).collect();
        let hits: Vec<usize> = file
            .windows(12)
            .enumerate()
            .filter(|(_, w)| *w == &pattern[..])
            .map(|(i, _)| i)
            .collect();
        assert!(!hits.is_empty());
        for h in hits {
            file[h + 4..h + 8].copy_from_slice(&0x7fff_0000i32.to_le_bytes());
        }
        let e = decode(&Buffer::from_vec(file), None).err().unwrap();
        assert!(e.contains("dictionary"), "{e}");
    }

    /// Writes `keys` and `n` blobs as one batch, unchecked as a foreign
    /// writer might, and returns the error decoding the file reports.
    fn refused(keys: ArrayRef, n: usize) -> String {
        let schema = Arc::new(arrow_schema::Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("blob", DataType::Binary, false),
        ]));
        let blobs: ArrayRef = Arc::new(arrow_array::BinaryArray::from_vec(vec![b"x"; n]));
        // SAFETY: the batch is only written, never read here.
        let batch = unsafe { RecordBatch::new_unchecked(schema.clone(), vec![keys, blobs], n) };
        let mut file = Vec::new();
        let mut w = arrow_ipc::writer::FileWriter::try_new(&mut file, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        decode(&Buffer::from_vec(file), None).err().unwrap()
    }

    #[test]
    fn nulls_in_a_non_nullable_column_are_refused() {
        let keys = Arc::new(arrow_array::StringArray::from(vec![Some("a"), None]));
        let e = refused(keys, 2);
        assert!(e.contains("not nullable"), "{e}");
    }

    #[test]
    fn a_segment_with_bad_key_offsets_is_refused_not_read() {
        let e = refused(arrow_array::make_array(utf8(&[0, 4, 2, 6], b"k1__k2")), 3);
        assert!(
            e.contains("column \"key\"") && e.contains("decrease"),
            "{e}"
        );
    }
}
