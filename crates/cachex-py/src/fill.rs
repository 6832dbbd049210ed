//! A batch of page-file or `.beton` samples copied into the caller's
//! buffers (`fill_batch`): the buffers checked against the fields, and the
//! copy itself, which runs with the GIL released.
//!
//! A field's buffer is either one row per sample (`(n, ...)`; bytes zero
//! padded to the row) or, for a bytes field, a ragged pair `(values,
//! offsets)`: the values concatenated into a uint8 buffer and `n + 1`
//! int64 offsets (`offsets[0] = 0`, value `k` is
//! `values[offsets[k]:offsets[k + 1]]`). A ragged pair whose values buffer
//! is too small gets its offsets only and nothing of the batch is copied;
//! the caller grows the buffer to the reported total and fills again.

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensor_core::DType;

use crate::array::{RowSink, dtype_of};
use crate::errors;

/// What one field's buffer of a batch holds: an int64 or float64 per row,
/// the bytes of a value per row, or the field's array per row.
pub enum Column<'s> {
    /// int64 `(n,)`.
    Int,
    /// float64 `(n,)`.
    Float,
    /// uint8 `(n, width)`, zero padded, or a ragged pair.
    Bytes,
    /// The field's dtype, `(n, *shape)`.
    Array(DType, &'s [usize]),
}

/// Where one field's values of a batch go.
pub enum Target<'py> {
    /// One row per sample.
    Rows(Bound<'py, PyUntypedArray>),
    /// A bytes field's values (uint8, 1-D) and offsets (int64, `n + 1`).
    Ragged(Bound<'py, PyUntypedArray>, Bound<'py, PyUntypedArray>),
}

fn array_arg<'py>(name: &str, obj: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    obj.cast_into::<PyUntypedArray>()
        .map_err(|_| errors::invalid(format!("out[{name:?}] must be a numpy array")))
}

/// The caller's buffers `out` (`{field name: numpy array or (values,
/// offsets)}`) for a batch of `n` samples, each checked against what its
/// field holds (`column(name)`: the field's index and [`Column`], or the
/// error for a name it has not): the names with their field indices, and
/// the targets, in `out`'s order.
#[allow(clippy::type_complexity)]
pub fn batch_buffers<'py, 's>(
    out: &Bound<'py, PyDict>,
    n: usize,
    mut column: impl FnMut(&str) -> PyResult<(usize, Column<'s>)>,
) -> PyResult<(Vec<(String, usize)>, Vec<Target<'py>>)> {
    let mut names = Vec::with_capacity(out.len());
    let mut targets = Vec::with_capacity(out.len());
    for (name, buf) in out.iter() {
        let name: String = name.extract()?;
        let (field, kind) = column(&name)?;
        if let Ok(pair) = buf.cast::<PyTuple>() {
            if !matches!(kind, Column::Bytes) || pair.len() != 2 {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: a (values, offsets) pair is for a bytes field"
                )));
            }
            let values = array_arg(&name, pair.get_item(0)?)?;
            let offsets = array_arg(&name, pair.get_item(1)?)?;
            let (vt, ot) = (dtype_of(&values.dtype())?, dtype_of(&offsets.dtype())?);
            if vt != DType::U8 || values.ndim() != 1 {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: values must be 1-D uint8, not {vt} {:?}",
                    values.shape()
                )));
            }
            if ot != DType::I64 || offsets.ndim() != 1 || offsets.shape()[0] < n + 1 {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: offsets must be 1-D int64 of at least {} entries, not {ot} {:?}",
                    n + 1,
                    offsets.shape()
                )));
            }
            names.push((name, field));
            targets.push(Target::Ragged(values, offsets));
            continue;
        }
        let a = array_arg(&name, buf)?;
        let dtype = dtype_of(&a.dtype())?;
        let shape = a.shape().to_vec();
        let ok = match kind {
            Column::Int => dtype == DType::I64 && shape.len() == 1,
            Column::Float => dtype == DType::F64 && shape.len() == 1,
            Column::Bytes => dtype == DType::U8 && shape.len() == 2,
            Column::Array(fd, fs) => dtype == fd && shape.get(1..) == Some(fs),
        };
        if !ok || shape.first().copied().unwrap_or(0) < n {
            return Err(errors::invalid(format!(
                "out[{name:?}]: {dtype} {shape:?} does not fit {n} samples of this field"
            )));
        }
        names.push((name, field));
        targets.push(Target::Rows(a));
    }
    Ok((names, targets))
}

/// One value as a batch buffer takes it.
pub enum Cell<'a> {
    /// An int, written as 8 little-endian bytes.
    Int(i64),
    /// A float, written as 8 little-endian bytes.
    Float(f64),
    /// Bytes or an array's bytes.
    Bytes(&'a [u8]),
}

impl Cell<'_> {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Cell::Int(x) => f(&x.to_le_bytes()),
            Cell::Float(x) => f(&x.to_le_bytes()),
            Cell::Bytes(b) => f(b),
        }
    }

    fn len(&self) -> usize {
        self.with_bytes(<[u8]>::len)
    }
}

/// A [`Target`]'s memory, written with the GIL released.
pub enum Sink<'a> {
    /// One row per sample.
    Rows(RowSink<'a>),
    /// Concatenated values and their offsets.
    Ragged {
        /// The values buffer (one byte a row).
        values: RowSink<'a>,
        /// The offsets (one int64 a row).
        offsets: RowSink<'a>,
    },
}

