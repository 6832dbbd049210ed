//! `tensor-core`: the tensor vocabulary every cachex store shares.
//!
//! A [`DType`] (bool, u8 … u64, i8 … i64, f16, bf16, f32, f64) with its
//! size and its names in numpy (`"<f4"`) and torch (`"torch.float32"`); a
//! [`Shape`]; a borrowed [`TensorView`] over little-endian C-order bytes —
//! typically a slice of a memory-mapped cache file — and an owned,
//! 8-byte-aligned [`Tensor`]. With the default `ndarray` feature a view
//! converts to a zero-copy `ndarray::ArrayViewD` and an `ArrayD` to a
//! `Tensor`.
//!
//! [`Value`] is what every cachex backend returns — a tensor, named
//! values, a tuple or list, or a blob — over [`SharedBytes`]: bytes that
//! keep the memory they point into (a mapped file, a decoded record)
//! alive, so a store hands out owned values without copying.
//!
//! The crate does no I/O and has no on-disk format of its own; the stores
//! record a tensor as (dtype name, shape, raw bytes). Every constructor
//! checks that the byte length is `product(shape) * dtype.size()` with
//! overflow-checked arithmetic, and typed access checks dtype, alignment
//! and (for bool) validity, returning a [`TensorError`] rather than
//! panicking — bytes read from disk may be anything.
//!
//! ```
//! use tensor_core::{DType, Tensor, TensorView};
//!
//! // Borrow bytes (e.g. from an mmap) as a 2x3 float32 tensor.
//! let values: Vec<f32> = (0..6).map(|i| i as f32).collect();
//! let owned = Tensor::from_vec([2, 3], values)?;
//! let view: TensorView<'_> = owned.view();
//! assert_eq!(view.dtype().numpy_str()?, "<f4");
//! assert_eq!(view.as_slice::<f32>()?[4], 4.0);
//!
//! // A wrong length is an error, not a panic.
//! assert!(TensorView::new(DType::F32, [2, 3], &owned.bytes()[..20]).is_err());
//!
//! // Zero-copy ndarray view.
//! let array = view.to_ndarray::<f32>()?;
//! assert_eq!(array[[1, 2]], 5.0);
//! # Ok::<(), tensor_core::TensorError>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod dtype;
mod error;
mod shape;
mod tensor;
mod value;

pub use dtype::{DType, Element};
pub use error::{Result, TensorError};
pub use half::{bf16, f16};
pub use shape::Shape;
pub use tensor::{Tensor, TensorView};
pub use value::{SharedBytes, SharedTensor, Value};
