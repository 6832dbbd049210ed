//! Writing: records to an Arrow record batch, the batch to a durable
//! segment file, and the segment's group to the append-only index log.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Int64Array, ListArray, RecordBatch, StringArray,
    make_array,
};
use arrow_buffer::{BooleanBuffer, MutableBuffer, OffsetBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{ArrowError, DataType, Field};
use tensor_core::{DType, SharedTensor, Value};

use crate::format::{self, INDEX_HEADER_LEN};
use crate::index::MAX_ROW;
use crate::schema::{PartKind, RecordSchema, arrow_type};
use crate::{Error, Result};

/// The `idx`-th part of a record that matches `schema` (checked before).
fn part_of<'a>(record: &'a Value, spec_name: &str, idx: usize) -> Option<PartRef<'a>> {
    match record {
        // Parts usually come in the schema's order: try that slot first.
        Value::Dict(p) => p
            .get(idx)
            .filter(|(n, _)| &**n == spec_name)
            .or_else(|| p.iter().find(|(n, _)| &**n == spec_name))
            .and_then(|(_, p)| PartRef::of(p)),
        Value::Tuple(p) | Value::List(p) => p.get(idx).and_then(PartRef::of),
        Value::Tensor(_) | Value::Blob(_) => PartRef::of(record),
    }
}

enum PartRef<'a> {
    Tensor(&'a SharedTensor),
    Blob(&'a [u8]),
}

impl<'a> PartRef<'a> {
    fn of(p: &'a Value) -> Option<PartRef<'a>> {
        match p {
            Value::Tensor(t) => Some(PartRef::Tensor(t)),
            Value::Blob(b) => Some(PartRef::Blob(b.as_slice())),
            Value::Dict(_) | Value::Tuple(_) | Value::List(_) => None,
        }
    }
    /// The largest offset-counted size this part adds to any column.
    fn weight(&self) -> usize {
        match self {
            PartRef::Tensor(t) => (t.bytes().len() / t.dtype().size()).max(t.shape().rank()),
            PartRef::Blob(b) => b.len(),
        }
    }
}

/// Splits `records` into runs that fit one segment each: fewer than
/// 2^24 rows and under 2^31 elements / bytes in every list or binary column.
pub fn split_runs(
    records: &[(String, Value)],
    schema: &RecordSchema,
) -> Vec<std::ops::Range<usize>> {
    split_within(records, schema, i32::MAX as usize, MAX_ROW as usize)
}

/// [`split_runs`] with `limit` per column and `max_rows` per run.
fn split_within(
    records: &[(String, Value)],
    schema: &RecordSchema,
    limit: usize,
    max_rows: usize,
) -> Vec<std::ops::Range<usize>> {
    // Every column's sum is at most the batch's bytes, keys and shape
    // entries together: under the limit, the batch is one run.
    if records.len() <= max_rows
        && records
            .iter()
            .map(|(k, r)| k.len().saturating_add(weight_bound(r)))
            .try_fold(0usize, |acc, w| acc.checked_add(w).filter(|&t| t <= limit))
            .is_some()
    {
        return std::iter::once(0..records.len()).collect();
    }
    let mut runs = Vec::new();
    let mut start = 0;
    let mut sums = vec![0usize; schema.parts.len() + 1];
    // One buffer for every record's weights (no allocation per record).
    let mut w = vec![0usize; schema.parts.len() + 1];
    for (i, (key, rec)) in records.iter().enumerate() {
        for (j, (s, w)) in schema.parts.iter().zip(w.iter_mut()).enumerate() {
            *w = part_of(rec, &s.name, j).map_or(0, |p| p.weight());
        }
        w[schema.parts.len()] = key.len();
        let full = i - start >= max_rows
            || sums
                .iter()
                .zip(&w)
                .any(|(s, w)| s.saturating_add(*w) > limit);
        if full && i > start {
            runs.push(start..i);
            start = i;
            sums.iter_mut().for_each(|s| *s = 0);
        }
        sums.iter_mut()
            .zip(&w)
            .for_each(|(s, w)| *s = s.saturating_add(*w));
    }
    if start < records.len() {
        runs.push(start..records.len());
    }
    runs
}

/// No column gains more from `value` than its bytes plus one shape entry
/// per dimension of each tensor.
fn weight_bound(value: &Value) -> usize {
    match value {
        Value::Tensor(t) => t.bytes().len().saturating_add(t.shape().rank()),
        Value::Blob(b) => b.len(),
        Value::Dict(p) => p
            .iter()
            .fold(0, |acc, (_, v)| acc.saturating_add(weight_bound(v))),
        Value::Tuple(p) | Value::List(p) => p
            .iter()
            .fold(0, |acc, v| acc.saturating_add(weight_bound(v))),
    }
}

/// Builds the record batch of `records` (all checked against `schema`).
pub fn build_batch(
    schema: &RecordSchema,
    records: &[(String, Value)],
) -> Result<RecordBatch, ArrowError> {
    let arrow = schema.to_arrow();
    let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(
        records.iter().map(|(k, _)| k.as_str()),
    ))];
    let missing =
        |name: &str| ArrowError::InvalidArgumentError(format!("record lacks part {name:?}"));
    for (j, spec) in schema.parts.iter().enumerate() {
        match spec.kind {
            PartKind::Blob => {
                let mut blobs = Vec::with_capacity(records.len());
                for (_, r) in records {
                    match part_of(r, &spec.name, j) {
                        Some(PartRef::Blob(b)) => blobs.push(b),
                        _ => return Err(missing(&spec.name)),
                    }
                }
                columns.push(Arc::new(BinaryArray::from_iter_values(blobs)));
            }
            PartKind::Tensor { dtype, .. } => {
                let mut tensors = Vec::with_capacity(records.len());
                for (_, r) in records {
                    match part_of(r, &spec.name, j) {
                        Some(PartRef::Tensor(t)) => tensors.push(t),
                        _ => return Err(missing(&spec.name)),
                    }
                }
                let (data, shape) = tensor_columns(dtype, &tensors)?;
                columns.push(data);
                columns.push(shape);
            }
        }
    }
    RecordBatch::try_new(arrow, columns)
}

