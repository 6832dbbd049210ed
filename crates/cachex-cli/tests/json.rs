//! Values as `cachex get` prints them: pickle items and `$bytes_hex` as
//! JSON, and the table printed without `--json`.

use cache_facade::json::{bytes_json, pickle_to_json};
use cachex_cli::json::value_table;
use serde_json::json;
use shard_store::{Options, PickleValue, ShardStore};

/// `[{1, 2}, frozenset([3]), bytearray(b'ab'), (1, 2, 3, 4), b'xy']`,
/// pickled by CPython 3.11 with protocol 4.
const BUILTINS_PROTO4: &str = "80049544000000000000005d94288f94284b014b0290284b0391948c086275696c74696e73948c09627974656172726179949394430261629485945294284b014b024b034b0474944302787994652e";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn python_builtins_print_as_plain_json() {
    let v: serde_pickle::Value =
        serde_pickle::from_slice(&unhex(BUILTINS_PROTO4), serde_pickle::DeOptions::new()).unwrap();
    assert_eq!(
        pickle_to_json(&v),
        json!([[1, 2], [3], {"$bytes_hex": "6162"}, [1, 2, 3, 4], {"$bytes_hex": "7879"}])
    );
    assert_eq!(
        bytes_json(&[0, 15, 16, 255]),
        json!({"$bytes_hex": "000f10ff"})
    );
}

#[test]
fn every_loadit_fixture_item_prints_as_python_wrote_it() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = test_support::expected();
    let root = test_support::copy_fixture(exp["loadit"]["root"].as_str().unwrap(), tmp.path());
    let store: ShardStore<PickleValue> = ShardStore::open(&root, Options::default()).unwrap();
    for (i, want) in exp["loadit"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let got = pickle_to_json(&store.get(i as i64).unwrap().0);
        assert_eq!(got["id"], want["id"], "item {i}");
        assert_eq!(got["name"], want["name"], "item {i}");
        assert_eq!(got["vec"], want["vec"], "item {i}");
        assert_eq!(got["raw"]["$bytes_hex"], want["raw_hex"], "item {i}");
    }
}

#[test]
fn tables_show_fields_tensors_and_bytes_briefly() {
    let v = json!({
        "label": 7,
        "feature": {"dtype": "float32", "shape": [10], "data": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]},
        "raw": {"$bytes_hex": "00ff"},
        "meta": {"source": "a.wav", "ok": true},
    });
    let table = value_table(&v);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines.contains(&"label    7"), "{table}");
    assert!(
        lines.contains(&"feature  float32 [10] [0, 1, 2, 3, 4, 5, 6, 7, ...]"),
        "{table}"
    );
    assert!(lines.contains(&"raw      2 bytes: 00ff"), "{table}");
    assert!(lines.contains(&"meta:"), "{table}");
    assert!(lines.contains(&"  source  a.wav"), "{table}");
    let long = "x".repeat(500);
    assert!(value_table(&json!(long)).len() < 120);
}
