//! A streaming serde `Deserializer` straight over pickle bytes, for the
//! prefix-structured subset of pickle that serde-pickle (and so this crate)
//! writes: scalars, `EMPTY_LIST`/`EMPTY_DICT`/`EMPTY_SET` followed by
//! `MARK … APPENDS/SETITEMS/ADDITEMS` batches, and `MARK … TUPLE` tuples.
//!
//! It builds no intermediate value tree (serde-pickle builds one for the
//! whole shard first): each item is decoded once, straight into its type
//! (W3 in `BENCHMARKS.md` reads shards this way). It only
//! runs on streams that [`plan_pickle`](crate::pickle_check) marked streamable
//! (so no memo reads, postfix tuples or globals), with the closing opcode of
//! every MARK known in advance. Any surprise makes it give up ([`Bail`]);
//! the caller then decodes with serde-pickle, so results and errors are
//! always serde-pickle's.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The streaming decoder gave up; decode with serde-pickle instead.
#[derive(Debug)]
pub(crate) struct Bail;

impl std::fmt::Display for Bail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("streaming decode not possible")
    }
}

impl std::error::Error for Bail {}

impl de::Error for Bail {
    fn custom<T: std::fmt::Display>(_msg: T) -> Bail {
        Bail
    }
}

type R<T> = Result<T, Bail>;

const MARK: u8 = b'(';
const STOP: u8 = b'.';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const ADDITEMS: u8 = 0x90;
const TUPLE: u8 = b't';
const FROZENSET: u8 = 0x91;
const EMPTY_LIST: u8 = b']';

/// Decodes a top-level pickled list of `count` items.
pub(crate) fn decode_list<T: de::DeserializeOwned>(
    data: &[u8],
    closers: &[u8],
    count: u64,
) -> R<Vec<T>> {
    let mut de = Stream {
        data,
        pos: 0,
        closers,
        next_mark: 0,
    };
    de.skip_meta();
    if de.byte()? != EMPTY_LIST {
        return Err(Bail);
    }
    // `count` was counted from the stream itself: bounded by its length.
    let mut out = Vec::with_capacity(usize::try_from(count).map_err(|_| Bail)?);
    let mut access = Batches {
        de: &mut de,
        closer: APPENDS,
        in_batch: false,
    };
    while let Some(x) = access.next_element_seed(std::marker::PhantomData::<T>)? {
        out.push(x);
    }
    de.skip_meta();
    if de.byte()? != STOP || de.pos != data.len() || out.len() as u64 != count {
        return Err(Bail);
    }
    Ok(out)
}

struct Stream<'a> {
    data: &'a [u8],
    pos: usize,
    closers: &'a [u8],
    next_mark: usize,
}

impl<'a> Stream<'a> {
    fn peek(&self) -> R<u8> {
        self.data.get(self.pos).copied().ok_or(Bail)
    }

    fn byte(&mut self) -> R<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(Bail)?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn le(&mut self, n: usize) -> R<u64> {
        Ok(self
            .take(n)?
            .iter()
            .rev()
            .fold(0u64, |a, &x| (a << 8) | x as u64))
    }

    fn len(&mut self, width: usize) -> R<usize> {
        usize::try_from(self.le(width)?).map_err(|_| Bail)
    }

    /// Skips opcodes that do not change values: PROTO, FRAME and memo writes.
    fn skip_meta(&mut self) {
        loop {
            let step = match self.data.get(self.pos) {
                Some(0x80) => 2,
                Some(0x95) => 9,
                Some(0x94) => 1,
                Some(b'q') => 2,
                Some(b'r') => 5,
                _ => return,
            };
            self.pos = self.pos.saturating_add(step).min(self.data.len());
        }
    }

    /// The closing opcode of the MARK at the current position (not consumed).
    fn closer_of_next_mark(&self) -> Option<u8> {
        self.closers.get(self.next_mark).copied()
    }

