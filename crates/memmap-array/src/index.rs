//! `index.parquet`: streamed out of the manifest at finalize, read whole
//! (it is small) when a cache opens. The columns are listed in
//! [`crate::format`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Int64Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::format::{
    self, COL_META, COL_ROW, COL_SOURCE, FORMAT_VERSION, INDEX_FILE, INDEX_VERSION_KEY,
    ManifestRow, Schema,
};
use crate::{Error, Result};

/// Rows per Arrow batch while streaming, and per Parquet row group (bounds
/// what finalize holds in memory whatever the cache size).
const BATCH_ROWS: usize = 8192;
const ROW_GROUP_ROWS: usize = 65536;

/// Sidecar key meaning "no value" in the in-memory index.
pub(crate) const NO_KEY: u32 = u32::MAX;

/// The Arrow schema of the index for `schema`.
pub(crate) fn arrow_schema(schema: &Schema) -> SchemaRef {
    let mut fields = vec![
        Field::new(COL_ROW, DataType::Int64, false),
        Field::new(COL_SOURCE, DataType::Utf8, false),
    ];
    for a in schema.arrays() {
        fields.push(Field::new(
            format::has_column(a.name()),
            DataType::Boolean,
            false,
        ));
    }
    for s in schema.sidecars() {
        fields.push(Field::new(format::key_column(s), DataType::Int64, true));
    }
    fields.push(Field::new(COL_META, DataType::Utf8, true));
    let metadata = HashMap::from([(INDEX_VERSION_KEY.to_owned(), FORMAT_VERSION.to_string())]);
    Arc::new(ArrowSchema::new_with_metadata(fields, metadata))
}

/// One sidecar file being streamed: `{"0": "..", "1": ".."}`.
struct SidecarStream {
    name: String,
    tmp: PathBuf,
    out: BufWriter<File>,
    count: u64,
}

/// Streams manifest rows into `index.parquet` and the sidecar files.
pub(crate) struct IndexWriter {
    dir: PathBuf,
    tmp: PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    row: Int64Builder,
    source: StringBuilder,
    has: Vec<BooleanBuilder>,
    keys: Vec<Int64Builder>,
    meta: StringBuilder,
    buffered: usize,
    sidecars: Vec<SidecarStream>,
}

impl IndexWriter {
    pub(crate) fn create(dir: &Path, schema: &Schema) -> Result<IndexWriter> {
        let arrow = arrow_schema(schema);
        let tmp = durable_fs::temp_path(&dir.join(INDEX_FILE));
        let file = durable_fs::create_temp(&tmp).map_err(Error::durable)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let writer = ArrowWriter::try_new(file, arrow.clone(), Some(props)).map_err(|source| {
            Error::Parquet {
                file: tmp.clone(),
                source,
            }
        })?;
        let mut sidecars = Vec::with_capacity(schema.sidecars().len());
        for name in schema.sidecars() {
            let file_name = format::sidecar_file(name);
            let tmp = durable_fs::temp_path(&dir.join(&file_name));
            let file = durable_fs::create_temp(&tmp).map_err(Error::durable)?;
            let mut out = BufWriter::with_capacity(1 << 20, file);
            out.write_all(b"{").map_err(Error::io("write", &tmp))?;
            sidecars.push(SidecarStream {
                name: file_name,
                tmp,
                out,
                count: 0,
            });
        }
        Ok(IndexWriter {
            dir: dir.to_owned(),
            tmp,
            schema: arrow,
            writer,
            row: Int64Builder::with_capacity(BATCH_ROWS),
            source: StringBuilder::new(),
            has: schema
                .arrays()
                .iter()
                .map(|_| BooleanBuilder::new())
                .collect(),
            keys: schema
                .sidecars()
                .iter()
                .map(|_| Int64Builder::new())
                .collect(),
            meta: StringBuilder::new(),
            buffered: 0,
            sidecars,
        })
    }

