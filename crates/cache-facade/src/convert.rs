//! Between [`Value`] and each store's own value type.

use std::collections::BTreeMap;
use std::sync::Arc;

use segment_store::{Part, Record, TensorBuf};
use serde_pickle::{HashableValue, Value as Pickle};
use tensor_core::{DType, Shape, SharedBytes, SharedTensor, Tensor, TensorError, Value};

/// The records of one segment-store `get_batch`, shared by the values made
/// from them: one allocation per batch, none per value.
pub(crate) type RecordBatch = Arc<Vec<Option<Record>>>;

/// Record `i` of `batch` as a value whose tensors and blobs stay where the
/// store put them (the mapped segment): every part is a projection of the
/// shared batch, so no byte is copied and nothing is allocated but a
/// dict's, tuple's or list's member list.
pub(crate) fn value_from_batch(
    batch: &RecordBatch,
    i: usize,
) -> Result<Option<Value>, TensorError> {
    let Some(record) = batch.get(i).and_then(Option::as_ref) else {
        return Ok(None);
    };
    let bytes =
        |k: Option<usize>| SharedBytes::project(Arc::clone(batch), move |b| record_bytes(b, i, k));
    let part = |k: usize, p: &Part| -> Result<Value, TensorError> {
        Ok(match p {
            Part::Tensor(t) => Value::Tensor(SharedTensor::new(
                t.dtype(),
                t.shape().clone(),
                bytes(Some(k)),
            )?),
            Part::Blob(_) => Value::Blob(bytes(Some(k))),
        })
    };
    let parts = |parts: &[Part]| -> Result<Vec<Value>, TensorError> {
        let mut out = Vec::with_capacity(parts.len());
        for (k, p) in parts.iter().enumerate() {
            out.push(part(k, p)?);
        }
        Ok(out)
    };
    Ok(Some(match record {
        Record::Tensor(t) => Value::Tensor(SharedTensor::new(
            t.dtype(),
            t.shape().clone(),
            bytes(None),
        )?),
        Record::Blob(_) => Value::Blob(bytes(None)),
        Record::Dict(members) => {
            let mut out = Vec::with_capacity(members.len());
            for (k, (name, p)) in members.iter().enumerate() {
                out.push((Arc::clone(name), part(k, p)?));
            }
            Value::Dict(out)
        }
        Record::Tuple(p) => Value::Tuple(parts(p)?),
        Record::List(p) => Value::List(parts(p)?),
    }))
}

/// The bytes of record `i` of a batch (`k`: of its part `k`); empty when
/// there is no such record or part, which the caller's length check then
/// refuses (it cannot happen: the caller found them).
fn record_bytes(batch: &[Option<Record>], i: usize, k: Option<usize>) -> &[u8] {
    let Some(record) = batch.get(i).and_then(Option::as_ref) else {
        return &[];
    };
    match (record, k) {
        (Record::Tensor(t), None) => t.bytes(),
        (Record::Blob(b), None) => b.as_bytes(),
        (Record::Dict(parts), Some(k)) => parts.get(k).map_or(&[], |(_, p)| p.bytes()),
        (Record::Tuple(parts) | Record::List(parts), Some(k)) => {
            parts.get(k).map_or(&[], Part::bytes)
        }
        _ => &[],
    }
}

/// A value as a segment-store record (copies the bytes into the store's
/// buffers, as every put does). Members of a dict, tuple or list must be
/// tensors or blobs: segment-store records are one level deep.
pub(crate) fn record_from_value(value: &Value) -> Result<Record, String> {
    fn part(v: &Value, at: &str) -> Result<Part, String> {
        match v {
            Value::Tensor(t) => Ok(Part::Tensor(TensorBuf::copy_from(&t.view()))),
            Value::Blob(b) => Ok(Part::Blob(b.as_slice().into())),
            other => Err(format!(
                "segment-store holds records one level deep: member {at} is a {}",
                other.kind()
            )),
        }
    }
    Ok(match value {
        Value::Tensor(t) => Record::Tensor(TensorBuf::copy_from(&t.view())),
        Value::Blob(b) => Record::blob(b.as_slice()),
        Value::Dict(items) => Record::Dict(
            items
                .iter()
                .map(|(n, v)| Ok((Arc::clone(n), part(v, n)?)))
                .collect::<Result<_, String>>()?,
        ),
        Value::Tuple(items) => Record::Tuple(
            items
                .iter()
                .enumerate()
                .map(|(k, v)| part(v, &k.to_string()))
                .collect::<Result<_, _>>()?,
        ),
        Value::List(items) => Record::List(
            items
                .iter()
                .enumerate()
                .map(|(k, v)| part(v, &k.to_string()))
                .collect::<Result<_, _>>()?,
        ),
    })
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
