//! Hostile or malformed input: typed errors, never a panic, never code.

use std::path::Path;

use proptest::prelude::*;
use shard_store::{Error, Options, PickleValue, ShardName, ShardStore, format, verify};

/// Pickles written by CPython 3.11 (hex), each a list holding one value.
const FOO_PROTO4: &str =
    "80049521000000000000005d948c056d796d6f64948c03466f6f9493942981947d948c0161944b017362612e";
const FOO_PROTO2: &str =
    "80025d7100636d796d6f640a466f6f0a7101298171027d710358010000006171044b017362612e";
const NUMPY_ARRAY: &str = "800495a4000000000000005d948c166e756d70792e5f636f72652e6d756c74696172726179948c0c5f7265636f6e7374727563749493948c056e756d7079948c076e6461727261799493944b0085944301629487945294284b014b03859468048c0564747970659493948c02693894898887945294284b038c013c944e4e4e4affffffff4affffffff4b0074946289431800000000000000000100000000000000020000000000000094749462612e";
const OS_SYSTEM: &str = "80025d710063706f7369780a73797374656d0a710158170000006563686f2070776e6564203e202f746d702f70776e65647102857103527104612e";
const DATE: &str =
    "80049523000000000000005d948c086461746574696d65948c0464617465949394430407e401019485945294612e";
/// `[{1, 2}, frozenset([3]), bytearray(b'ab'), (1, 2, 3, 4), b'xy']`, protocol 4.
const BUILTINS_PROTO4: &str = "80049544000000000000005d94288f94284b014b0290284b0391948c086275696c74696e73948c09627974656172726179949394430261629485945294284b014b024b034b0474944302787994652e";
/// `[{1, 2}, bytearray(b'ab'), b'xy']`, protocol 2 (globals of `__builtin__` and `_codecs`).
const BUILTINS_PROTO2: &str = "80025d710028635f5f6275696c74696e5f5f0a7365740a71015d7102284b014b0265857103527104635f5f6275696c74696e5f5f0a6279746561727261790a7105635f636f646563730a656e636f64650a710658020000006162710758060000006c6174696e31710886710952710a85710b52710c680658020000007879710d680886710e52710f652e";
/// `[1, 'a', [2.5]]`, protocol 0.
const PROTO0: &str = "286c70300a49310a6156610a70310a61286c70320a46322e350a61612e";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A root of shard length 8 whose only shard `0.<count>` holds `pickle`.
fn root_with_shard(dir: &Path, count: u64, pickle: &[u8]) {
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    std::fs::write(
        dir.join("metadata.json"),
        format!(r#"{{"max_shard_length": 8, "length": {count}, "length_final": true, "compression": null, "version": 4, "info": null}}"#),
    )
    .unwrap();
    std::fs::write(dir.join(format!("shards/0.{count}.shard.pickle")), pickle).unwrap();
}

fn read_one(pickle: &[u8], count: u64) -> Result<Vec<PickleValue>, Error> {
    let tmp = tempfile::tempdir().unwrap();
    root_with_shard(tmp.path(), count, pickle);
    let store: ShardStore<PickleValue> = ShardStore::open(tmp.path(), Options::default())?;
    (0..count as i64)
        .map(|i| store.get(i).map(|x| x.to_owned_item()))
        .collect()
}

#[test]
fn pickled_python_objects_are_refused_with_a_typed_error() {
    for (what, hex) in [
        ("class instance (protocol 4)", FOO_PROTO4),
        ("class instance (protocol 2)", FOO_PROTO2),
        ("numpy array", NUMPY_ARRAY),
        ("os.system reduce", OS_SYSTEM),
        ("datetime.date", DATE),
    ] {
        let err = read_one(&unhex(hex), 1).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedPickle { .. }),
            "{what}: {err}"
        );
        assert!(
            err.to_string().contains("0.1.shard.pickle"),
            "{what}: {err}"
        );
    }
    let err = read_one(&unhex(OS_SYSTEM), 1).unwrap_err();
    assert!(err.to_string().contains("posix.system"), "{err}");
}