    /// Adds one (already validated) manifest row.
    pub(crate) fn push(&mut self, row: &ManifestRow) -> Result<()> {
        let too_big = |what: &str| Error::corrupt(&self.tmp, format!("{what} exceeds i64"));
        self.row
            .append_value(i64::try_from(row.row).map_err(|_| too_big("row number"))?);
        self.source.append_value(&row.source);
        for (b, &p) in self.has.iter_mut().zip(&row.present) {
            b.append_value(p);
        }
        for (b, key) in self.keys.iter_mut().zip(&row.sidecars) {
            match key {
                Some(k) => b.append_value(i64::try_from(*k).map_err(|_| too_big("sidecar key"))?),
                None => b.append_null(),
            }
        }
        self.meta.append_option(row.meta.as_deref());
        for (s, key, value) in &row.new {
            let side = &mut self.sidecars[*s];
            let sep: &[u8] = if side.count == 0 { b"\n\"" } else { b",\n\"" };
            side.out
                .write_all(sep)
                .and_then(|()| write!(side.out, "{key}\": "))
                .map_err(Error::io("write", &side.tmp))?;
            serde_json::to_writer(&mut side.out, value).map_err(|source| Error::Json {
                file: side.tmp.clone(),
                source,
            })?;
            side.count += 1;
        }
        self.buffered += 1;
        if self.buffered >= BATCH_ROWS {
            self.write_batch()?;
        }
        Ok(())
    }

    fn write_batch(&mut self) -> Result<()> {
        let mut columns: Vec<ArrayRef> =
            vec![Arc::new(self.row.finish()), Arc::new(self.source.finish())];
        columns.extend(
            self.has
                .iter_mut()
                .map(|b| Arc::new(b.finish()) as ArrayRef),
        );
        columns.extend(
            self.keys
                .iter_mut()
                .map(|b| Arc::new(b.finish()) as ArrayRef),
        );
        columns.push(Arc::new(self.meta.finish()));
        let batch =
            RecordBatch::try_new(self.schema.clone(), columns).map_err(|source| Error::Arrow {
                file: self.tmp.clone(),
                source,
            })?;
        self.writer.write(&batch).map_err(|source| Error::Parquet {
            file: self.tmp.clone(),
            source,
        })?;
        self.buffered = 0;
        Ok(())
    }

    /// Writes the last batch and the footer, and renames every file into
    /// place durably (the caller fsyncs the directory).
    pub(crate) fn finish(mut self) -> Result<()> {
        if self.buffered > 0 {
            self.write_batch()?;
        }
        let file = self.writer.into_inner().map_err(|source| Error::Parquet {
            file: self.tmp.clone(),
            source,
        })?;
        durable_fs::commit_temp(file, &self.tmp, &self.dir.join(INDEX_FILE))
            .map_err(Error::durable)?;
        for mut side in self.sidecars {
            side.out
                .write_all(b"\n}\n")
                .map_err(Error::io("write", &side.tmp))?;
            let file = side
                .out
                .into_inner()
                .map_err(|e| Error::io("flush", &side.tmp)(e.into_error()))?;
            durable_fs::commit_temp(file, &side.tmp, &self.dir.join(&side.name))
                .map_err(Error::durable)?;
        }
        Ok(())
    }
}

/// Strings of one column, packed into one buffer.
#[derive(Debug, Default)]
pub(crate) struct Strings {
    data: String,
    ends: Vec<usize>,
    nulls: Vec<bool>,
}

impl Strings {
    fn push(&mut self, value: Option<&str>) {
        if value.is_none() && self.nulls.is_empty() {
            self.nulls = vec![false; self.ends.len()];
        }
        if !self.nulls.is_empty() {
            self.nulls.push(value.is_none());
        }
        self.data.push_str(value.unwrap_or(""));
        self.ends.push(self.data.len());
    }

    /// Value `i` (`None` for null or out of range).
    pub(crate) fn get(&self, i: usize) -> Option<&str> {
        if self.nulls.get(i).copied().unwrap_or(false) {
            return None;
        }
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.data.get(start..end)
    }

    /// Bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.data.len() + self.ends.len() * 8 + self.nulls.len()
    }
}

/// The index, decoded and validated.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub sources: Strings,
    pub meta: Strings,
    /// Per array: `None` when every row has it, else a flag per row.
    pub present: Vec<Option<Vec<bool>>>,
    /// Per sidecar: a key per row, [`NO_KEY`] for none.
    pub keys: Vec<Vec<u32>>,
}

impl Index {
    /// Whether row `i` holds array `k`.
    pub(crate) fn has(&self, k: usize, i: usize) -> bool {
        match &self.present[k] {
            None => true,
            Some(flags) => flags.get(i).copied().unwrap_or(false),
        }
    }

    /// Bytes held in memory.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.sources.heap_bytes()
            + self.meta.heap_bytes()
            + self.present.iter().flatten().map(Vec::len).sum::<usize>()
            + self.keys.iter().map(|k| k.len() * 4).sum::<usize>()
    }
}

