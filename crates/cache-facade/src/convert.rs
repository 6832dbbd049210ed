//! Between [`Value`] and each store's own value type.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_pickle::{HashableValue, Value as Pickle};
use tensor_core::{DType, Shape, SharedTensor, Tensor, TensorError, Value};

/// Checks that `value` is a segment-store record: a tensor, a blob, or a
/// dict, tuple or list of tensors and blobs (records are one level deep).
/// A value that is one goes to the store as it is (a record *is* a
/// [`Value`]); this check only names the offending member in the facade's
/// own error.
pub(crate) fn check_record(value: &Value) -> Result<(), String> {
    let member = |v: &Value, at: &str| match v {
        Value::Tensor(_) | Value::Blob(_) => Ok(()),
        other => Err(format!(
            "segment-store holds records one level deep: member {at} is a {}",
            other.kind()
        )),
    };
    match value {
        Value::Tensor(_) | Value::Blob(_) => Ok(()),
        Value::Dict(items) => items.iter().try_for_each(|(n, v)| member(v, n)),
        Value::Tuple(items) | Value::List(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(k, v)| member(v, &k.to_string())),
    }
}

/// A value as plain pickled Python data: a tensor is the dict
/// `{"data": bytes, "dtype": str, "shape": tuple}`, a blob `bytes`, a dict
/// a dict, a tuple a tuple, a list a list.
pub(crate) fn pickle_from_value(value: &Value) -> Pickle {
    match value {
        Value::Tensor(t) => tensor_pickle(t.dtype(), t.shape(), t.bytes()),
        Value::Blob(b) => Pickle::Bytes(b.to_vec()),
        Value::Dict(items) => Pickle::Dict(
            items
                .iter()
                .map(|(n, v)| (HashableValue::String(n.to_string()), pickle_from_value(v)))
                .collect(),
        ),
        Value::Tuple(items) => Pickle::Tuple(items.iter().map(pickle_from_value).collect()),
        Value::List(items) => Pickle::List(items.iter().map(pickle_from_value).collect()),
    }
}

fn tensor_pickle(dtype: DType, shape: &Shape, bytes: &[u8]) -> Pickle {
    let mut d = BTreeMap::new();
    d.insert(
        HashableValue::String("dtype".into()),
        Pickle::String(dtype.name().into()),
    );
    d.insert(
        HashableValue::String("shape".into()),
        Pickle::Tuple(
            shape
                .dims()
                .iter()
                .map(|&n| Pickle::I64(n as i64))
                .collect(),
        ),
    );
    d.insert(
        HashableValue::String("data".into()),
        Pickle::Bytes(bytes.to_vec()),
    );
    Pickle::Dict(d)
}

/// A pickled item as a value: the inverse of [`pickle_from_value`], and
/// for items Python wrote: `str` is a UTF-8 blob, `int`/`float`/`bool`
/// 0-d i64/f64/bool tensors. `None`, sets, big ints and dicts with other
/// than string keys have no value form and are an error naming them.
pub(crate) fn value_from_pickle(p: &Pickle) -> Result<Value, String> {
    Ok(match p {
        Pickle::Bytes(b) => Value::blob(b.clone()),
        Pickle::String(s) => Value::blob(s.as_bytes().to_vec()),
        Pickle::Bool(b) => Value::from(scalar(Tensor::from_vec(Shape::scalar(), vec![*b]))?),
        Pickle::I64(i) => Value::from(scalar(Tensor::from_vec(Shape::scalar(), vec![*i]))?),
        Pickle::F64(f) => Value::from(scalar(Tensor::from_vec(Shape::scalar(), vec![*f]))?),
        Pickle::Tuple(items) => Value::Tuple(
            items
                .iter()
                .map(value_from_pickle)
                .collect::<Result<_, _>>()?,
        ),
        Pickle::List(items) => Value::List(
            items
                .iter()
                .map(value_from_pickle)
                .collect::<Result<_, _>>()?,
        ),
        Pickle::Dict(d) => match tensor_from_pickle(d)? {
            Some(t) => Value::Tensor(t),
            None => Value::Dict(
                d.iter()
                    .map(|(k, v)| match k {
                        HashableValue::String(name) => {
                            Ok((Arc::from(name.as_str()), value_from_pickle(v)?))
                        }
                        other => Err(format!("a dict key {other:?} is not a string")),
                    })
                    .collect::<Result<_, String>>()?,
            ),
        },
        Pickle::None => return Err("None has no value form".into()),
        Pickle::Int(_) => return Err("an int beyond 64 bits has no value form".into()),
        Pickle::Set(_) | Pickle::FrozenSet(_) => return Err("a set has no value form".into()),
    })
}

fn scalar(t: Result<Tensor, TensorError>) -> Result<Tensor, String> {
    t.map_err(|e| e.to_string())
}

/// `{"data": bytes, "dtype": str, "shape": tuple of ints}` (exactly those
/// keys) as a tensor; `None` for any other dict.
fn tensor_from_pickle(d: &BTreeMap<HashableValue, Pickle>) -> Result<Option<SharedTensor>, String> {
    let get = |k: &str| d.get(&HashableValue::String(k.into()));
    let (Some(Pickle::Bytes(data)), Some(Pickle::String(dtype)), Some(shape)) =
        (get("data"), get("dtype"), get("shape"))
    else {
        return Ok(None);
    };
    if d.len() != 3 {
        return Ok(None);
    }
    let dims = match shape {
        Pickle::Tuple(dims) | Pickle::List(dims) => dims,
        _ => return Ok(None),
    };
    let dims = dims
        .iter()
        .map(|d| match d {
            Pickle::I64(n) => {
                usize::try_from(*n).map_err(|_| format!("tensor dimension {n} is negative"))
            }
            other => Err(format!("tensor dimension {other:?} is not an int")),
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let dtype = DType::from_name(dtype).map_err(|e| e.to_string())?;
    let tensor = Tensor::new(dtype, Shape::new(dims), data).map_err(|e| e.to_string())?;
    Ok(Some(SharedTensor::from(tensor)))
}
