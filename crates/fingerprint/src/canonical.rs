//! The canonical encoding of a `serde::Serialize` value (format version 1).
//!
//! Every value becomes a one-byte tag followed by its payload; lengths and
//! counts are u64 little-endian:
//!
//! | value | encoding |
//! |---|---|
//! | unit, `None`, unit struct | `n` |
//! | bool | `b` then `0x00` or `0x01` |
//! | any integer (i8 … i128, u8 … u64, u128 ≤ i128::MAX) | `i` then 16-byte little-endian two's complement i128 |
//! | u128 > i128::MAX | `u` then 16-byte little-endian u128 |
//! | f32, f64 | `f` then the f64 bits, little-endian; f32 widens exactly; every NaN becomes `0x7ff8000000000000`; `-0.0` becomes `+0.0` |
//! | char, str, unit variant name | `s` then length then UTF-8 bytes |
//! | bytes | `y` then length then bytes |
//! | `Some(v)`, newtype struct | the encoding of `v` |
//! | seq, tuple, tuple struct | `l` then count then each element |
//! | map, struct | `m` then count then (key, value) pairs sorted by the key's encoding |
//! | newtype, tuple and struct variants | a one-entry map `{variant name: payload}` |
//!
//! So integer width does not matter (`1u8` and `1i64` agree), integers and
//! floats differ (`1` and `1.0`), key order does not matter, and `Some(x)`
//! equals `x` (as in JSON). Two values with equal encodings are the same
//! configuration.

use serde::ser::{self, Serialize};

use crate::FingerprintError;

/// Encodes `value` canonically.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FingerprintError> {
    let mut out = Vec::new();
    value.serialize(Canonical { out: &mut out })?;
    Ok(out)
}

impl ser::Error for FingerprintError {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        FingerprintError::Encode(msg.to_string())
    }
}

struct Canonical<'a> {
    out: &'a mut Vec<u8>,
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_int(out: &mut Vec<u8>, v: i128) {
    out.push(b'i');
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_float(out: &mut Vec<u8>, v: f64) {
    let bits = if v.is_nan() {
        0x7ff8_0000_0000_0000u64
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    };
    out.push(b'f');
    out.extend_from_slice(&bits.to_le_bytes());
}

/// Collects list elements, then writes `l`, the count and the elements.
struct SeqEncoder<'a> {
    out: &'a mut Vec<u8>,
    count: usize,
    body: Vec<u8>,
    /// For tuple/struct variants: wrap as `{variant: list}`.
    variant: Option<&'static str>,
}

impl SeqEncoder<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), FingerprintError> {
        self.count += 1;
        value.serialize(Canonical {
            out: &mut self.body,
        })
    }

    fn finish(self) -> Result<(), FingerprintError> {
        let out = self.out;
        if let Some(name) = self.variant {
            out.push(b'm');
            put_len(out, 1);
            put_str(out, b's', name.as_bytes());
        }
        out.push(b'l');
        put_len(out, self.count);
        out.extend_from_slice(&self.body);
        Ok(())
    }
}

/// Collects encoded (key, value) pairs, then writes them sorted by key.
struct MapEncoder<'a> {
    out: &'a mut Vec<u8>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    pending_key: Option<Vec<u8>>,
    variant: Option<&'static str>,
}

impl MapEncoder<'_> {
    fn entry_key<K: Serialize + ?Sized>(&mut self, key: &K) -> Result<(), FingerprintError> {
        self.pending_key = Some(encode(key)?);
        Ok(())
    }

    fn entry_value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), FingerprintError> {
        let key = self
            .pending_key
            .take()
            .ok_or_else(|| FingerprintError::Encode("map value without a key".into()))?;
        self.entries.push((key, encode(value)?));
        Ok(())
    }

    fn field<V: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &V,
    ) -> Result<(), FingerprintError> {
        self.entry_key(name)?;
        self.entry_value(value)
    }

    fn finish(mut self) -> Result<(), FingerprintError> {
        let out = self.out;
        if let Some(name) = self.variant {
            out.push(b'm');
            put_len(out, 1);
            put_str(out, b's', name.as_bytes());
        }
        self.entries.sort();
        out.push(b'm');
        put_len(out, self.entries.len());
        for (k, v) in self.entries {
            out.extend_from_slice(&k);
            out.extend_from_slice(&v);
        }
        Ok(())
    }
}

