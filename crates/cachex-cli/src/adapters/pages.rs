//! page-alloc files.

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::{Detected, StoreKind};
use page_alloc::{FieldValue, PageReader};
use serde_json::{Map, Value, json};

use crate::adapter::{CacheAdapter, parse_index, ratio};
use crate::error::{CliError, Result};
use crate::json::{bytes_json, tensor_json};

/// A page-alloc file (it starts with the format's magic).
pub(crate) struct PageAlloc;

impl CacheAdapter for PageAlloc {
    fn kind(&self) -> Detected {
        Detected::own(StoreKind::PageAlloc)
    }

    fn inspect(&self, path: &Path) -> Result<Summary> {
        let summary = page_alloc::inspect(path).map_err(CliError::store)?;
        Ok(summary.summary())
    }

    fn verify(&self, path: &Path) -> Vec<Problem> {
        page_alloc::verify(path)
    }

    fn get(&self, path: &Path, key: &str) -> Result<Value> {
        let reader = PageReader::open(path).map_err(CliError::store)?;
        let index = parse_index(path, key, reader.len() as u64)?;
        sample_json(&reader, index as usize).map_err(CliError::store)
    }

    fn stats(&self, path: &Path) -> Result<Summary> {
        let s = page_alloc::inspect(path).map_err(CliError::store)?;
        let page_space = s.num_pages.saturating_mul(s.page_size);
        Ok(Summary::new(self.kind().name(), path)
            .fact("num_samples", s.num_samples)
            .fact("file_len", s.file_len)
            .fact("bytes_per_sample", ratio(s.file_len, s.num_samples))
            .fact("data_bytes_per_sample", ratio(s.data_bytes, s.num_samples))
            .fact("page_fill", ratio(s.data_bytes, page_space))
            .fact("unused_page_bytes", page_space.saturating_sub(s.data_bytes))
            .fact("samples_per_page", ratio(s.num_samples, s.num_pages))
            .fact("table_fraction", ratio(s.table_bytes, s.file_len)))
    }
}

/// Sample `index` as `{field: value}`.
fn sample_json(reader: &PageReader, index: usize) -> page_alloc::Result<Value> {
    let sample = reader.sample(index)?;
    let mut out = Map::new();
    for (i, field) in reader.schema().fields().iter().enumerate() {
        let v = match sample.get(i)? {
            FieldValue::Int(v) => json!(v),
            FieldValue::Float(v) => json!(v),
            FieldValue::Bytes(b) => bytes_json(b),
            FieldValue::Array(t) => tensor_json(&t),
        };
        out.insert(field.name.clone(), v);
    }
    Ok(Value::Object(out))
}
