//! The checks that make Arrow's `with_skip_validation(true)` sound for
//! segment files.
//!
//! # The contract
//! `decode.rs` decodes a segment's record batches with
//! `FileDecoder::with_skip_validation(true)` (an `unsafe` call) only when
//! the file has no dictionary blocks and every field is a [`plain_type`].
//! In return, before anything reads a decoded array:
//!
//! 1. [`check_layout`] has checked, from the IPC message alone, that every
//!    buffer of the batch lies inside the block's body and is as long as
//!    its field node needs (validity bits, offsets, fixed-width values) —
//!    what Arrow's decoder would otherwise only assert — and that the batch
//!    is not compressed;
//! 2. [`validate_batch`] has checked each column against the schema (type,
//!    length, no nulls in a non-nullable field) and then everything
//!    Arrow's `ArrayData::validate_full` checks for the types segments
//!    hold: buffer sizes and null counts (`validate`, `validate_nulls`),
//!    offsets that start at or after 0, never decrease and end within the
//!    values (or child), strings that are UTF-8 with every offset on a
//!    character boundary. Any other type gets Arrow's own `validate_full`.
//!
//! With dictionaries the decoder is left to validate: reading a delta
//! dictionary runs Arrow's `concat` over decoded arrays before any check
//! here could run.
//!
//! Checked against arrow-rs 60.x (arrow-ipc / arrow-data 60.1.0, see
//! `Cargo.lock`): what `read_record_batch` does without validation and what
//! `validate_full` checks. Re-read both on an Arrow upgrade.

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::DataType;

/// Whether `t` is one of the types segments hold, whose IPC layout
/// [`check_layout`] knows: strings, binaries, booleans, primitives and
/// lists of them.
pub(crate) fn plain_type(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => true,
        DataType::Boolean => true,
        DataType::List(f) | DataType::LargeList(f) => plain_type(f.data_type()),
        t => t.is_primitive(),
    }
}

/// What Arrow's decoder only asserts (a panic, caught but noisy) when it
/// skips validation: that every buffer of a record batch lies in the
/// block's body and is long enough for its field node. Walks the fields in
/// IPC order: each node's validity buffer, then offsets and values.
pub(crate) fn check_layout(
    schema: &arrow_schema::Schema,
    block: &arrow_ipc::Block,
    data: &Buffer,
) -> std::result::Result<(), String> {
    let bytes = data.as_slice();
    let meta = usize::try_from(block.metaDataLength()).map_err(|e| e.to_string())?;
    let header = bytes
        .get(..meta)
        .filter(|h| h.len() >= 8)
        .ok_or("short message")?;
    let message = if header[..4] == [0xff; 4] {
        &header[8..]
    } else {
        &header[4..]
    };
    let message = arrow_ipc::root_as_message(message).map_err(|e| format!("message: {e}"))?;
    // Anything else is Arrow's to report.
    let Some(batch) = message.header_as_record_batch() else {
        return Ok(());
    };
    if batch.compression().is_some() {
        return Err("compressed record batches are not supported".into());
    }
    let body = (bytes.len() - meta) as i64;
    let buffers: Vec<i64> = batch
        .buffers()
        .into_iter()
        .flatten()
        .map(|b| match b.offset().checked_add(b.length()) {
            Some(end) if b.offset() >= 0 && b.length() >= 0 && end <= body => Ok(b.length()),
            _ => Err(format!(
                "buffer at {} of {} bytes is outside the {body}-byte body",
                b.offset(),
                b.length()
            )),
        })
        .collect::<std::result::Result<_, _>>()?;
    let nodes: Vec<(i64, i64)> = batch
        .nodes()
        .into_iter()
        .flatten()
        .map(|n| (n.length(), n.null_count()))
        .collect();
    let (mut node, mut buffer) = (0, 0);
    for f in schema.fields() {
        walk(f.data_type(), &nodes, &buffers, &mut node, &mut buffer)?;
    }
    Ok(())
}

