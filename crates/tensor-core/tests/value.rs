//! `Value` and `SharedBytes`: shared, not copied; checked like views.

use std::sync::Arc;

use tensor_core::{DType, SharedBytes, SharedTensor, Tensor, TensorError, Value};

#[test]
fn projected_bytes_keep_their_owner_alive_and_copy_nothing() {
    let owner = Arc::new(vec![0u8, 1, 2, 3, 4, 5, 6, 7]);
    let bytes = SharedBytes::project(Arc::clone(&owner), |o| &o[4..]);
    assert_eq!(bytes.as_slice().as_ptr(), owner[4..].as_ptr());
    drop(owner);
    // The Arc inside `bytes` still holds the vector.
    assert_eq!(bytes.as_slice(), &[4, 5, 6, 7]);
    let tail = bytes.slice(1..3).unwrap();
    assert_eq!(tail.as_slice(), &[5, 6]);
    assert!(bytes.slice(2..9).is_none());
}

#[test]
fn shared_tensor_checks_length_and_views_in_place() {
    let t = Tensor::from_vec([2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let at = t.bytes().as_ptr();
    let shared = SharedTensor::from(t);
    assert_eq!(shared.view().bytes().as_ptr(), at);
    assert_eq!(shared.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    let short = SharedBytes::from(vec![0u8; 12]);
    assert!(matches!(
        SharedTensor::new(DType::F32, [2, 2], short),
        Err(TensorError::ByteLength {
            expected: 16,
            actual: 12,
            ..
        })
    ));
}

#[test]
fn value_accessors_and_tensor_conversion() {
    let v = Value::Tuple(vec![
        Value::from(Tensor::from_vec([1], vec![7u8]).unwrap()),
        Value::blob(b"x".to_vec()),
    ]);
    assert_eq!(v.kind(), "tuple");
    assert_eq!(v.byte_len(), 2);
    let items = v.items().unwrap();
    assert_eq!(Tensor::try_from(&items[0]).unwrap().bytes(), &[7]);
    assert_eq!(
        Tensor::try_from(&items[1]),
        Err(TensorError::NotATensor("blob"))
    );
    let copy = v.clone();
    assert_eq!(copy, v);
}

#[test]
fn detach_copies_every_member_and_drops_the_owner() {
    let owner = Arc::new(vec![7u8; 16]);
    let mapped = SharedTensor::new(
        DType::F32,
        [2],
        SharedBytes::project(Arc::clone(&owner), |o| &o[8..]),
    )
    .unwrap();
    let v = Value::dict([
        ("t", Value::Tensor(mapped)),
        (
            "b",
            Value::Blob(SharedBytes::project(Arc::clone(&owner), |o| &o[..3])),
        ),
    ]);
    let detached = v.detach();
    assert_eq!(detached, v);
    let t = detached.get("t").and_then(Value::as_tensor).unwrap();
    assert_ne!(t.bytes().as_ptr(), owner[8..].as_ptr());
    assert_eq!(t.as_slice::<f32>().unwrap().len(), 2);
    drop(v);
    // Only `owner` itself is left: the detached value holds no share.
    assert_eq!(Arc::strong_count(&owner), 1);
}
