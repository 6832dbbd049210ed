//! FFCV `.beton` files.

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::{Detected, PeerFormat};
use page_alloc::beton::{self, BetonFile, BetonValue};
use serde_json::{Map, Value, json};

use crate::adapter::{CacheAdapter, parse_index, ratio};
use crate::error::{CliError, Result};
use crate::json::{bytes_json, tensor_json};

/// An FFCV `.beton` file.
pub(crate) struct Beton;

impl CacheAdapter for Beton {
    fn kind(&self) -> Detected {
        Detected::peer(PeerFormat::Beton)
    }

    fn inspect(&self, path: &Path) -> Result<Summary> {
        Ok(beton::read(path).map_err(CliError::store)?.summary())
    }

    fn verify(&self, path: &Path) -> Vec<Problem> {
        beton::verify(path)
    }

    fn get(&self, path: &Path, key: &str) -> Result<Value> {
        let file = beton::read(path).map_err(CliError::store)?;
        let index = parse_index(path, key, file.len() as u64)?;
        sample_json(&file, index as usize).map_err(CliError::store)
    }

    fn stats(&self, path: &Path) -> Result<Summary> {
        let file = beton::read(path).map_err(CliError::store)?;
        let file_len = file.file_len();
        let samples = file.len() as u64;
        let table = file_len.saturating_sub(file.alloc_table_ptr());
        let allocations = table / beton::ALLOC_ROW_LEN as u64;
        Ok(Summary::new(self.kind().name(), path)
            .fact("num_samples", samples)
            .fact("file_len", file_len)
            .fact("bytes_per_sample", ratio(file_len, samples))
            .fact("allocations", allocations)
            .fact("allocations_per_sample", ratio(allocations, samples))
            .fact("alloc_table_bytes", table))
    }
}

/// Sample `index` as `{field: value}`.
fn sample_json(file: &BetonFile, index: usize) -> page_alloc::Result<Value> {
    let values = file.sample(index)?;
    let mut out = Map::new();
    for (field, v) in file.fields().iter().zip(values) {
        let v = match v {
            BetonValue::Int(v) => json!(v),
            BetonValue::Float(v) => json!(v),
            BetonValue::Bytes(b) => bytes_json(b),
            BetonValue::NDArray(t) => tensor_json(&t),
            BetonValue::Json(text) => serde_json::from_str(text).unwrap_or_else(|_| json!(text)),
            BetonValue::RgbImage {
                mode,
                width,
                height,
                data,
            } => json!({"mode": mode, "width": width, "height": height, "data": bytes_json(data)}),
        };
        out.insert(field.name.clone(), v);
    }
    Ok(Value::Object(out))
}
