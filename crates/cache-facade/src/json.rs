//! Values as JSON for `cachex get --json`: tensors as
//! `{"dtype", "shape", "data"}` (data flattened, bools as 0/1, 64-bit
//! integers exact), bytes as `{"$bytes_hex": ".."}`.

use serde_json::{Map, Value, json};
use tensor_core::{DType, TensorView};

/// A tensor as `{"dtype": "float32", "shape": [..], "data": [..]}`.
pub fn tensor_json(view: &TensorView<'_>) -> Value {
    let b = view.bytes();
    fn ints<const N: usize, T: Into<Value>>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<Value> {
        b.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a).into()
            })
            .collect()
    }
    let data: Vec<Value> = match view.dtype() {
        DType::Bool | DType::U8 => b.iter().map(|&v| json!(v)).collect(),
        DType::I8 => b.iter().map(|&v| json!(v as i8)).collect(),
        DType::U16 => ints(b, u16::from_le_bytes),
        DType::I16 => ints(b, i16::from_le_bytes),
        DType::U32 => ints(b, u32::from_le_bytes),
        DType::I32 => ints(b, i32::from_le_bytes),
        DType::U64 => ints(b, u64::from_le_bytes),
        DType::I64 => ints(b, i64::from_le_bytes),
        _ => view
            .to_f64_vec()
            .unwrap_or_default()
            .into_iter()
            .map(|v| json!(v))
            .collect(),
    };
    json!({
        "dtype": view.dtype().name(),
        "shape": view.shape().dims(),
        "data": data,
    })
}

/// Bytes as `{"$bytes_hex": ".."}`.
pub fn bytes_json(bytes: &[u8]) -> Value {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push_str(&format!("{b:02x}"));
    }
    let mut m = Map::new();
    m.insert("$bytes_hex".into(), Value::String(hex));
    Value::Object(m)
}

/// A segment-store record as JSON.
pub fn record_json(record: &segment_store::Record) -> Value {
    use segment_store::{Part, Record};
    fn part(p: &Part) -> Value {
        match (p.as_tensor(), p.as_blob()) {
            (Some(t), _) => tensor_json(&t.view()),
            (None, Some(b)) => bytes_json(b),
            (None, None) => Value::Null,
        }
    }
    match record {
        Record::Tensor(t) => tensor_json(&t.view()),
        Record::Blob(b) => bytes_json(b.as_bytes()),
        Record::Dict(parts) => Value::Object(
            parts
                .iter()
                .map(|(name, p)| (name.to_string(), part(p)))
                .collect(),
        ),
        Record::Tuple(parts) | Record::List(parts) => parts.iter().map(part).collect(),
    }
}
