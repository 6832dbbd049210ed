//! The record schema: which parts a record has, and how they map to Arrow
//! columns, schema metadata and `schema.json` (torchcachex's naming).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use tensor_core::{DType, Value};

use crate::format::SEGMENT_FORMAT;
use crate::record::Structure;
use crate::{Error, Result};

/// What one part of a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// A tensor of this dtype; `rank` is `None` when the cache does not say
    /// (a torchcachex cache), and then any rank is accepted.
    Tensor {
        /// Element type.
        dtype: DType,
        /// Number of dimensions, when fixed.
        rank: Option<usize>,
    },
    /// Opaque bytes.
    Blob,
}

/// One part: its column prefix and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartSpec {
    /// The dict key, `item{i}` for a tuple/list member, `""` for the single
    /// tensor or blob of a tensor/blob record.
    pub name: String,
    /// What it holds.
    pub kind: PartKind,
}

impl PartSpec {
    /// The column holding tensor data (`data`, `{name}_data`).
    pub fn data_column(&self) -> String {
        suffixed(&self.name, "data")
    }
    /// The column holding tensor shapes.
    pub fn shape_column(&self) -> String {
        suffixed(&self.name, "shape")
    }
    /// The column holding blob bytes.
    pub fn blob_column(&self) -> String {
        suffixed(&self.name, "blob")
    }
    /// The field name used in error messages.
    pub fn label(&self) -> String {
        match self.kind {
            PartKind::Tensor { .. } => self.data_column(),
            PartKind::Blob => self.blob_column(),
        }
    }
}

fn suffixed(name: &str, suffix: &str) -> String {
    if name.is_empty() {
        suffix.to_owned()
    } else {
        format!("{name}_{suffix}")
    }
}

/// The layout every record of a cache shares, inferred from the first
/// record and stored in `schema.json` and each segment's Arrow schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSchema {
    /// The record structure.
    pub structure: Structure,
    /// The parts, in column order.
    pub parts: Vec<PartSpec>,
}

#[derive(Serialize, Deserialize)]
struct PartMeta {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rank: Option<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    blob: bool,
}

impl RecordSchema {
    /// The schema a record implies. A member that is itself a dict, tuple
    /// or list gets a blob spec here; [`RecordSchema::check`] refuses it.
    pub fn infer(record: &Value) -> RecordSchema {
        let spec = |name: String, part: &Value| PartSpec {
            name,
            kind: match part {
                Value::Tensor(t) => PartKind::Tensor {
                    dtype: t.dtype(),
                    rank: Some(t.shape().rank()),
                },
                _ => PartKind::Blob,
            },
        };
        let parts = match record {
            Value::Tensor(_) => vec![spec(String::new(), record)],
            Value::Blob(_) => vec![PartSpec {
                name: String::new(),
                kind: PartKind::Blob,
            }],
            Value::Dict(p) => p.iter().map(|(n, p)| spec(n.to_string(), p)).collect(),
            Value::Tuple(p) | Value::List(p) => p
                .iter()
                .enumerate()
                .map(|(i, p)| spec(format!("item{i}"), p))
                .collect(),
        };
        RecordSchema {
            structure: Structure::of(record),
            parts,
        }
    }