fn offsets(lens: impl Iterator<Item = usize>) -> Result<OffsetBuffer<i32>, ArrowError> {
    let mut out = Vec::new();
    let mut acc = 0i32;
    out.push(0);
    for l in lens {
        acc = i32::try_from(l)
            .ok()
            .and_then(|l| acc.checked_add(l))
            .ok_or_else(|| {
                ArrowError::InvalidArgumentError("list column exceeds 2^31 elements".into())
            })?;
        out.push(acc);
    }
    Ok(OffsetBuffer::new(ScalarBuffer::from(out)))
}

fn tensor_columns(
    dtype: DType,
    tensors: &[&SharedTensor],
) -> Result<(ArrayRef, ArrayRef), ArrowError> {
    let t = arrow_type(dtype);
    let size = dtype.size();
    let numels: Vec<usize> = tensors.iter().map(|t| t.bytes().len() / size).collect();
    let values: ArrayRef = if dtype == DType::Bool {
        let bits = BooleanBuffer::from_iter(
            tensors
                .iter()
                .flat_map(|t| t.bytes().iter().map(|&b| b != 0)),
        );
        Arc::new(BooleanArray::new(bits, None))
    } else {
        let total: usize = tensors.iter().map(|t| t.bytes().len()).sum();
        let mut buf = MutableBuffer::new(total);
        for t in tensors {
            buf.extend_from_slice(t.bytes());
        }
        let data = ArrayData::builder(t.clone())
            .len(total / size)
            .add_buffer(buf.into())
            .build()?;
        make_array(data)
    };
    let data = ListArray::try_new(
        Arc::new(Field::new("item", t, true)),
        offsets(numels.into_iter())?,
        values,
        None,
    )?;
    let dims: Vec<i64> = tensors
        .iter()
        .flat_map(|t| t.shape().dims().iter().map(|&d| d as i64))
        .collect();
    let shape = ListArray::try_new(
        Arc::new(Field::new("item", DataType::Int64, true)),
        offsets(tensors.iter().map(|t| t.shape().rank()))?,
        Arc::new(Int64Array::from(dims)),
        None,
    )?;
    Ok((Arc::new(data), Arc::new(shape)))
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Bytes of each write a segment file receives: one huge page.
const WRITE_CHUNK: usize = 2 << 20;

/// Passes a file's bytes on in whole [`WRITE_CHUNK`]s at chunk-aligned
/// offsets (and the rest at the end). The page cache then holds the file
/// in 2 MiB folios, which readers map with one page-table entry each
/// (`MADV_HUGEPAGE`): random reads through the map take fewer TLB misses
/// and page faults. Arrow's writer hands over many small pieces (header, offsets,
/// keys) and then the large value buffers at unaligned offsets, which
/// would leave the file's first 2 MiB, where the offsets and keys every
/// lookup reads live, in small folios.
///
/// Each chunk's write-back starts as soon as it is written
/// ([`durable_fs::start_writeback`]), so the disk works while Arrow encodes the rest
/// and the commit's fsync finds little left (page-alloc's early write-back).
struct ChunkWriter<W: Write + WriteBack> {
    file: W,
    buf: Vec<u8>,
    /// Bytes written to `file` so far (the offset of `buf[0]`).
    written: u64,
}

impl<W: Write + WriteBack> ChunkWriter<W> {
    fn new(file: W) -> ChunkWriter<W> {
        ChunkWriter {
            file,
            buf: Vec::with_capacity(WRITE_CHUNK),
            written: 0,
        }
    }

    /// Writes `data` at the end of the file and starts its write-back.
    fn write_through(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all(data)?;
        self.file.start_writeback(self.written, data.len());
        self.written += data.len() as u64;
        Ok(())
    }

    /// Writes what is buffered and returns the file.
    fn finish(mut self) -> std::io::Result<W> {
        let buf = std::mem::take(&mut self.buf);
        self.write_through(&buf)?;
        Ok(self.file)
    }
}

impl<W: Write + WriteBack> Write for ChunkWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() && data.len() >= WRITE_CHUNK {
            // The file ends on a chunk boundary: whole chunks go straight
            // through, uncopied.
            let n = data.len() / WRITE_CHUNK * WRITE_CHUNK;
            self.write_through(&data[..n])?;
            return Ok(n);
        }
        let n = data.len().min(WRITE_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == WRITE_CHUNK {
            let buf = std::mem::take(&mut self.buf);
            let result = self.write_through(&buf);
            self.buf = buf;
            self.buf.clear();
            result?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        // Only `finish` writes a partial chunk: a flush mid-file would
        // misalign every later chunk.
        Ok(())
    }
}

/// A sink whose written bytes can be handed to the disk early.
trait WriteBack {
    /// Starts writing `len` bytes at `offset` back; a hint only.
    fn start_writeback(&self, offset: u64, len: usize);
}

impl WriteBack for File {
    fn start_writeback(&self, offset: u64, len: usize) {
        durable_fs::start_writeback(self, offset, len);
    }
}

/// A segment whose bytes are written under a temporary name (their
/// write-back started) but not yet durable: [`Unsynced::commit`] makes it
/// so and gives it its name.
pub struct Unsynced {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    /// The segment's length in bytes.
    pub len: u64,
    /// The first 8 bytes of its BLAKE3, little-endian (the index group's
    /// content hash).
    pub content: u64,
}

impl Unsynced {
    /// fsyncs the file, renames it to its segment name and fsyncs the
    /// segments directory: after this the segment survives a crash. On
    /// failure the temporary file is removed.
    pub fn commit(self) -> Result<()> {
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        durable_fs::commit_temp(self.file, &self.tmp, &self.path)
            .and_then(|()| durable_fs::sync_dir(&dir))
            .map_err(|e| {
                let _ = std::fs::remove_file(&self.tmp);
                Error::durable(e)
            })
    }

    /// Removes the temporary file (a segment that will not be committed).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Writes segment `id`'s bytes under a temporary name, starting their
/// write-back as each chunk is written; nothing is fsynced yet.
pub fn write_segment_data(dir: &Path, id: u32, batch: &RecordBatch) -> Result<Unsynced> {
    let path = format::segment_path(dir, id);
    let tmp = durable_fs::temp_path(&path);
    let file = durable_fs::create_temp(&tmp).map_err(Error::durable)?;
    let written = encode_into(file, batch).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        match e {
            Encode::Arrow(e) => Error::Arrow {
                path: path.clone(),
                source: e,
            },
            Encode::Io(what, e) => Error::io(what, &tmp)(e),
        }
    })?;
    let (file, len, content) = written;
    Ok(Unsynced {
        file,
        tmp,
        path,
        len,
        content,
    })
}

