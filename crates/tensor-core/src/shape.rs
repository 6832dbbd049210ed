//! Tensor shapes.

use std::fmt;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::{DType, Result, TensorError};

/// The dimensions of a tensor, outermost first (C order). Rank 0 is a scalar.
///
/// Up to four dimensions are stored inline, so building a view of a typical
/// tensor allocates nothing.
#[derive(PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(SmallVec<[usize; 4]>);

impl Clone for Shape {
    /// One copy of the dimensions: `SmallVec`'s own `clone` extends element
    /// by element, where this copies the slice at once, and readers clone
    /// a shape for every tensor they hand out.
    fn clone(&self) -> Shape {
        Shape(SmallVec::from_slice(&self.0))
    }
}

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl IntoIterator<Item = usize>) -> Shape {
        Shape(dims.into_iter().collect())
    }

    /// The scalar shape `()`.
    pub fn scalar() -> Shape {
        Shape(SmallVec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements, or `None` when it overflows `usize`.
    pub fn numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes a C-order tensor of this shape and `dtype` occupies, overflow-checked.
    pub fn byte_len(&self, dtype: DType) -> Result<usize> {
        self.numel()
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| TensorError::ShapeOverflow {
                dtype,
                shape: self.clone(),
            })
    }

    /// This shape with `outer` prepended: the shape of `outer` stacked rows.
    pub fn prepend(&self, outer: usize) -> Shape {
        let mut dims = SmallVec::with_capacity(self.rank() + 1);
        dims.push(outer);
        dims.extend_from_slice(&self.0);
        Shape(dims)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Formats like Python: `(3, 4)`, `(5,)`, `()`.
impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape(SmallVec::from_slice(dims))
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(SmallVec::from_vec(dims))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape(dims.into_iter().collect())
    }
}
