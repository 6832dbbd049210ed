//! What a writer consumes: values of one sample, or a [`SampleSource`] that
//! describes samples and then fills their bytes in place, inside the page.

use crate::BoxError;

/// One field value of a sample handed to [`crate::PageWriter::append`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// Value of an [`crate::FieldType::Int`] field.
    Int(i64),
    /// Value of an [`crate::FieldType::Float`] field.
    Float(f64),
    /// Value of a [`crate::FieldType::Bytes`] or [`crate::FieldType::Array`]
    /// field (an array's little-endian bytes, of exactly its shape's size).
    Bytes(&'a [u8]),
}

/// The description of one field of one sample, filled in by
/// [`SampleSource::describe`]. The writer passes one slot per schema field,
/// pre-set to the field's kind: `Int(0)`, `Float(0.0)`, or `Size(n)` with
/// `n` = 0 for bytes and the exact size for arrays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slot {
    /// The inline value of an int field.
    Int(i64),
    /// The inline value of a float field.
    Float(f64),
    /// The byte size of a bytes or array field's value.
    Size(u64),
}

/// The byte regions of one sample inside its writer thread's page buffer:
/// `malloc`ed by the writer from the sizes [`SampleSource::describe`] gave,
/// zeroed, for [`SampleSource::fill`] to write into.
#[derive(Debug)]
pub struct SampleOut<'b> {
    buf: &'b mut [u8],
    ranges: &'b [Option<(usize, usize)>],
}

impl<'b> SampleOut<'b> {
    pub(crate) fn new(buf: &'b mut [u8], ranges: &'b [Option<(usize, usize)>]) -> SampleOut<'b> {
        SampleOut { buf, ranges }
    }

    /// The region of field `index` (`None` for inline fields and indices
    /// past the schema). Its length is the size `describe` gave.
    pub fn field(&mut self, index: usize) -> Option<&mut [u8]> {
        let (start, len) = (*self.ranges.get(index)?)?;
        self.buf.get_mut(start..start.checked_add(len)?)
    }
}

/// A numbered collection of samples that a writer places and fills in
/// parallel. The layout is planned from [`describe`](Self::describe) in
/// sample order, then writer threads call [`fill`](Self::fill) for the
/// samples of the pages they own, so the file's bytes do not depend on the
/// thread count. Both methods must be deterministic.
pub trait SampleSource: Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether there is no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets the inline values and the byte sizes of sample `index`, one
    /// slot per schema field (see [`Slot`]).
    fn describe(&self, index: usize, slots: &mut [Slot]) -> Result<(), BoxError>;

    /// Writes the bytes of sample `index` into the regions of `out`.
    fn fill(&self, index: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError>;
}

/// Every sample as a list of [`Value`]s, one per schema field.
impl SampleSource for [Vec<Value<'_>>] {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }

    fn describe(&self, index: usize, slots: &mut [Slot]) -> Result<(), BoxError> {
        let values = self.get(index).ok_or("sample index out of range")?;
        describe_values(values, slots)
    }

    fn fill(&self, index: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError> {
        let values = self.get(index).ok_or("sample index out of range")?;
        fill_values(values, out)
    }
}

pub(crate) fn describe_values(values: &[Value<'_>], slots: &mut [Slot]) -> Result<(), BoxError> {
    if values.len() != slots.len() {
        return Err(format!(
            "{} values for a schema of {} fields",
            values.len(),
            slots.len()
        )
        .into());
    }
    for (i, (slot, value)) in slots.iter_mut().zip(values).enumerate() {
        match (slot, value) {
            (Slot::Int(s), Value::Int(v)) => *s = *v,
            (Slot::Float(s), Value::Float(v)) => *s = *v,
            (Slot::Size(s), Value::Bytes(b)) => *s = b.len() as u64,
            (slot, value) => {
                return Err(format!("field {i}: a {value:?} given for a {slot:?} field").into());
            }
        }
    }
    Ok(())
}

pub(crate) fn fill_values(values: &[Value<'_>], out: &mut SampleOut<'_>) -> Result<(), BoxError> {
    for (i, value) in values.iter().enumerate() {
        if let (Value::Bytes(b), Some(dst)) = (value, out.field(i)) {
            if dst.len() != b.len() {
                return Err(
                    format!("field {i}: value changed size between describe and fill").into(),
                );
            }
            dst.copy_from_slice(b);
        }
    }
    Ok(())
}

/// One sample as a source of length 1 (what `append` writes).
pub(crate) struct OneSample<'s, 'a>(pub &'s [Value<'a>]);

impl SampleSource for OneSample<'_, '_> {
    fn len(&self) -> usize {
        1
    }

    fn describe(&self, _index: usize, slots: &mut [Slot]) -> Result<(), BoxError> {
        describe_values(self.0, slots)
    }

    fn fill(&self, _index: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError> {
        fill_values(self.0, out)
    }
}