/// Why encoding a segment failed.
enum Encode {
    Arrow(ArrowError),
    Io(&'static str, std::io::Error),
}

/// Encodes `batch` as an Arrow IPC file into `file`: the file, its
/// length and content hash.
fn encode_into(file: File, batch: &RecordBatch) -> std::result::Result<(File, u64, u64), Encode> {
    let sink = Hashing {
        inner: ChunkWriter::new(file),
        hasher: blake3::Hasher::new(),
    };
    let mut w = FileWriter::try_new(sink, &batch.schema()).map_err(Encode::Arrow)?;
    w.write(batch).map_err(Encode::Arrow)?;
    w.finish().map_err(Encode::Arrow)?;
    let sink = w.into_inner().map_err(Encode::Arrow)?;
    let mut hash = [0u8; 8];
    hash.copy_from_slice(&sink.hasher.finalize().as_bytes()[..8]);
    let file = sink
        .inner
        .finish()
        .map_err(|e| Encode::Io("write segment", e))?;
    let len = file
        .metadata()
        .map_err(|e| Encode::Io("stat segment", e))?
        .len();
    Ok((file, len, u64::from_le_bytes(hash)))
}

/// Writes segment `id` durably; returns its length and content hash.
pub fn write_segment(dir: &Path, id: u32, batch: &RecordBatch) -> Result<(u64, u64)> {
    let unsynced = write_segment_data(dir, id, batch)?;
    let (len, content) = (unsynced.len, unsynced.content);
    unsynced.commit()?;
    Ok((len, content))
}

/// The append-only index log, open for appending.
pub struct IndexLog {
    path: PathBuf,
    file: File,
    len: u64,
}

impl IndexLog {
    /// Creates a fresh log at `path` with `header` (the shared log's or a
    /// writer's) holding `groups` (already encoded), atomically replacing
    /// any old one.
    pub fn create(
        path: &Path,
        header: &[u8; INDEX_HEADER_LEN],
        groups: &[Vec<u8>],
    ) -> Result<IndexLog> {
        let mut bytes = header.to_vec();
        for g in groups {
            bytes.extend_from_slice(g);
        }
        durable_fs::write_atomic(path, &bytes).map_err(Error::durable)?;
        IndexLog::open(path, bytes.len() as u64)
    }

