//! Records as JSON, as [`KindSpec::get`](crate::KindSpec::get) returns
//! them (and `cachex get --json` prints them): tensors as
//! `{"dtype", "shape", "data"}` (data flattened, bools as 0/1, 64-bit
//! integers exact), bytes as `{"$bytes_hex": ".."}` (made in one place,
//! [`bytes_json`]).

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

/// The key of the object bytes print as.
pub const BYTES_HEX: &str = "$bytes_hex";

/// Bytes as `{"$bytes_hex": ".."}` (lowercase hex).
pub fn bytes_json(bytes: &[u8]) -> Value {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(DIGITS[usize::from(b >> 4)] as char);
        hex.push(DIGITS[usize::from(b & 15)] as char);
    }
    let mut m = Map::new();
    m.insert(BYTES_HEX.into(), Value::String(hex));
    Value::Object(m)
}

/// A pickle value (a shard-store or loadit item) as JSON: bytes as
/// [`bytes_json`], tuples and sets as arrays, dict keys as strings (their
/// JSON text unless already a string), big integers as decimal strings,
/// non-finite floats as `null`.
pub fn pickle_to_json(v: &serde_pickle::Value) -> Value {
    use serde_pickle::Value as P;
    match v {
        P::None => Value::Null,
        P::Bool(b) => Value::Bool(*b),
        P::I64(i) => Value::from(*i),
        P::Int(big) => Value::String(big.to_string()),
        P::F64(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        P::Bytes(b) => bytes_json(b),
        P::String(s) => Value::String(s.clone()),
        P::List(xs) | P::Tuple(xs) => Value::Array(xs.iter().map(pickle_to_json).collect()),
        P::Set(xs) | P::FrozenSet(xs) => Value::Array(
            xs.iter()
                .map(|h| pickle_to_json(&h.clone().into_value()))
                .collect(),
        ),
        P::Dict(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match pickle_to_json(&k.clone().into_value()) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, pickle_to_json(v))
                })
                .collect(),
        ),
    }
}

/// A segment-store record as JSON.
pub fn record_json(record: &tensor_core::Value) -> Value {
    fn part(p: &tensor_core::Value) -> Value {
        match (p.as_tensor(), p.as_blob()) {
            (Some(t), _) => tensor_json(&t.view()),
            (None, Some(b)) => bytes_json(b),
            (None, None) => Value::Null,
        }
    }
    match record {
        tensor_core::Value::Tensor(t) => tensor_json(&t.view()),
        tensor_core::Value::Blob(b) => bytes_json(b.as_slice()),
        tensor_core::Value::Dict(parts) => Value::Object(
            parts
                .iter()
                .map(|(name, p)| (name.to_string(), part(p)))
                .collect(),
        ),
        tensor_core::Value::Tuple(parts) | tensor_core::Value::List(parts) => {
            parts.iter().map(part).collect()
        }
    }
}