impl<'a> Canonical<'a> {
    fn seq(self, variant: Option<&'static str>) -> SeqEncoder<'a> {
        SeqEncoder {
            out: self.out,
            count: 0,
            body: Vec::new(),
            variant,
        }
    }

    fn map(self, variant: Option<&'static str>) -> MapEncoder<'a> {
        MapEncoder {
            out: self.out,
            entries: Vec::new(),
            pending_key: None,
            variant,
        }
    }
}

impl<'a> ser::Serializer for Canonical<'a> {
    type Ok = ();
    type Error = FingerprintError;
    type SerializeSeq = SeqEncoder<'a>;
    type SerializeTuple = SeqEncoder<'a>;
    type SerializeTupleStruct = SeqEncoder<'a>;
    type SerializeTupleVariant = SeqEncoder<'a>;
    type SerializeMap = MapEncoder<'a>;
    type SerializeStruct = MapEncoder<'a>;
    type SerializeStructVariant = MapEncoder<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), FingerprintError> {
        self.out.push(b'b');
        self.out.push(u8::from(v));
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_i128(self, v: i128) -> Result<(), FingerprintError> {
        put_int(self.out, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), FingerprintError> {
        self.serialize_i128(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<(), FingerprintError> {
        match i128::try_from(v) {
            Ok(i) => self.serialize_i128(i),
            Err(_) => {
                self.out.push(b'u');
                self.out.extend_from_slice(&v.to_le_bytes());
                Ok(())
            }
        }
    }
    fn serialize_f32(self, v: f32) -> Result<(), FingerprintError> {
        put_float(self.out, f64::from(v));
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<(), FingerprintError> {
        put_float(self.out, v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), FingerprintError> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), FingerprintError> {
        put_str(self.out, b's', v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), FingerprintError> {
        put_str(self.out, b'y', v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), FingerprintError> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), FingerprintError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), FingerprintError> {
        self.out.push(b'n');
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), FingerprintError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), FingerprintError> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        let mut map = self.map(None);
        map.field(variant, value)?;
        map.finish()
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<SeqEncoder<'a>, FingerprintError> {
        Ok(self.seq(None))
    }
    fn serialize_tuple(self, _len: usize) -> Result<SeqEncoder<'a>, FingerprintError> {
        Ok(self.seq(None))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<SeqEncoder<'a>, FingerprintError> {
        Ok(self.seq(None))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<SeqEncoder<'a>, FingerprintError> {
        Ok(self.seq(Some(variant)))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<MapEncoder<'a>, FingerprintError> {
        Ok(self.map(None))
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<MapEncoder<'a>, FingerprintError> {
        Ok(self.map(None))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<MapEncoder<'a>, FingerprintError> {
        Ok(self.map(Some(variant)))
    }
}

macro_rules! seq_impl {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for SeqEncoder<'_> {
            type Ok = ();
            type Error = FingerprintError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), FingerprintError> {
                self.element(value)
            }
            fn end(self) -> Result<(), FingerprintError> {
                self.finish()
            }
        }
    )*};
}
seq_impl!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for MapEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), FingerprintError> {
        self.entry_key(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.entry_value(value)
    }
    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

macro_rules! struct_impl {
    ($($trait:ident),*) => {$(
        impl ser::$trait for MapEncoder<'_> {
            type Ok = ();
            type Error = FingerprintError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), FingerprintError> {
                self.field(key, value)
            }
            fn end(self) -> Result<(), FingerprintError> {
                self.finish()
            }
        }
    )*};
}
struct_impl!(SerializeStruct, SerializeStructVariant);