#[test]
fn plain_python_builtins_decode() {
    use serde_pickle::Value as V;
    /// The integers of a list, tuple, set or frozenset.
    fn ints(v: &V) -> Vec<i64> {
        let each = |x: &V| match x {
            V::I64(i) => *i,
            other => panic!("not an int: {other:?}"),
        };
        match v {
            V::List(xs) | V::Tuple(xs) => xs.iter().map(each).collect(),
            V::Set(xs) | V::FrozenSet(xs) => {
                xs.iter().map(|h| each(&h.clone().into_value())).collect()
            }
            other => panic!("not a sequence: {other:?}"),
        }
    }
    let v = read_one(&unhex(BUILTINS_PROTO4), 5).unwrap();
    assert_eq!(ints(&v[0].0), [1, 2]);
    assert_eq!(ints(&v[1].0), [3]);
    assert_eq!(v[2].0, V::Bytes(b"ab".to_vec()));
    assert_eq!(ints(&v[3].0), [1, 2, 3, 4]);
    assert_eq!(v[4].0, V::Bytes(b"xy".to_vec()));
    let v = read_one(&unhex(BUILTINS_PROTO2), 3).unwrap();
    assert_eq!(ints(&v[0].0), [1, 2]);
    assert_eq!(v[1].0, V::Bytes(b"ab".to_vec()));
    assert_eq!(v[2].0, V::Bytes(b"xy".to_vec()));
    let v = read_one(&unhex(PROTO0), 3).unwrap();
    assert_eq!(v[2].0, V::List(vec![V::F64(2.5)]));
}

#[test]
fn every_truncation_of_a_valid_shard_is_an_error() {
    let items: Vec<(u64, String)> = (0..8).map(|i| (i, format!("s{i}"))).collect();
    let p = Path::new("0.8.shard.pickle");
    let bytes = format::encode_shard(p, &items, format::Compression::None).unwrap();
    let name = ShardName { start: 0, end: 8 };
    for cut in 0..bytes.len() {
        let r = format::decode_shard::<(u64, String)>(p, name, &bytes[..cut]);
        assert!(
            matches!(r, Err(Error::CorruptShard { .. })),
            "cut at {cut}: {r:?}"
        );
    }
    assert_eq!(
        format::decode_shard::<(u64, String)>(p, name, &bytes).unwrap(),
        items
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let p = Path::new("0.3.shard.pickle");
        let _ = format::decode_shard::<PickleValue>(p, ShardName { start: 0, end: 3 }, &data);
        let _ = format::check_pickle(p, &data);
    }

    #[test]
    fn mutated_shards_never_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let items: Vec<(u64, String, Vec<f64>)> = (0..5).map(|i| (i, "x".repeat(i as usize), vec![i as f64; 2])).collect();
        let p = Path::new("0.5.shard.pickle");
        let mut bytes = format::encode_shard(p, &items, format::Compression::None).unwrap();
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let _ = format::decode_shard::<(u64, String, Vec<f64>)>(p, ShardName { start: 0, end: 5 }, &bytes);
    }
}

#[test]
fn bad_metadata_values_are_refused() {
    let cases = [
        r#"{"max_shard_length": 8, "length": 0, "length_final": false, "compression": null, "version": 3, "info": null}"#,
        r#"{"max_shard_length": 0, "length": 0, "length_final": false, "compression": null, "version": 4, "info": null}"#,
        r#"{"max_shard_length": 8, "length": 0, "length_final": false, "compression": "gzip", "version": 4, "info": null}"#,
        r#"{"max_shard_length": 8, "length": 0, "length_final": false, "compression": null, "version": 4, "info": null, "extra": 1}"#,
        r#"{"max_shard_length": -8, "length": 0, "length_final": false, "compression": null, "version": 4, "info": null}"#,
        r#"[]"#,
    ];
    for text in cases {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("metadata.json"), text).unwrap();
        let err = ShardStore::<u64>::open(tmp.path(), Options::default()).unwrap_err();
        assert!(matches!(err, Error::BadMetadata { .. }), "{text}: {err}");
    }
}

#[test]
fn an_oversized_metadata_file_is_refused_before_it_is_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("metadata.json");
    // Sparse: one byte over the limit costs no disk.
    std::fs::File::create(&path)
        .unwrap()
        .set_len(format::MAX_METADATA_BYTES + 1)
        .unwrap();
    let err = ShardStore::<u64>::open(tmp.path(), Options::default()).unwrap_err();
    assert!(matches!(err, Error::BadMetadata { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("metadata.json: bad metadata: larger than"),
        "{err}"
    );
}

#[test]
fn junk_in_the_shard_directory_is_ignored_by_reads_and_reported_by_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let items: Vec<u64> = (0..8).collect();
    let p = tmp.path().join("x");
    root_with_shard(
        tmp.path(),
        8,
        &format::encode_shard(&p, &items, format::Compression::None).unwrap(),
    );
    for junk in [
        "notes.txt",
        "a.b.shard.pickle",
        "-1.3.shard.pickle",
        "5.2.shard.pickle",
        "0.8.shard.pickle.gz",
    ] {
        std::fs::write(tmp.path().join("shards").join(junk), b"junk").unwrap();
    }
    let store: ShardStore<u64> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(*store.get(7).unwrap(), 7);
    assert_eq!(verify(tmp.path()).len(), 5);
}