    /// Checks that `record` (stored under `key`) fits this schema: its
    /// structure, every member's name, kind, dtype and rank, and that it
    /// is one level deep.
    pub fn check(&self, key: &str, record: &Value) -> Result<()> {
        let mismatch = |field: &str, detail: String| Error::SchemaMismatch {
            key: key.to_owned(),
            field: field.to_owned(),
            detail,
        };
        let structure = Structure::of(record);
        let compat = structure == self.structure
            || matches!(
                (structure, self.structure),
                (Structure::Tuple, Structure::List) | (Structure::List, Structure::Tuple)
            );
        if !compat {
            return Err(mismatch(
                "output_structure",
                format!(
                    "record is a {}, cache holds {}",
                    structure.name(),
                    self.structure.name()
                ),
            ));
        }
        let check_part = |spec: &PartSpec, part: &Value| -> Result<()> {
            match (spec.kind, part) {
                (_, Value::Dict(_) | Value::Tuple(_) | Value::List(_)) => Err(mismatch(
                    &spec.name,
                    format!(
                        "a {} inside a record: segment-store holds records one level deep",
                        part.kind()
                    ),
                )),
                (PartKind::Blob, Value::Blob(_)) => Ok(()),
                (PartKind::Tensor { dtype, rank }, Value::Tensor(t)) => {
                    if t.dtype() != dtype {
                        return Err(mismatch(
                            &spec.label(),
                            format!("dtype {} where the cache holds {dtype}", t.dtype()),
                        ));
                    }
                    if let Some(rank) = rank
                        && t.shape().rank() != rank
                    {
                        return Err(mismatch(
                            &spec.label(),
                            format!(
                                "rank {} where the cache holds rank {rank}",
                                t.shape().rank()
                            ),
                        ));
                    }
                    Ok(())
                }
                (PartKind::Blob, Value::Tensor(_)) => Err(mismatch(
                    &spec.label(),
                    "a tensor where the cache holds a blob".into(),
                )),
                (PartKind::Tensor { .. }, Value::Blob(_)) => Err(mismatch(
                    &spec.label(),
                    "a blob where the cache holds a tensor".into(),
                )),
            }
        };
        match record {
            Value::Tensor(_) => check_part(&self.parts[0], record),
            Value::Blob(_) => Ok(()),
            Value::Dict(parts) => {
                for (name, _) in parts {
                    if !self.parts.iter().any(|s| *s.name == **name) {
                        return Err(mismatch(name, "not a field of the cache".into()));
                    }
                }
                for spec in &self.parts {
                    // No allocation per record: the first member of this
                    // name, then whether another follows it.
                    let mut found = parts.iter().filter(|(n, _)| **n == *spec.name);
                    match (found.next(), found.next()) {
                        (Some((_, p)), None) => check_part(spec, p)?,
                        (None, _) => {
                            return Err(mismatch(&spec.name, "missing from the record".into()));
                        }
                        (Some(_), Some(_)) => {
                            return Err(mismatch(&spec.name, "given more than once".into()));
                        }
                    }
                }
                Ok(())
            }
            Value::Tuple(parts) | Value::List(parts) => {
                if parts.len() != self.parts.len() {
                    return Err(mismatch(
                        "items",
                        format!(
                            "{} items where the cache holds {}",
                            parts.len(),
                            self.parts.len()
                        ),
                    ));
                }
                for (spec, p) in self.parts.iter().zip(parts) {
                    check_part(spec, p)?;
                }
                Ok(())
            }
        }
    }

    /// The Arrow schema of the segments, with torchcachex's and this
    /// crate's metadata.
    pub fn to_arrow(&self) -> SchemaRef {
        let mut fields = vec![Field::new("key", DataType::Utf8, true)];
        let mut metas = Vec::new();
        for p in &self.parts {
            match p.kind {
                PartKind::Tensor { dtype, rank } => {
                    fields.push(Field::new(
                        p.data_column(),
                        list_of(arrow_type(dtype)),
                        true,
                    ));
                    fields.push(Field::new(p.shape_column(), list_of(DataType::Int64), true));
                    metas.push(PartMeta {
                        name: p.name.clone(),
                        dtype: Some(dtype.name().to_owned()),
                        rank,
                        blob: false,
                    });
                }
                PartKind::Blob => {
                    fields.push(Field::new(p.blob_column(), DataType::Binary, true));
                    metas.push(PartMeta {
                        name: p.name.clone(),
                        dtype: None,
                        rank: None,
                        blob: true,
                    });
                }
            }
        }
        let mut md = HashMap::new();
        match self.structure {
            Structure::Tensor => {
                if let PartKind::Tensor { dtype, .. } = self.parts[0].kind {
                    md.insert("torch_dtype".to_owned(), dtype.torch_name().to_owned());
                }
            }
            Structure::Dict => {
                let keys: Vec<&str> = self
                    .parts
                    .iter()
                    .filter(|p| matches!(p.kind, PartKind::Tensor { .. }))
                    .map(|p| p.name.as_str())
                    .collect();
                md.insert(
                    "tensor_keys".to_owned(),
                    serde_json::to_string(&keys).unwrap_or_default(),
                );
            }
            _ => {}
        }
        md.insert(
            "cachex_parts".to_owned(),
            serde_json::to_string(&metas).unwrap_or_default(),
        );
        md.insert("cachex_format".to_owned(), SEGMENT_FORMAT.to_owned());
        Arc::new(Schema::new_with_metadata(fields, md))
    }

