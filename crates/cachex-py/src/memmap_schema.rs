//! The schema of a memmap-array cache in and out of Python: `{name:
//! (dtype, shape)}` with nullable and sidecar names in, `{"arrays": {name:
//! {dtype, shape, nullable}}, "sidecars": [...]}` out.

use memmap_array::Schema;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensor_core::DType;

use crate::{array, errors};

/// Parses a numpy dtype spec (`"float32"`, `np.int16`, a dtype object).
pub fn dtype_arg(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let descr = numpy::PyArrayDescr::new(obj.py(), obj)?;
    array::dtype_of(&descr)
}

/// Builds a schema from `{name: (dtype, shape)}`, the nullable names and
/// the sidecar names.
pub fn schema_arg(
    arrays: &Bound<'_, PyDict>,
    nullable: &[String],
    sidecars: &[String],
) -> PyResult<Schema> {
    let mut b = Schema::builder();
    for (name, spec) in arrays.iter() {
        let name: String = name.extract()?;
        let (dtype, shape): (Bound<'_, PyAny>, Vec<usize>) = spec.extract().map_err(|_| {
            errors::invalid(format!(
                "array {name:?}: give (dtype, shape), e.g. (\"float32\", (3, 4))"
            ))
        })?;
        let dtype = dtype_arg(&dtype)?;
        b = if nullable.contains(&name) {
            b.nullable_array(&name, dtype, shape)
        } else {
            b.array(&name, dtype, shape)
        };
    }
    for s in sidecars {
        b = b.sidecar(s);
    }
    b.build().map_err(errors::to_py)
}

pub fn schema_to_py<'py>(py: Python<'py>, schema: &Schema) -> PyResult<Bound<'py, PyDict>> {
    let arrays = PyDict::new(py);
    for a in schema.arrays() {
        let d = PyDict::new(py);
        d.set_item("dtype", a.dtype().name())?;
        d.set_item("shape", PyTuple::new(py, a.shape().dims())?)?;
        d.set_item("nullable", a.nullable())?;
        arrays.set_item(a.name(), d)?;
    }
    let out = PyDict::new(py);
    out.set_item("arrays", arrays)?;
    out.set_item("sidecars", schema.sidecars().to_vec())?;
    Ok(out)
}