/// [`check_layout`] for one field and its children.
fn walk(
    t: &DataType,
    nodes: &[(i64, i64)],
    buffers: &[i64],
    node: &mut usize,
    buffer: &mut usize,
) -> std::result::Result<(), String> {
    let &(len, nulls) = nodes.get(*node).ok_or("fewer field nodes than fields")?;
    *node += 1;
    if len < 0 || !(0..=len).contains(&nulls) {
        return Err(format!("field node of length {len} with {nulls} nulls"));
    }
    let mut next = |need: i64, what: &str| -> std::result::Result<(), String> {
        let have = *buffers
            .get(*buffer)
            .ok_or("fewer buffers than the fields need")?;
        *buffer += 1;
        if have < need {
            return Err(format!("{what} buffer of {have} bytes, {need} needed"));
        }
        Ok(())
    };
    let bits = |n: i64| n / 8 + i64::from(n % 8 != 0);
    // A node length read from the file may be near i64::MAX: the size of
    // its `len + 1` offsets must not wrap (and pass the check) in release.
    let offsets = |width: i64| -> std::result::Result<i64, String> {
        if len == 0 {
            return Ok(0);
        }
        len.checked_add(1)
            .and_then(|n| n.checked_mul(width))
            .ok_or_else(|| format!("offsets of a field node of length {len} overflow"))
    };
    next(if nulls > 0 { bits(len) } else { 0 }, "validity")?;
    match t {
        DataType::Utf8 | DataType::Binary => {
            next(offsets(4)?, "offsets")?;
            next(0, "values")
        }
        DataType::LargeUtf8 | DataType::LargeBinary => {
            next(offsets(8)?, "offsets")?;
            next(0, "values")
        }
        DataType::Boolean => next(bits(len), "values"),
        DataType::List(f) => {
            next(offsets(4)?, "offsets")?;
            walk(f.data_type(), nodes, buffers, node, buffer)
        }
        DataType::LargeList(f) => {
            next(offsets(8)?, "offsets")?;
            walk(f.data_type(), nodes, buffers, node, buffer)
        }
        t => {
            let width = t.primitive_width().ok_or("not a plain type")? as i64;
            next(len.checked_mul(width).ok_or("length overflows")?, "values")
        }
    }
}

/// Everything Arrow's full validation checks on a decoded batch: each
/// column's type, length and nullability against the schema, then
/// [`validate_array`].
pub(crate) fn validate_batch(batch: &RecordBatch) -> std::result::Result<(), String> {
    let schema = batch.schema();
    if batch.num_columns() != schema.fields().len() {
        return Err(format!(
            "{} columns, the schema has {} fields",
            batch.num_columns(),
            schema.fields().len()
        ));
    }
    for (field, col) in schema.fields().iter().zip(batch.columns()) {
        let problem = if col.data_type() != field.data_type() {
            format!(
                "is {}, the schema says {}",
                col.data_type(),
                field.data_type()
            )
        } else if !field.is_nullable() && col.null_count() > 0 {
            "holds nulls but its field is not nullable".to_owned()
        } else if col.len() != batch.num_rows() {
            format!("has {} rows, the batch {}", col.len(), batch.num_rows())
        } else if let Err(e) = validate_array(&col.to_data()) {
            return Err(format!("column {:?}: {e}", field.name()));
        } else {
            continue;
        };
        return Err(format!("column {:?} {problem}", field.name()));
    }
    Ok(())
}

/// Arrow's `validate_full` for one array and its children, with the value
/// checks of the types segments hold (strings, binaries, lists,
/// primitives) done in vectorized passes; other types get Arrow's own.
fn validate_array(data: &ArrayData) -> std::result::Result<(), String> {
    data.validate().map_err(|e| e.to_string())?;
    data.validate_nulls().map_err(|e| e.to_string())?;
    let child_len = || data.child_data().first().map_or(0, ArrayData::len);
    let values_len = || data.buffers().get(1).map_or(0, Buffer::len);
    match data.data_type() {
        DataType::Utf8 => utf8(data, offsets::<i32>(data, values_len())?)?,
        DataType::LargeUtf8 => utf8(data, offsets::<i64>(data, values_len())?)?,
        DataType::Binary => drop(offsets::<i32>(data, values_len())?),
        DataType::LargeBinary => drop(offsets::<i64>(data, values_len())?),
        DataType::List(_) => drop(offsets::<i32>(data, child_len())?),
        DataType::LargeList(_) => drop(offsets::<i64>(data, child_len())?),
        t if t.is_primitive() || matches!(t, DataType::Boolean | DataType::Null) => {}
        _ => return data.validate_full().map_err(|e| e.to_string()),
    }
    data.child_data().iter().try_for_each(validate_array)
}

/// Checks that the array's offsets start at or after 0, never decrease and
/// end within `limit`; returns the span they cover.
fn offsets<O>(data: &ArrayData, limit: usize) -> std::result::Result<(usize, usize), String>
where
    O: arrow_buffer::ArrowNativeType + Into<i64>,
{
    if data.is_empty() {
        return Ok((0, 0));
    }
    let offs = offset_slice::<O>(data).ok_or("offsets buffer too short")?;
    // One branch-free pass the compiler vectorizes.
    let monotonic = offs
        .windows(2)
        .fold(true, |ok, w| ok & (w[0].into() <= w[1].into()));
    let (first, last) = (offs[0].into(), offs[offs.len() - 1].into());
    if !monotonic || first < 0 {
        return Err("offsets decrease or are negative".into());
    }
    match usize::try_from(last) {
        Ok(end) if end <= limit => Ok((first as usize, end)),
        _ => Err(format!("offset {last} is past the end of {limit} values")),
    }
}