    /// Reads the layout back from an Arrow schema (a segment's, or one
    /// rebuilt from `schema.json`). `hint` says tuple or list where the
    /// columns cannot.
    pub fn from_arrow(
        schema: &Schema,
        hint: Option<Structure>,
    ) -> std::result::Result<RecordSchema, String> {
        match schema.field_with_name("key").map(|f| f.data_type()) {
            Ok(DataType::Utf8 | DataType::LargeUtf8) => {}
            Ok(t) => return Err(format!("column \"key\" is {t}, not utf8")),
            Err(_) => return Err("no \"key\" column".into()),
        }
        let md = schema.metadata();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let has = |n: &str| names.contains(&n);
        let tuple_like = has("item0_data") || has("item0_blob");
        let structure = if has("data") {
            Structure::Tensor
        } else if has("blob") && names.len() == 2 {
            Structure::Blob
        } else if tuple_like {
            match hint {
                Some(Structure::List) => Structure::List,
                _ => Structure::Tuple,
            }
        } else {
            Structure::Dict
        };
        if let Some(h) = hint
            && h != structure
            && !(matches!(h, Structure::Tuple | Structure::List) && tuple_like)
        {
            return Err(format!(
                "output_structure says {} but the columns hold a {}",
                h.name(),
                structure.name()
            ));
        }
        let parts: Vec<PartSpec> = if let Some(text) = md.get("cachex_parts") {
            let metas: Vec<PartMeta> =
                serde_json::from_str(text).map_err(|e| format!("metadata cachex_parts: {e}"))?;
            metas
                .into_iter()
                .map(|m| {
                    let kind = if m.blob {
                        PartKind::Blob
                    } else {
                        let name = m.dtype.as_deref().unwrap_or("");
                        let dtype = DType::from_name(name)
                            .map_err(|e| format!("metadata cachex_parts: {e}"))?;
                        PartKind::Tensor {
                            dtype,
                            rank: m.rank,
                        }
                    };
                    Ok(PartSpec { name: m.name, kind })
                })
                .collect::<std::result::Result<_, String>>()?
        } else {
            let mut parts = Vec::new();
            match structure {
                Structure::Tensor => parts.push(PartSpec {
                    name: String::new(),
                    kind: PartKind::Tensor {
                        dtype: DType::F32,
                        rank: None,
                    },
                }),
                Structure::Blob => parts.push(PartSpec {
                    name: String::new(),
                    kind: PartKind::Blob,
                }),
                _ => {
                    for n in &names {
                        if let Some(base) = n.strip_suffix("_data") {
                            parts.push(PartSpec {
                                name: base.to_owned(),
                                kind: PartKind::Tensor {
                                    dtype: DType::F32,
                                    rank: None,
                                },
                            });
                        } else if let Some(base) = n.strip_suffix("_blob") {
                            parts.push(PartSpec {
                                name: base.to_owned(),
                                kind: PartKind::Blob,
                            });
                        }
                    }
                }
            }
            // Tensor dtypes come from the Arrow types (bf16 from torch_dtype).
            for p in &mut parts {
                let col = p.data_column();
                if let PartKind::Tensor { dtype, .. } = &mut p.kind {
                    let field = schema
                        .field_with_name(&col)
                        .map_err(|_| format!("no column {col:?}"))?;
                    *dtype = dtype_of_list(field.data_type()).ok_or_else(|| {
                        format!("column {col:?} is {}, not a tensor list", field.data_type())
                    })?;
                    if *dtype == DType::U16
                        && structure == Structure::Tensor
                        && md.get("torch_dtype").map(String::as_str) == Some("torch.bfloat16")
                    {
                        *dtype = DType::BF16;
                    }
                }
            }
            parts
        };
        if parts.is_empty() {
            return Err("no data columns".into());
        }
        if matches!(structure, Structure::Tuple | Structure::List) {
            for (i, p) in parts.iter().enumerate() {
                if p.name != format!("item{i}") {
                    return Err(format!("tuple member {i} is named {:?}", p.name));
                }
            }
        }
        let out = RecordSchema { structure, parts };
        out.check_columns(schema)?;
        Ok(out)
    }

