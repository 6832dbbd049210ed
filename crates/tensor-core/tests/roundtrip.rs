//! Round trips: bytes -> view -> ndarray -> tensor -> bytes, for every dtype.

use proptest::prelude::*;
use tensor_core::{DType, Element, Shape, Tensor, TensorError, TensorView, bf16, f16};

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..5, 0..4)
}

/// Bytes that are valid for `dtype` (bools must be 0 or 1).
fn valid_bytes(dtype: DType, raw: &[u8]) -> Vec<u8> {
    if dtype == DType::Bool {
        raw.iter().map(|b| b & 1).collect()
    } else {
        raw.to_vec()
    }
}

fn roundtrip_typed<T: Element + PartialEq + std::fmt::Debug>(dims: &[usize], raw: &[u8]) {
    let shape = Shape::from(dims);
    let len = shape.byte_len(T::DTYPE).unwrap();
    let bytes = valid_bytes(T::DTYPE, &raw[..len]);
    // Owned tensors are aligned, so typed access works on any dtype.
    let staged = Tensor::new(T::DTYPE, shape.clone(), &bytes).unwrap();
    let view = staged.view();
    let array = view.to_ndarray::<T>().unwrap();
    assert_eq!(array.shape(), dims);
    let back = Tensor::from_ndarray(&array);
    assert_eq!(back.bytes(), &bytes[..]);
    assert_eq!(back.dtype(), T::DTYPE);
    assert_eq!(back.shape(), &shape);
    assert_eq!(back, staged);
    assert_eq!(
        back.to_owned().view().to_f64_vec().unwrap().len(),
        shape.numel().unwrap()
    );
}

proptest! {
    #[test]
    fn bytes_view_ndarray_tensor_bytes(dims in shape_strategy(), raw in prop::collection::vec(any::<u8>(), 8 * 64)) {
        roundtrip_typed::<bool>(&dims, &raw);
        roundtrip_typed::<u8>(&dims, &raw);
        roundtrip_typed::<i8>(&dims, &raw);
        roundtrip_typed::<u16>(&dims, &raw);
        roundtrip_typed::<i16>(&dims, &raw);
        roundtrip_typed::<u32>(&dims, &raw);
        roundtrip_typed::<i32>(&dims, &raw);
        roundtrip_typed::<u64>(&dims, &raw);
        roundtrip_typed::<i64>(&dims, &raw);
        roundtrip_typed::<u16>(&dims, &raw);
        roundtrip_typed::<f16>(&dims, &raw);
        roundtrip_typed::<bf16>(&dims, &raw);
        roundtrip_typed::<f32>(&dims, &raw);
        roundtrip_typed::<f64>(&dims, &raw);
    }

    #[test]
    fn wrong_length_is_an_error(dims in shape_strategy(), extra in 1usize..9) {
        let shape = Shape::from(&dims[..]);
        let len = shape.byte_len(DType::F32).unwrap();
        let bytes = vec![0u8; len + extra];
        let err = TensorView::new(DType::F32, shape, &bytes).unwrap_err();
        let is_byte_length = matches!(err, TensorError::ByteLength { .. });
        prop_assert!(is_byte_length);
    }

    #[test]
    fn non_contiguous_ndarray_copies_in_logical_order(rows in 1usize..6, cols in 1usize..6) {
        let a = ndarray::Array2::from_shape_fn((rows, cols), |(r, c)| (r * 10 + c) as i32);
        let t = a.t();
        let tensor = Tensor::from_ndarray(&t);
        let expected: Vec<i32> = t.iter().copied().collect();
        prop_assert_eq!(tensor.as_slice::<i32>().unwrap(), &expected[..]);
        prop_assert_eq!(tensor.shape().dims(), &[cols, rows]);
    }
}