impl<'a> Sink<'a> {
    /// The sink of `target` (`name` names it in the error).
    pub fn new(name: &str, target: &'a Target<'_>) -> PyResult<Sink<'a>> {
        let what = format!("out[{name:?}]");
        Ok(match target {
            Target::Rows(a) => Sink::Rows(RowSink::new(&what, a)?),
            Target::Ragged(v, o) => Sink::Ragged {
                values: RowSink::new(&what, v)?,
                offsets: RowSink::new(&what, o)?,
            },
        })
    }
}

/// What filling reported for one field.
pub enum Filled {
    /// A row buffer: each value's length in bytes.
    Lengths(Vec<usize>),
    /// A ragged pair: the bytes of all values (more than the values buffer
    /// holds when nothing was copied).
    Total(usize),
    /// A row buffer left as it was: a ragged pair's values did not fit.
    Skipped,
}

/// Why a value was not copied: the sample, the field's position in the
/// sinks, the value's bytes and the room it had.
pub struct TooLarge {
    /// The sample index.
    pub sample: usize,
    /// The field's position among the sinks.
    pub position: usize,
    /// The value's bytes.
    pub len: usize,
    /// The bytes a row has.
    pub room: usize,
}

/// Copies samples `indices` into `sinks` (one per field, in the order
/// `cells` gives the sample's values): `cells(i, out)` appends sample
/// `i`'s cells. Ragged pairs get their offsets first; when any pair's
/// values do not fit, nothing else is copied. Call with the GIL released.
pub fn fill_rows<'r, E>(
    indices: &[usize],
    sinks: &[Sink<'_>],
    mut cells: impl FnMut(usize, &mut Vec<Cell<'r>>) -> Result<(), E>,
    too_large: impl Fn(TooLarge) -> E,
) -> Result<Vec<Filled>, E> {
    let mut row: Vec<Cell<'r>> = Vec::with_capacity(sinks.len());
    let mut totals = vec![0usize; sinks.len()];
    let any_ragged = sinks.iter().any(|s| matches!(s, Sink::Ragged { .. }));
    if any_ragged {
        for sink in sinks {
            if let Sink::Ragged { offsets, .. } = sink {
                offsets.write(0, &0i64.to_le_bytes());
            }
        }
        for (k, &i) in indices.iter().enumerate() {
            row.clear();
            cells(i, &mut row)?;
            for ((sink, cell), total) in sinks.iter().zip(&row).zip(&mut totals) {
                if let Sink::Ragged { offsets, .. } = sink {
                    *total += cell.len();
                    offsets.write(k + 1, &(*total as i64).to_le_bytes());
                }
            }
        }
        let short = sinks.iter().zip(&totals).any(|(sink, &total)| match sink {
            Sink::Ragged { values, .. } => !values.copy_at(total, &[]),
            Sink::Rows(_) => false,
        });
        if short {
            return Ok(sinks
                .iter()
                .zip(totals)
                .map(|(sink, total)| match sink {
                    Sink::Rows(_) => Filled::Skipped,
                    Sink::Ragged { .. } => Filled::Total(total),
                })
                .collect());
        }
    }
    let mut lengths: Vec<Vec<usize>> = sinks
        .iter()
        .map(|s| match s {
            Sink::Rows(_) => Vec::with_capacity(indices.len()),
            Sink::Ragged { .. } => Vec::new(),
        })
        .collect();
    let mut starts = vec![0usize; sinks.len()];
    for (k, &i) in indices.iter().enumerate() {
        row.clear();
        cells(i, &mut row)?;
        for (position, ((sink, cell), (lens, start))) in sinks
            .iter()
            .zip(&row)
            .zip(lengths.iter_mut().zip(&mut starts))
            .enumerate()
        {
            let len = cell.len();
            let (ok, room) = match sink {
                Sink::Rows(rows) => (cell.with_bytes(|b| rows.write(k, b)), rows.stride()),
                // Sized by the first pass: the copy fits.
                Sink::Ragged { values, .. } => {
                    (cell.with_bytes(|b| values.copy_at(*start, b)), len)
                }
            };
            if !ok {
                return Err(too_large(TooLarge {
                    sample: i,
                    position,
                    len,
                    room,
                }));
            }
            match sink {
                Sink::Rows(_) => lens.push(len),
                Sink::Ragged { .. } => *start += len,
            }
        }
    }
    Ok(sinks
        .iter()
        .zip(lengths.into_iter().zip(totals))
        .map(|(sink, (lens, total))| match sink {
            Sink::Rows(_) => Filled::Lengths(lens),
            Sink::Ragged { .. } => Filled::Total(total),
        })
        .collect())
}

/// `fill_rows`' report as Python gets it: `{name: [len, ...]}` for each
/// bytes field in rows (`is_bytes(field)`), `{name: total}` for each
/// ragged pair.
pub fn report<'py>(
    py: Python<'py>,
    names: Vec<(String, usize)>,
    filled: Vec<Filled>,
    is_bytes: impl Fn(usize) -> bool,
) -> PyResult<Bound<'py, PyDict>> {
    let result = PyDict::new(py);
    for ((name, field), filled) in names.into_iter().zip(filled) {
        match filled {
            Filled::Lengths(lens) if is_bytes(field) => result.set_item(name, lens)?,
            Filled::Lengths(_) | Filled::Skipped => {}
            Filled::Total(total) => result.set_item(name, total)?,
        }
    }
    Ok(result)
}
