//! Cache keys: stability, order independence, type tagging.

use std::collections::BTreeMap;

use fingerprint::{CacheKey, FingerprintError, cache_key_dir, canonical_encoding, compute_key};
use proptest::prelude::*;
use serde::Serialize;
use serde_json::json;

#[derive(Serialize)]
struct Config {
    model: &'static str,
    layers: Vec<u32>,
    lr: f64,
    augment: Option<bool>,
    mode: Mode,
}

#[derive(Serialize)]
enum Mode {
    Train { epochs: u16 },
}

fn golden_config() -> Config {
    Config {
        model: "resnet18",
        layers: vec![2, 2, 2, 2],
        lr: 0.1,
        augment: Some(true),
        mode: Mode::Train { epochs: 90 },
    }
}

/// Pins the canonical encoding: if this fails, every cache key of every user
/// changed. Only change it together with `KEY_FORMAT_VERSION`.
#[test]
fn golden_key_is_stable() {
    let key = compute_key(&golden_config()).unwrap();
    assert_eq!(key.as_str(), "e355b8f7d1ff7c26");
}

#[test]
fn golden_encoding_bytes_are_stable() {
    // {"a": 1} as map, count 1, key "a", int 1.
    let bytes = canonical_encoding(&json!({"a": 1})).unwrap();
    let mut expected = vec![b'm'];
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.push(b's');
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.push(b'a');
    expected.push(b'i');
    expected.extend_from_slice(&1i128.to_le_bytes());
    assert_eq!(bytes, expected);
}

#[test]
fn struct_and_equivalent_json_agree() {
    let from_struct = compute_key(&golden_config()).unwrap();
    let from_json = compute_key(&json!({
        "mode": {"Train": {"epochs": 90}},
        "augment": true,
        "lr": 0.1,
        "layers": [2, 2, 2, 2],
        "model": "resnet18",
    }))
    .unwrap();
    assert_eq!(from_struct, from_json);
}

#[test]
fn integers_and_floats_are_tagged() {
    let int = compute_key(&json!({"x": 1})).unwrap();
    let float = compute_key(&json!({"x": 1.0})).unwrap();
    let string = compute_key(&json!({"x": "1"})).unwrap();
    let boolean = compute_key(&json!({"x": true})).unwrap();
    assert_ne!(int, float);
    assert_ne!(int, string);
    assert_ne!(int, boolean);
    // Integer width does not matter.
    assert_eq!(compute_key(&1u8).unwrap(), compute_key(&1i64).unwrap());
    assert_eq!(compute_key(&1u128).unwrap(), compute_key(&1i32).unwrap());
    assert_ne!(
        compute_key(&u128::MAX).unwrap(),
        compute_key(&-1i128).unwrap()
    );
    // f32 widens exactly, so 0.5f32 == 0.5f64 but 0.1f32 != 0.1f64.
    assert_eq!(compute_key(&0.5f32).unwrap(), compute_key(&0.5f64).unwrap());
    assert_ne!(compute_key(&0.1f32).unwrap(), compute_key(&0.1f64).unwrap());
}

#[test]
fn nan_and_negative_zero_are_canonical() {
    let nan_a = f64::NAN;
    let nan_b = f64::from_bits(0x7ff0_0000_0000_0001);
    assert!(nan_b.is_nan());
    assert_eq!(compute_key(&nan_a).unwrap(), compute_key(&nan_b).unwrap());
    assert_eq!(compute_key(&-nan_a).unwrap(), compute_key(&nan_a).unwrap());
    assert_eq!(
        compute_key(&-0.0f64).unwrap(),
        compute_key(&0.0f64).unwrap()
    );
    assert_ne!(
        compute_key(&f64::INFINITY).unwrap(),
        compute_key(&f64::NEG_INFINITY).unwrap()
    );
}

#[test]
fn strings_are_length_prefixed() {
    // Without length prefixes these two lists would encode alike.
    let a = compute_key(&vec!["ab", "c"]).unwrap();
    let b = compute_key(&vec!["a", "bc"]).unwrap();
    assert_ne!(a, b);
    assert_ne!(
        compute_key(&"x").unwrap(),
        compute_key(&b"x".as_slice()).unwrap()
    );
}

#[test]
fn option_some_equals_value_and_none_equals_unit() {
    assert_eq!(compute_key(&Some(3)).unwrap(), compute_key(&3).unwrap());
    assert_eq!(
        compute_key(&None::<i32>).unwrap(),
        compute_key(&()).unwrap()
    );
}

#[test]
fn serialize_errors_are_typed() {
    struct Failing;
    impl Serialize for Failing {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no canonical form"))
        }
    }
    let err = compute_key(&Failing).unwrap_err();
    assert!(matches!(err, FingerprintError::Encode(ref m) if m.contains("no canonical form")));
}

#[test]
fn keys_parse_and_name_directories() {
    let key = compute_key(&json!({"a": 1})).unwrap();
    let parsed: CacheKey = key.as_str().parse().unwrap();
    assert_eq!(parsed, key);
    assert!("ABCDEF0123456789".parse::<CacheKey>().is_err());
    assert!("../etc/passwd0000".parse::<CacheKey>().is_err());
    assert!("abc".parse::<CacheKey>().is_err());
    let dir = cache_key_dir(std::path::Path::new("/cache"), &key);
    assert_eq!(dir, std::path::Path::new("/cache").join(key.as_str()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn map_order_never_matters(entries in prop::collection::vec(("[a-z]{1,6}", any::<i64>()), 0..12), seed in any::<u64>()) {
        let forward: BTreeMap<String, i64> = entries.iter().cloned().collect();
        let mut shuffled: Vec<(String, i64)> = forward.clone().into_iter().collect();
        // A deterministic permutation from the seed.
        let n = shuffled.len();
        if n > 1 {
            for i in 0..n {
                let j = (seed.wrapping_mul(i as u64 + 1) % n as u64) as usize;
                shuffled.swap(i, j);
            }
        }
        let as_json: serde_json::Map<String, serde_json::Value> =
            shuffled.into_iter().map(|(k, v)| (k, json!(v))).collect();
        prop_assert_eq!(compute_key(&forward).unwrap(), compute_key(&as_json).unwrap());
    }

    #[test]
    fn different_values_give_different_keys(a in any::<i64>(), b in any::<i64>()) {
        prop_assume!(a != b);
        prop_assert_ne!(compute_key(&json!({"v": a})).unwrap(), compute_key(&json!({"v": b})).unwrap());
    }
}

#[test]
fn named_cache_dir_is_root_name_key_of_the_identity() {
    let identity =
        fingerprint::cache_identity("memmap-array", "feats", &serde_json::json!({"dim": 2}))
            .unwrap();
    let dir = fingerprint::named_cache_dir(std::path::Path::new("/r"), "feats", &identity).unwrap();
    let key = fingerprint::compute_key(&identity).unwrap();
    assert_eq!(dir, std::path::Path::new("/r/feats").join(key.as_str()));
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
        assert!(matches!(
            fingerprint::named_cache_dir(std::path::Path::new("/r"), bad, &identity),
            Err(fingerprint::FingerprintError::InvalidName(_))
        ));
    }
}