#[test]
fn numpy_strings_round_trip_except_bf16() {
    for dtype in DType::ALL {
        match dtype.numpy_str() {
            Ok(s) => assert_eq!(DType::from_numpy_str(s).unwrap(), dtype, "{s}"),
            Err(e) => {
                assert_eq!(dtype, DType::BF16);
                assert!(e.to_string().contains("bfloat16"), "{e}");
            }
        }
        assert_eq!(DType::from_name(dtype.name()).unwrap(), dtype);
        assert_eq!(DType::from_torch_name(dtype.torch_name()).unwrap(), dtype);
        assert_eq!(dtype.name().parse::<DType>().unwrap(), dtype);
    }
    assert_eq!(DType::from_numpy_str("f4").unwrap(), DType::F32);
    assert_eq!(DType::from_numpy_str("=i8").unwrap(), DType::I64);
    assert_eq!(DType::from_numpy_str("?").unwrap(), DType::Bool);
    assert_eq!(DType::from_numpy_str(">u1").unwrap(), DType::U8);
    assert!(
        DType::from_numpy_str(">f4").is_err(),
        "big-endian is refused"
    );
    assert!(DType::from_numpy_str("<c8").is_err());
    assert!(DType::from_name("").is_err());
    assert_eq!(DType::from_name("halffloat").unwrap(), DType::F16);
}

#[test]
fn dtype_serde_uses_the_canonical_name() {
    let json = serde_json::to_string(&DType::BF16).unwrap();
    assert_eq!(json, "\"bfloat16\"");
    assert_eq!(serde_json::from_str::<DType>(&json).unwrap(), DType::BF16);
    assert!(serde_json::from_str::<DType>("\"complex64\"").is_err());
    let shape = serde_json::to_string(&Shape::from([3, 4])).unwrap();
    assert_eq!(shape, "[3,4]");
}

#[test]
fn typed_access_checks_dtype_alignment_and_bools() {
    let t = Tensor::from_vec([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let err = t.as_slice::<i32>().unwrap_err();
    assert!(matches!(err, TensorError::DTypeMismatch { .. }), "{err}");

    // A view starting one byte into an aligned buffer is misaligned for f32.
    let aligned = Tensor::from_vec([3], vec![0u64; 3]).unwrap();
    let bytes = aligned.bytes();
    let view = TensorView::new(DType::F32, [4], &bytes[1..17]).unwrap();
    let err = view.as_slice::<f32>().unwrap_err();
    assert!(matches!(err, TensorError::Misaligned { .. }), "{err}");
    // Conversions that do not need alignment still work.
    assert_eq!(view.to_f64_vec().unwrap(), vec![0.0; 4]);

    let bad_bool = [0u8, 1, 2];
    let view = TensorView::new(DType::Bool, [3], &bad_bool).unwrap();
    let err = view.as_slice::<bool>().unwrap_err();
    assert_eq!(err, TensorError::InvalidBool { index: 2, byte: 2 });
    assert!(view.to_f64_vec().is_err());
}

#[test]
fn overflowing_shapes_are_errors() {
    let shape = Shape::from([usize::MAX, 2]);
    let err = shape.byte_len(DType::U8).unwrap_err();
    assert!(matches!(err, TensorError::ShapeOverflow { .. }));
    assert!(TensorView::new(DType::U8, shape, &[]).is_err());
    let shape = Shape::from([usize::MAX / 2 + 1]);
    assert!(Tensor::zeros(DType::U16, shape).is_err());
}

#[test]
fn display_reads_like_python() {
    assert_eq!(Shape::from([3, 4]).to_string(), "(3, 4)");
    assert_eq!(Shape::from([5]).to_string(), "(5,)");
    assert_eq!(Shape::scalar().to_string(), "()");
    assert_eq!(Shape::from([2]).prepend(7).dims(), &[7, 2]);
    let err = TensorView::new(DType::F32, [2], &[0u8; 7]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "float32 tensor of shape (2,) needs 8 bytes, got 7"
    );
}

#[test]
fn scalars_and_empty_tensors() {
    let s = Tensor::from_vec(Shape::scalar(), vec![7i64]).unwrap();
    assert_eq!(s.view().numel(), 1);
    assert_eq!(s.as_ndarray::<i64>().unwrap().ndim(), 0);
    let e = Tensor::zeros(DType::F64, [0, 3]).unwrap();
    assert!(e.bytes().is_empty());
    assert_eq!(e.as_ndarray::<f64>().unwrap().shape(), &[0, 3]);
}