#[test]
fn wrong_item_type_is_an_item_type_error() {
    let tmp = tempfile::tempdir().unwrap();
    let items: Vec<(u64, String)> = (0..8).map(|i| (i, "s".into())).collect();
    let p = tmp.path().join("x");
    root_with_shard(
        tmp.path(),
        8,
        &format::encode_shard(&p, &items, format::Compression::None).unwrap(),
    );
    let store: ShardStore<Vec<f64>> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    let err = store.get(0).unwrap_err();
    assert!(matches!(err, Error::ItemType { .. }), "{err}");
}

#[test]
fn invalid_options_and_missing_roots_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = || 0..10u64;
    for opts in [
        Options {
            max_cache_size: 0,
            ..Options::default()
        },
        Options {
            max_workers: 0,
            ..Options::default()
        },
        Options {
            preload_all_async: true,
            ..Options::default()
        },
        Options::default().shard_items(0),
    ] {
        let err = ShardStore::open_with_source(tmp.path(), opts, src).unwrap_err();
        assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    }
    let err = ShardStore::<u64>::open(tmp.path().join("nope"), Options::default()).unwrap_err();
    assert!(matches!(err, Error::BadMetadata { .. }), "{err}");
    let err =
        ShardStore::open_with_source(tmp.path().join("empty"), Options::default(), || 0..0u64)
            .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "max_shard_length",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn deep_nesting_is_refused_before_decoding() {
    // [[[[ ... ]]]] 5000 levels deep: would overflow a recursive decoder.
    let mut p = vec![0x80, 4, b']'];
    p.extend(std::iter::repeat_n(b']', 5000));
    p.extend(std::iter::repeat_n(b'a', 5000));
    p.push(b'.');
    let err = read_one(&p, 1).unwrap_err();
    assert!(matches!(err, Error::CorruptShard { .. }), "{err}");
    assert!(err.to_string().contains("nesting"), "{err}");
    // Tuples built inside out keep the stack shallow but nest just as deep.
    let mut p = vec![0x80, 4, b']', b'N'];
    p.extend(std::iter::repeat_n(0x85, 5000));
    p.extend([b'a', b'.']);
    let err = read_one(&p, 1).unwrap_err();
    assert!(err.to_string().contains("nesting"), "{err}");
}

#[test]
fn exploding_memo_references_are_refused() {
    // m0 = []; m(k+1) = [m(k), m(k)]: 2^40 nodes from 300 bytes.
    let mut p = vec![0x80, 4, b']', b']', 0x94];
    for k in 0..40u8 {
        p.extend([b']', b'(', b'h', k, b'h', k, b'e', 0x94]);
    }
    p.extend([b'a', b'.']);
    let err = read_one(&p, 1).unwrap_err();
    assert!(matches!(err, Error::CorruptShard { .. }), "{err}");
    assert!(err.to_string().contains("nodes"), "{err}");
}

#[test]
fn garbage_in_a_zstd_shard_is_a_corrupt_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            compression: format::Compression::Zstd,
            ..Options::default().shard_items(4)
        },
        || 0..10u64,
    )
    .unwrap();
    store.len().unwrap();
    drop(store);
    let p = tmp.path().join("shards/4.8.shard.pickle.zstd");
    let mut bytes = std::fs::read(&p).unwrap();
    let cut = bytes.len() / 2;
    bytes.truncate(cut);
    std::fs::write(&p, &bytes).unwrap();
    let reader: ShardStore<u64> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(*reader.get(2).unwrap(), 2);
    let err = reader.get(5).unwrap_err();
    assert!(matches!(err, Error::CorruptShard { .. }), "{err}");
    std::fs::write(&p, b"not zstd at all").unwrap();
    let err = reader.get(5).unwrap_err();
    assert!(matches!(err, Error::CorruptShard { .. }), "{err}");
}