/// Reads and validates `index.parquet` for a cache of `rows` rows.
///
/// The Parquet decoder is third-party code fed with bytes from disk; a panic
/// inside it on a malformed file is turned into [`Error::Corrupt`] so a bad
/// file can never bring down the reader.
pub(crate) fn read_index(path: &Path, schema: &Schema, rows: u64) -> Result<Index> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_index_inner(path, schema, rows)
    })) {
        Ok(result) => result,
        Err(_) => Err(Error::corrupt(
            path,
            "the Parquet decoder failed on this file",
        )),
    }
}

fn read_index_inner(path: &Path, schema: &Schema, rows: u64) -> Result<Index> {
    let parquet_err = |source| Error::Parquet {
        file: path.to_owned(),
        source,
    };
    let bad = |reason: String| Error::corrupt(path, reason);
    let file = File::open(path).map_err(Error::io("open", path))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_err)?;
    let found = builder.schema().clone();
    match found.metadata().get(INDEX_VERSION_KEY) {
        Some(v) if *v == FORMAT_VERSION.to_string() => {}
        Some(v) => {
            return Err(Error::UnsupportedVersion {
                file: path.to_owned(),
                found: v.parse().unwrap_or(0),
                supported: FORMAT_VERSION,
            });
        }
        None => {
            return Err(bad(format!(
                "no {INDEX_VERSION_KEY:?} in the schema metadata"
            )));
        }
    }
    let expected = arrow_schema(schema);
    let names = |s: &ArrowSchema| -> Vec<(String, DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    };
    if names(&found) != names(&expected) {
        return Err(bad(format!(
            "columns {:?}, shapes.json calls for {:?}",
            names(&found),
            names(&expected)
        )));
    }
    let file_rows = builder.metadata().file_metadata().num_rows();
    if u64::try_from(file_rows).ok() != Some(rows) {
        return Err(bad(format!("{file_rows} rows, shapes.json says {rows}")));
    }
    let reader = builder
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(parquet_err)?;
    let n_arrays = schema.arrays().len();
    let n_sidecars = schema.sidecars().len();
    let mut index = Index {
        present: vec![None; n_arrays],
        keys: vec![Vec::new(); n_sidecars],
        ..Index::default()
    };
    let mut next_row: u64 = 0;
    for batch in reader {
        let batch = batch.map_err(|source| Error::Arrow {
            file: path.to_owned(),
            source,
        })?;
        let col = |i: usize| batch.column(i).as_any();
        let row_col = col(0)
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| bad("column row is not int64".into()))?;
        let source_col = col(1)
            .downcast_ref::<StringArray>()
            .ok_or_else(|| bad("column source is not utf8".into()))?;
        let meta_col = col(2 + n_arrays + n_sidecars)
            .downcast_ref::<StringArray>()
            .ok_or_else(|| bad("column meta_json is not utf8".into()))?;
        for i in 0..batch.num_rows() {
            if next_row >= rows || row_col.is_null(i) || row_col.value(i) != next_row as i64 {
                return Err(bad(format!("row column out of sequence at row {next_row}")));
            }
            if source_col.is_null(i) {
                return Err(bad(format!("row {next_row} has no source")));
            }
            index.sources.push(Some(source_col.value(i)));
            index
                .meta
                .push((!meta_col.is_null(i)).then(|| meta_col.value(i)));
            next_row += 1;
        }
        for (k, spec) in schema.arrays().iter().enumerate() {
            let flags = col(2 + k)
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| bad(format!("column has_{} is not bool", spec.name())))?;
            let done = index.sources.ends.len() - batch.num_rows();
            for i in 0..batch.num_rows() {
                let has = !flags.is_null(i) && flags.value(i);
                if !has && !spec.nullable() {
                    return Err(bad(format!(
                        "row {} lacks array {:?}, which is not nullable",
                        done + i,
                        spec.name()
                    )));
                }
                match (&mut index.present[k], has) {
                    (None, true) => {}
                    (slot @ None, false) => {
                        let mut v = vec![true; done + i];
                        v.push(false);
                        *slot = Some(v);
                    }
                    (Some(v), has) => v.push(has),
                }
            }
        }
        for (s, name) in schema.sidecars().iter().enumerate() {
            let keys = col(2 + n_arrays + s)
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| bad(format!("column key_{name} is not int64")))?;
            for i in 0..batch.num_rows() {
                let key = if keys.is_null(i) {
                    NO_KEY
                } else {
                    u32::try_from(keys.value(i))
                        .ok()
                        .filter(|&k| k != NO_KEY)
                        .ok_or_else(|| bad(format!("sidecar key {} out of range", keys.value(i))))?
                };
                index.keys[s].push(key);
            }
        }
    }
    if next_row != rows {
        return Err(bad(format!("decoded {next_row} rows, expected {rows}")));
    }
    Ok(index)
}