    /// Opens an existing log for appending after its first `valid_len`
    /// bytes, cutting off (and fsyncing away) anything beyond.
    pub fn open(path: &Path, valid_len: u64) -> Result<IndexLog> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(Error::io("open index", path))?;
        let len = file
            .metadata()
            .map_err(Error::io("stat index", path))?
            .len();
        if len != valid_len {
            file.set_len(valid_len)
                .and_then(|()| file.sync_all())
                .map_err(Error::io("truncate torn index tail", path))?;
        }
        file.seek(SeekFrom::Start(valid_len))
            .map_err(Error::io("seek index", path))?;
        debug_assert!(valid_len >= INDEX_HEADER_LEN as u64);
        Ok(IndexLog {
            path: path.to_path_buf(),
            file,
            len: valid_len,
        })
    }

    /// Appends one encoded group and fsyncs it. On failure the partial
    /// write is cut off again (best effort; open also drops it).
    pub fn append(&mut self, group: &[u8]) -> Result<()> {
        let r = self
            .file
            .write_all(group)
            .and_then(|()| self.file.sync_data());
        match r {
            Ok(()) => {
                self.len += group.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
                Err(Error::io("append index", &self.path)(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the length of each write it receives.
    #[derive(Default)]
    struct Recorder {
        bytes: Vec<u8>,
        writes: Vec<usize>,
    }

    impl Write for Recorder {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.bytes.extend_from_slice(data);
            self.writes.push(data.len());
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl super::WriteBack for Recorder {
        fn start_writeback(&self, _offset: u64, _len: usize) {}
    }

    /// The runs of `split_within`, checked: in order, covering every
    /// record, each within the limits.
    fn check_runs(records: &[(String, Value)], limit: usize, max_rows: usize) -> usize {
        let schema = RecordSchema::infer(&records[0].1);
        let runs = split_within(records, &schema, limit, max_rows);
        let mut next = 0;
        for run in &runs {
            assert_eq!(run.start, next);
            assert!(run.len() <= max_rows && !run.is_empty());
            next = run.end;
            let rb = build_batch(&schema, &records[run.clone()]).unwrap();
            for col in rb.columns() {
                let weight = match col.data_type() {
                    arrow_schema::DataType::List(_) => col
                        .as_any()
                        .downcast_ref::<ListArray>()
                        .unwrap()
                        .values()
                        .len(),
                    _ => col.to_data().buffers().last().map_or(0, |b| b.len()),
                };
                // A single record over the limit is a run of its own.
                assert!(weight <= limit || run.len() == 1, "{run:?}: {weight}");
            }
        }
        assert_eq!(next, records.len());
        runs.len()
    }

    #[test]
    fn runs_stay_within_the_column_and_row_limits() {
        let records: Vec<(String, Value)> = (0..50)
            .map(|i| {
                let t =
                    tensor_core::Tensor::from_vec([i % 7 + 1], vec![i as u32; i % 7 + 1]).unwrap();
                let b = vec![i as u8; i % 5];
                (
                    format!("k{i}"),
                    Value::dict([("t", Value::from(t)), ("b", Value::Blob(b.into()))]),
                )
            })
            .collect();
        // Generous limits: one run (the fast path).
        assert_eq!(check_runs(&records, 1 << 20, 1000), 1);
        // Tight ones: several, each within them.
        assert!(check_runs(&records, 40, 1000) > 1);
        assert!(check_runs(&records, 1 << 20, 7) >= 8);
        assert!(check_runs(&records, 3, 2) > 1);
    }

    #[test]
    fn chunk_writer_writes_whole_aligned_chunks() {
        // Small pieces, then one spanning several chunks, then a tail.
        let mut pieces: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 100 + i as usize]).collect();
        pieces.push((0..5 * WRITE_CHUNK + 7).map(|i| (i % 251) as u8).collect());
        pieces.push(vec![9; 1000]);
        let mut w = ChunkWriter::new(Recorder::default());
        for p in &pieces {
            w.write_all(p).unwrap();
            w.flush().unwrap();
        }
        let r = w.finish().unwrap();
        assert_eq!(r.bytes, pieces.concat());
        let (last, whole) = r.writes.split_last().unwrap();
        // Every write but the last is whole chunks, so each starts on a
        // chunk boundary; the big piece went through uncopied (one write
        // of several chunks).
        assert!(
            whole.iter().all(|&n| n > 0 && n % WRITE_CHUNK == 0),
            "{:?}",
            r.writes
        );
        assert!(whole.iter().any(|&n| n > WRITE_CHUNK), "{:?}", r.writes);
        assert!(*last <= WRITE_CHUNK);
    }
}
