#![doc = include_str!("../README.md")]
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