    fn open_mark(&mut self) -> R<u8> {
        if self.byte()? != MARK {
            return Err(Bail);
        }
        let c = self.closer_of_next_mark().ok_or(Bail)?;
        self.next_mark += 1;
        Ok(c)
    }
}

impl<'de> Deserializer<'de> for &mut Stream<'_> {
    type Error = Bail;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        self.skip_meta();
        let op = self.byte()?;
        match op {
            b'N' => visitor.visit_unit(),
            0x88 => visitor.visit_bool(true),
            0x89 => visitor.visit_bool(false),
            b'K' => visitor.visit_i64(self.le(1)? as i64),
            b'M' => visitor.visit_i64(self.le(2)? as i64),
            b'J' => visitor.visit_i64(self.le(4)? as u32 as i32 as i64),
            0x8a => {
                let n = self.len(1)?;
                let b = self.take(n)?;
                match n {
                    0 => visitor.visit_i64(0),
                    1..=8 => {
                        let raw = b.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64);
                        let shift = 64 - 8 * n as u32;
                        visitor.visit_i64(((raw << shift) as i64) >> shift)
                    }
                    // serde-pickle writes u64 >= 2^31 as 9 bytes, the last 0.
                    9 if b[8] == 0 => {
                        let raw = b[..8].iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64);
                        visitor.visit_u64(raw)
                    }
                    _ => Err(Bail),
                }
            }
            b'G' => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                visitor.visit_f64(f64::from_be_bytes(a))
            }
            0x8c | b'X' | 0x8d => {
                let width = match op {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                };
                let n = self.len(width)?;
                let s = std::str::from_utf8(self.take(n)?).map_err(|_| Bail)?;
                visitor.visit_str(s)
            }
            b'C' | b'B' | 0x8e => {
                let width = match op {
                    b'C' => 1,
                    b'B' => 4,
                    _ => 8,
                };
                let n = self.len(width)?;
                visitor.visit_bytes(self.take(n)?)
            }
            EMPTY_LIST | 0x8f => {
                let closer = if op == EMPTY_LIST { APPENDS } else { ADDITEMS };
                let mut access = Batches {
                    de: self,
                    closer,
                    in_batch: false,
                };
                let v = visitor.visit_seq(&mut access)?;
                access.finish()?;
                Ok(v)
            }
            b'}' => {
                let mut access = Batches {
                    de: self,
                    closer: SETITEMS,
                    in_batch: false,
                };
                let v = visitor.visit_map(&mut access)?;
                access.finish()?;
                Ok(v)
            }
            b')' => visitor.visit_seq(Empty),
            MARK => {
                self.pos -= 1;
                let closer = self.open_mark()?;
                if closer != TUPLE && closer != FROZENSET {
                    return Err(Bail);
                }
                let mut access = Marked {
                    de: self,
                    closer,
                    done: false,
                };
                let v = visitor.visit_seq(&mut access)?;
                if !access.done {
                    access.de.skip_meta();
                    if access.de.byte()? != closer {
                        return Err(Bail);
                    }
                }
                Ok(v)
            }
            _ => Err(Bail),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        self.skip_meta();
        if self.peek()? == b'N' {
            self.pos += 1;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> R<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> R<V::Value> {
        Err(Bail)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// Items of a list/set (or entries of a dict) added in MARK … closer batches.
struct Batches<'s, 'a> {
    de: &'s mut Stream<'a>,
    closer: u8,
    in_batch: bool,
}

impl Batches<'_, '_> {
    /// Whether another item follows (entering/leaving batches as needed).
    fn has_next(&mut self) -> R<bool> {
        loop {
            self.de.skip_meta();
            if self.in_batch {
                if self.de.peek()? == self.closer {
                    self.de.pos += 1;
                    self.in_batch = false;
                    continue;
                }
                return Ok(true);
            }
            if self.de.peek()? == MARK && self.de.closer_of_next_mark() == Some(self.closer) {
                self.de.open_mark()?;
                self.in_batch = true;
                continue;
            }
            return Ok(false);
        }
    }

    /// Requires that every item was consumed by the visitor.
    fn finish(&mut self) -> R<()> {
        if self.has_next()? { Err(Bail) } else { Ok(()) }
    }
}

impl<'de> SeqAccess<'de> for Batches<'_, '_> {
    type Error = Bail;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> R<Option<S::Value>> {
        if !self.has_next()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }
}

impl<'de> MapAccess<'de> for Batches<'_, '_> {
    type Error = Bail;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        if !self.has_next()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> R<V::Value> {
        seed.deserialize(&mut *self.de)
    }
}

/// Items between a MARK and its TUPLE/FROZENSET.
struct Marked<'s, 'a> {
    de: &'s mut Stream<'a>,
    closer: u8,
    done: bool,
}

impl<'de> SeqAccess<'de> for Marked<'_, '_> {
    type Error = Bail;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> R<Option<S::Value>> {
        if self.done {
            return Ok(None);
        }
        self.de.skip_meta();
        if self.de.peek()? == self.closer {
            self.de.pos += 1;
            self.done = true;
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }
}

/// The empty tuple.
struct Empty;

impl<'de> SeqAccess<'de> for Empty {
    type Error = Bail;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, _seed: S) -> R<Option<S::Value>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use proptest::prelude::*;

    use crate::pickle_check::plan_pickle;
    use crate::value::Bytes;

    type Rich = (
        i64,
        u64,
        String,
        Option<f64>,
        Vec<(i32, Bytes)>,
        BTreeMap<String, Vec<u16>>,
        bool,
        Option<(char, (), Vec<i8>)>,
    );

    fn rich() -> impl Strategy<Value = Rich> {
        (
            any::<i64>(),
            any::<u64>(),
            ".{0,12}",
            proptest::option::of(prop::num::f64::NORMAL | prop::num::f64::ZERO),
            proptest::collection::vec(
                (
                    any::<i32>(),
                    proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes),
                ),
                0..4,
            ),
            proptest::collection::btree_map(
                ".{0,5}",
                proptest::collection::vec(any::<u16>(), 0..5),
                0..4,
            ),
            any::<bool>(),
            proptest::option::of((
                any::<char>(),
                Just(()),
                proptest::collection::vec(any::<i8>(), 0..3),
            )),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn streaming_decode_matches_the_values_and_serde_pickle(items in proptest::collection::vec(rich(), 0..1200)) {
            let bytes = serde_pickle::to_vec(&items, serde_pickle::SerOptions::new()).unwrap();
            let plan = plan_pickle(Path::new("t"), &bytes).unwrap();
            prop_assert!(plan.streamable);
            prop_assert_eq!(plan.count, Some(items.len() as u64));
            let got: Vec<Rich> = super::decode_list(&bytes, &plan.closers, items.len() as u64).unwrap();
            prop_assert_eq!(&got, &items);
            if let Ok(theirs) = serde_pickle::from_slice::<Vec<Rich>>(&bytes, serde_pickle::DeOptions::new()) {
                prop_assert_eq!(theirs, got);
            }
        }
    }

    #[test]
    fn python_pickles_are_not_streamed() {
        // [(1, b'x')] as CPython writes it: TUPLE2 and memo, so not streamable.
        let py = b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00]\x94K\x01C\x01x\x94\x86\x94a.";
        let plan = plan_pickle(Path::new("t"), py).unwrap();
        assert!(!plan.streamable);
        assert_eq!(plan.count, Some(1));
    }

    #[test]
    fn a_type_mismatch_bails_instead_of_guessing() {
        let bytes =
            serde_pickle::to_vec(&vec![(1u8, "a")], serde_pickle::SerOptions::new()).unwrap();
        let plan = plan_pickle(Path::new("t"), &bytes).unwrap();
        assert!(super::decode_list::<(String, u8)>(&bytes, &plan.closers, 1).is_err());
        assert!(super::decode_list::<(u8, String)>(&bytes, &plan.closers, 2).is_err());
        assert!(
            super::decode_list::<(u8,)>(&bytes, &plan.closers, 1).is_err(),
            "unread tuple items"
        );
    }
}