    /// Checks that every part's columns exist with the right Arrow types.
    fn check_columns(&self, schema: &Schema) -> std::result::Result<(), String> {
        for p in &self.parts {
            match p.kind {
                PartKind::Tensor { dtype, .. } => {
                    let col = p.data_column();
                    let f = schema
                        .field_with_name(&col)
                        .map_err(|_| format!("no column {col:?}"))?;
                    if dtype_of_list(f.data_type()).map(storage_dtype) != Some(storage_dtype(dtype))
                    {
                        return Err(format!(
                            "column {col:?} is {}, metadata says {dtype}",
                            f.data_type()
                        ));
                    }
                    let col = p.shape_column();
                    let f = schema
                        .field_with_name(&col)
                        .map_err(|_| format!("no column {col:?}"))?;
                    if dtype_of_list(f.data_type()) != Some(DType::I64) {
                        return Err(format!(
                            "column {col:?} is {}, not list<int64>",
                            f.data_type()
                        ));
                    }
                }
                PartKind::Blob => {
                    let col = p.blob_column();
                    let f = schema
                        .field_with_name(&col)
                        .map_err(|_| format!("no column {col:?}"))?;
                    if !matches!(f.data_type(), DataType::Binary | DataType::LargeBinary) {
                        return Err(format!("column {col:?} is {}, not binary", f.data_type()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The dtype whose bytes a column stores (bf16 is stored as uint16).
fn storage_dtype(d: DType) -> DType {
    if d == DType::BF16 { DType::U16 } else { d }
}

fn list_of(t: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", t, true)))
}

/// The Arrow element type of a dtype (bf16 as uint16).
pub fn arrow_type(d: DType) -> DataType {
    match d {
        DType::Bool => DataType::Boolean,
        DType::U8 => DataType::UInt8,
        DType::I8 => DataType::Int8,
        DType::U16 | DType::BF16 => DataType::UInt16,
        DType::I16 => DataType::Int16,
        DType::U32 => DataType::UInt32,
        DType::I32 => DataType::Int32,
        DType::U64 => DataType::UInt64,
        DType::I64 => DataType::Int64,
        DType::F16 => DataType::Float16,
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
    }
}

fn dtype_of_element(t: &DataType) -> Option<DType> {
    Some(match t {
        DataType::Boolean => DType::Bool,
        DataType::UInt8 => DType::U8,
        DataType::Int8 => DType::I8,
        DataType::UInt16 => DType::U16,
        DataType::Int16 => DType::I16,
        DataType::UInt32 => DType::U32,
        DataType::Int32 => DType::I32,
        DataType::UInt64 => DType::U64,
        DataType::Int64 => DType::I64,
        DataType::Float16 => DType::F16,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        _ => return None,
    })
}

fn dtype_of_list(t: &DataType) -> Option<DType> {
    match t {
        DataType::List(f) => dtype_of_element(f.data_type()),
        _ => None,
    }
}

/// pyarrow's spelling of a type (`"list<float>"` style, as torchcachex's
/// schema.json has it).
pub fn type_string(t: &DataType) -> String {
    match t {
        DataType::Utf8 => "string".into(),
        DataType::LargeUtf8 => "large_string".into(),
        DataType::Binary => "binary".into(),
        DataType::LargeBinary => "large_binary".into(),
        DataType::Boolean => "bool".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::Int8 => "int8".into(),
        DataType::UInt16 => "uint16".into(),
        DataType::Int16 => "int16".into(),
        DataType::UInt32 => "uint32".into(),
        DataType::Int32 => "int32".into(),
        DataType::UInt64 => "uint64".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float16 => "halffloat".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::List(f) => format!("list<{}>", type_string(f.data_type())),
        other => other.to_string(),
    }
}

/// Parses a type string of `schema.json` (pyarrow or torchcachex spelling).
pub fn parse_type_string(s: &str) -> Option<DataType> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix("list<").and_then(|r| r.strip_suffix('>')) {
        let inner = inner.strip_prefix("item:").map(str::trim).unwrap_or(inner);
        return parse_type_string(inner).map(list_of);
    }
    Some(match s {
        "string" | "utf8" => DataType::Utf8,
        "large_string" | "large_utf8" => DataType::LargeUtf8,
        "binary" => DataType::Binary,
        "large_binary" => DataType::LargeBinary,
        "bool" | "boolean" => DataType::Boolean,
        "uint8" => DataType::UInt8,
        "int8" => DataType::Int8,
        "uint16" => DataType::UInt16,
        "int16" => DataType::Int16,
        "uint32" => DataType::UInt32,
        "int32" => DataType::Int32,
        "uint64" => DataType::UInt64,
        "int64" => DataType::Int64,
        "halffloat" | "float16" | "half" => DataType::Float16,
        "float" | "float32" => DataType::Float32,
        "double" | "float64" => DataType::Float64,
        _ => return None,
    })
}

#[derive(Serialize, Deserialize)]
struct JsonField {
    name: String,
    #[serde(rename = "type")]
    ty: String,
}

#[derive(Serialize, Deserialize)]
struct SchemaJson {
    fields: Vec<JsonField>,
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, String>,
    output_structure: String,
}

/// `schema.json` text for a record schema.
pub fn to_schema_json(schema: &RecordSchema) -> String {
    let arrow = schema.to_arrow();
    let doc = SchemaJson {
        fields: arrow
            .fields()
            .iter()
            .map(|f| JsonField {
                name: f.name().clone(),
                ty: type_string(f.data_type()),
            })
            .collect(),
        metadata: arrow
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        output_structure: schema.structure.name().to_owned(),
    };
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// Parses `schema.json` text into a record schema.
pub fn parse_schema_json(text: &str) -> std::result::Result<RecordSchema, String> {
    let doc: SchemaJson = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let structure = Structure::from_name(&doc.output_structure)
        .ok_or_else(|| format!("unknown output_structure {:?}", doc.output_structure))?;
    let fields = doc
        .fields
        .iter()
        .map(|f| {
            parse_type_string(&f.ty)
                .map(|t| Field::new(f.name.clone(), t, true))
                .ok_or_else(|| format!("field {:?}: unknown type {:?}", f.name, f.ty))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let md: HashMap<String, String> = doc.metadata.into_iter().collect();
    RecordSchema::from_arrow(&Schema::new_with_metadata(fields, md), Some(structure))
}

/// The largest `schema.json` read: one short line per field, so far above
/// any real one, and small enough that a corrupt file cannot exhaust memory.
pub const SCHEMA_FILE_CAP: u64 = 1 << 20;

/// Reads `schema.json` at `path` as text, at most [`SCHEMA_FILE_CAP`]
/// bytes. A missing file keeps its `NotFound` kind; an oversized or
/// non-UTF-8 one is `InvalidData`, with the limit or the problem said.
pub(crate) fn read_schema_text(path: &std::path::Path) -> std::io::Result<String> {
    let bytes = durable_fs::read_capped(path, SCHEMA_FILE_CAP).map_err(|e| match e {
        durable_fs::Error::Io { source, .. } => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
    })?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_strings_round_trip() {
        for d in DType::ALL {
            let t = list_of(arrow_type(d));
            assert_eq!(parse_type_string(&type_string(&t)), Some(t));
        }
        assert_eq!(
            parse_type_string("list<item: halffloat>"),
            Some(list_of(DataType::Float16))
        );
    }
}
