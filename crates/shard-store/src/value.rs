//! Item helpers: Python `bytes` for Rust byte buffers, and generic items as JSON.

use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A byte buffer that pickles as Python `bytes` (a plain `Vec<u8>` pickles
/// as a list of ints). Decodes from `bytes`, `bytearray` or a list of ints.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub Vec<u8>);

impl Deref for Bytes {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes(v)
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_byte_buf(BytesVisitor).map(Bytes)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("bytes")
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // Bounded by what the decoder already holds, not by a size hint.
        let mut out = Vec::new();
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(out)
    }
}

/// `#[serde(with = "shard_store::bytes")]` for a `Vec<u8>` field that must
/// pickle as Python `bytes`.
pub mod bytes {
    use serde::{Deserializer, Serializer};

    /// Serializes as `bytes`.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    /// Deserializes from `bytes`, `bytearray` or a list of ints.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(super::BytesVisitor)
    }
}

/// A decoded pickle value of any shape: open a store as
/// `ShardStore<PickleValue>` to read items without knowing their type.
/// (Decoded through serde: tuples and sets come back as lists.)
#[derive(Debug, Clone, PartialEq)]
pub struct PickleValue(pub serde_pickle::Value);

impl Deref for PickleValue {
    type Target = serde_pickle::Value;
    fn deref(&self) -> &serde_pickle::Value {
        &self.0
    }
}

impl<'de> Deserialize<'de> for PickleValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PickleValue, D::Error> {
        serde_pickle::Value::deserialize(d).map(PickleValue)
    }
}

impl Serialize for PickleValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeMap, SerializeSeq, SerializeTuple};
        use serde_pickle::Value as V;
        fn wrap(v: &V) -> PickleValue {
            PickleValue(v.clone())
        }
        match &self.0 {
            V::None => s.serialize_unit(),
            V::Bool(b) => s.serialize_bool(*b),
            V::I64(i) => s.serialize_i64(*i),
            V::Int(big) => match i128::try_from(big) {
                Ok(i) => s.serialize_i128(i),
                Err(_) => Err(S::Error::custom("integer wider than 128 bits")),
            },
            V::F64(f) => s.serialize_f64(*f),
            V::Bytes(b) => s.serialize_bytes(b),
            V::String(x) => s.serialize_str(x),
            V::List(xs) => {
                let mut seq = s.serialize_seq(Some(xs.len()))?;
                for x in xs {
                    seq.serialize_element(&wrap(x))?;
                }
                seq.end()
            }
            V::Tuple(xs) => {
                let mut t = s.serialize_tuple(xs.len())?;
                for x in xs {
                    t.serialize_element(&wrap(x))?;
                }
                t.end()
            }
            V::Set(xs) | V::FrozenSet(xs) => {
                let mut seq = s.serialize_seq(Some(xs.len()))?;
                for x in xs {
                    seq.serialize_element(&wrap(&x.clone().into_value()))?;
                }
                seq.end()
            }
            V::Dict(map) => {
                let mut m = s.serialize_map(Some(map.len()))?;
                for (k, v) in map {
                    m.serialize_entry(&wrap(&k.clone().into_value()), &wrap(v))?;
                }
                m.end()
            }
        }
    }
}