/// The array's `len + 1` offsets (from its first buffer, at its offset);
/// `None` when the buffer is misaligned or too short.
fn offset_slice<O: arrow_buffer::ArrowNativeType>(data: &ArrayData) -> Option<&[O]> {
    let buffer = data.buffers().first()?;
    let aligned = buffer.as_ptr().align_offset(std::mem::align_of::<O>()) == 0;
    if !aligned || buffer.len() % std::mem::size_of::<O>() != 0 {
        return None;
    }
    let start = data.offset();
    // `typed_data` cannot panic now: alignment and length were checked.
    buffer
        .typed_data::<O>()
        .get(start..start.checked_add(data.len())?.checked_add(1)?)
}

/// Checks that the bytes between `span` are UTF-8 and that every offset
/// falls on a character boundary (trivially so when they are ASCII).
fn utf8(data: &ArrayData, (first, last): (usize, usize)) -> std::result::Result<(), String> {
    if data.is_empty() {
        return Ok(());
    }
    let values = data
        .buffers()
        .get(1)
        .and_then(|b| b.as_slice().get(first..last))
        .ok_or("string values buffer too short")?;
    if values.is_ascii() {
        return Ok(());
    }
    let text = std::str::from_utf8(values).map_err(|e| format!("strings are not UTF-8: {e}"))?;
    let boundary = |o: i64| text.is_char_boundary(o as usize - first);
    let ok = match data.data_type() {
        DataType::LargeUtf8 => {
            offset_slice::<i64>(data).is_some_and(|o| o.iter().all(|&o| boundary(o)))
        }
        _ => offset_slice::<i32>(data).is_some_and(|o| o.iter().all(|&o| boundary(o.into()))),
    };
    if ok {
        Ok(())
    } else {
        Err("an offset splits a UTF-8 character".into())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_schema::Field;

    /// An array whose buffers are taken as given, as the decoder builds
    /// them before `validate_batch`.
    fn raw(t: DataType, len: usize, buffers: Vec<Buffer>, child: Option<ArrayData>) -> ArrayData {
        let b = ArrayData::builder(t)
            .len(len)
            .buffers(buffers)
            .child_data(child.into_iter().collect());
        // SAFETY: test inputs; only `validate_array` looks at them.
        unsafe { b.build_unchecked() }
    }

    pub(crate) fn utf8(offsets: &[i32], values: &[u8]) -> ArrayData {
        raw(
            DataType::Utf8,
            offsets.len() - 1,
            vec![
                Buffer::from_slice_ref(offsets),
                Buffer::from_slice_ref(values),
            ],
            None,
        )
    }

    #[test]
    fn strings_are_checked_like_arrow_does() {
        assert_eq!(validate_array(&utf8(&[0, 2, 5], b"abcde")), Ok(()));
        assert_eq!(validate_array(&utf8(&[0, 3, 4], "aéb".as_bytes())), Ok(()));
        let err = |o: &[i32], v: &[u8]| validate_array(&utf8(o, v)).unwrap_err();
        assert!(err(&[0, 3, 2], b"abc").contains("decrease"));
        assert!(validate_array(&utf8(&[-1, 2, 3], b"abc")).is_err());
        assert!(validate_array(&utf8(&[0, 1, 9], b"abc")).is_err());
        assert!(err(&[0, 2, 3], b"a\xffc").contains("UTF-8"));
        assert!(err(&[0, 2, 3], "aéb".as_bytes()).contains("splits"));
    }

    #[test]
    fn list_and_binary_offsets_are_checked() {
        let child = || {
            raw(
                DataType::Int64,
                3,
                vec![Buffer::from_slice_ref([1i64, 2, 3])],
                None,
            )
        };
        let list = |offsets: &[i32]| {
            raw(
                DataType::List(Arc::new(Field::new("item", DataType::Int64, false))),
                offsets.len() - 1,
                vec![Buffer::from_slice_ref(offsets)],
                Some(child()),
            )
        };
        assert_eq!(validate_array(&list(&[0, 1, 3])), Ok(()));
        assert!(validate_array(&list(&[0, 2, 1])).is_err());
        assert!(validate_array(&list(&[0, 1, 4])).is_err());
        let bin = raw(
            DataType::Binary,
            2,
            vec![
                Buffer::from_slice_ref([0i32, 2, 1]),
                Buffer::from_slice_ref(b"ab"),
            ],
            None,
        );
        assert!(validate_array(&bin).unwrap_err().contains("decrease"));
    }
}
