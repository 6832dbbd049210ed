//! Per-kind summaries and values for the CLI (page-alloc and FFCV files).

use page_alloc::beton::{BetonFile, BetonType, BetonValue};
use page_alloc::{FieldValue, PageReader, Summary};
use serde_json::{Map, Value, json};

use crate::json::{bytes_json, tensor_json};

/// A page-alloc summary as JSON.
pub fn page_summary_json(s: &Summary) -> Value {
    let fields: Vec<Value> = s
        .fields
        .iter()
        .map(|f| json!({"name": f.name, "kind": f.kind, "total_bytes": f.total_bytes, "max_bytes": f.max_bytes}))
        .collect();
    json!({
        "kind": "page-alloc",
        "path": s.path,
        "file_len": s.file_len,
        "num_samples": s.num_samples,
        "page_size": s.page_size,
        "alignment": s.alignment,
        "num_runs": s.num_runs,
        "num_pages": s.num_pages,
        "data_bytes": s.data_bytes,
        "table_bytes": s.table_bytes,
        "fields": fields,
    })
}

/// Sample `index` of a page-alloc file as `{field: value}`.
pub fn page_sample_json(reader: &PageReader, index: usize) -> page_alloc::Result<Value> {
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

fn beton_type_name(ty: &BetonType) -> String {
    match ty {
        BetonType::Float => "float".into(),
        BetonType::Int => "int".into(),
        BetonType::RgbImage => "rgb_image".into(),
        BetonType::Bytes => "bytes".into(),
        BetonType::NDArray { dtype, shape } => format!("ndarray {dtype} {shape}"),
        BetonType::Json => "json".into(),
    }
}

/// A `.beton` file's fields and size as JSON.
pub fn beton_json(file: &BetonFile) -> Value {
    let fields: Vec<Value> = file
        .fields()
        .iter()
        .map(|f| json!({"name": f.name, "type": beton_type_name(&f.ty)}))
        .collect();
    json!({
        "kind": "beton",
        "path": file.path(),
        "num_samples": file.len(),
        "fields": fields,
    })
}

/// A `.beton` file as a human table.
pub fn beton_table(file: &BetonFile) -> String {
    let mut s = format!(
        "kind: beton (FFCV)\nfile: {}\nsamples: {}\nfields:\n",
        file.path().display(),
        file.len()
    );
    for f in file.fields() {
        s.push_str(&format!("  {:<16} {}\n", f.name, beton_type_name(&f.ty)));
    }
    s
}

/// Sample `index` of a `.beton` file as `{field: value}`.
pub fn beton_sample_json(file: &BetonFile, index: usize) -> page_alloc::Result<Value> {
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

/// A memmap-array report as JSON.
pub fn memmap_report_json(r: &memmap_array::Report) -> Value {
    let arrays: Vec<Value> = r
        .arrays
        .iter()
        .map(|a| {
            json!({"name": a.name, "dtype": a.dtype.name(), "shape": a.shape, "nullable": a.nullable,
                   "row_bytes": a.row_bytes, "absent_rows": a.absent_rows, "file_bytes": a.file_bytes})
        })
        .collect();
    let sidecars: Vec<Value> = r
        .sidecars
        .iter()
        .map(|s| {
            json!({"name": s.name, "rows_with_value": s.rows_with_value, "unique_values": s.unique_values,
                   "unique_bytes": s.unique_bytes, "logical_bytes": s.logical_bytes})
        })
        .collect();
    let files: Vec<Value> = r
        .files
        .iter()
        .map(|f| json!({"name": f.name, "bytes": f.bytes}))
        .collect();
    json!({
        "kind": "memmap-array",
        "path": r.dir,
        "complete": r.complete,
        "rows": r.rows,
        "arrays": arrays,
        "sidecars": sidecars,
        "files": files,
        "disk_bytes": r.disk_bytes(),
        "projected_ram_bytes": r.projected_ram_bytes,
        "fits_in_memory": r.fits_in_memory(),
    })
}

/// Row `i` of a memmap-array cache: source, arrays (null where absent),
/// sidecar values and metadata.
pub fn memmap_row_json(cache: &memmap_array::ArrayCache, i: u64) -> memmap_array::Result<Value> {
    let row = cache.row(i)?;
    let mut arrays = Map::new();
    for (spec, view) in cache.schema().arrays().iter().zip(row.arrays()) {
        arrays.insert(
            spec.name().to_owned(),
            view.as_ref().map_or(Value::Null, tensor_json),
        );
    }
    let mut sidecars = Map::new();
    for name in cache.schema().sidecars() {
        sidecars.insert(name.clone(), json!(row.sidecar(name)?));
    }
    let meta = row
        .meta_json()
        .map(|m| serde_json::from_str(m).unwrap_or_else(|_| json!(m)))
        .unwrap_or(Value::Null);
    Ok(json!({
        "row": i,
        "source": row.source(),
        "arrays": arrays,
        "sidecars": sidecars,
        "meta": meta,
    }))
}

/// A flat JSON object as `key: value` lines (nested values inline).
pub fn json_table(v: &Value) -> String {
    match v.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}: {s}"),
                other => format!("{k}: {other}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None => v.to_string(),
    }
}
