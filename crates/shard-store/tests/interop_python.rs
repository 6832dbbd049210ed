//! Interop with loadit: its fixture root reads back exactly, and Python's
//! `pickle` and `loadit` read a root that we wrote.

use serde::{Deserialize, Serialize};
use shard_store::{Bytes, Options, PickleValue, ShardStore, verify};

/// The fixture's items: `{"id", "name", "vec", "raw"}` dicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    id: i64,
    name: String,
    vec: Vec<i64>,
    raw: Bytes,
}

fn expected_loadit() -> serde_json::Value {
    test_support::expected()["loadit"].clone()
}

#[test]
fn loadit_fixture_reads_back_exactly_as_typed_records() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = expected_loadit();
    let root = test_support::copy_fixture(exp["root"].as_str().unwrap(), tmp.path());
    let store: ShardStore<Record> = ShardStore::open(&root, Options::default()).unwrap();
    assert_eq!(
        store.max_shard_length(),
        exp["max_shard_length"].as_u64().unwrap()
    );
    assert_eq!(store.len().unwrap(), exp["length"].as_u64().unwrap());
    let items = exp["items"].as_array().unwrap();
    assert_eq!(items.len() as u64, store.len().unwrap());
    for (i, want) in items.iter().enumerate() {
        let got = store.get(i as i64).unwrap();
        assert_eq!(got.id, want["id"].as_i64().unwrap(), "item {i}");
        assert_eq!(got.name, want["name"].as_str().unwrap(), "item {i}");
        let vec: Vec<i64> = want["vec"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(got.vec, vec, "item {i}");
        assert_eq!(hex(&got.raw), want["raw_hex"].as_str().unwrap(), "item {i}");
    }
    // Negative indices and sequential iteration agree with the fixture.
    assert_eq!(
        store.get(-1).unwrap().id,
        items.last().unwrap()["id"].as_i64().unwrap()
    );
    let all: Vec<Record> = store.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), items.len());
    assert!(store.all_cached_to_disk().unwrap());
    assert!(verify(&root).is_empty());
}

#[test]
fn loadit_fixture_reads_as_generic_values() {
    use serde_pickle::{HashableValue as H, Value as V};
    let tmp = tempfile::tempdir().unwrap();
    let exp = expected_loadit();
    let root = test_support::copy_fixture(exp["root"].as_str().unwrap(), tmp.path());
    let store: ShardStore<PickleValue> = ShardStore::open(&root, Options::default()).unwrap();
    for (i, want) in exp["items"].as_array().unwrap().iter().enumerate() {
        let item = store.get(i as i64).unwrap();
        let V::Dict(map) = &item.0 else {
            panic!("item {i} is not a dict: {:?}", item.0)
        };
        let field = |name: &str| map.get(&H::String(name.into())).cloned();
        assert_eq!(field("id"), Some(V::I64(want["id"].as_i64().unwrap())));
        assert_eq!(
            field("name"),
            Some(V::String(want["name"].as_str().unwrap().into()))
        );
        let Some(V::Bytes(raw)) = field("raw") else {
            panic!("item {i}: raw is not bytes")
        };
        assert_eq!(hex(&raw), want["raw_hex"].as_str().unwrap(), "item {i}");
    }
}

/// Lowercase hex, as the fixture's expected.json spells bytes.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Python reads every shard with `pickle.load` and the whole root with
/// loadit (no source), and prints what it read as JSON.
const PY_READ: &str = r#"
import sys, json, pickle, pathlib
root = pathlib.Path(sys.argv[1])
shards = {}
for p in sorted((root / "shards").glob("*.shard.pickle")):
    start, end = map(int, p.name.split(".")[:2])
    with open(p, "rb") as f:
        data = pickle.load(f)
    assert isinstance(data, list) and len(data) == end - start, (p, len(data))
    shards[start] = data
flat = [x for s in sorted(shards) for x in shards[s]]
from loadit import LoadIt
loader = LoadIt(str(root))
assert len(loader) == len(flat), (len(loader), len(flat))
via_loadit = [loader[i] for i in range(len(loader))]
assert via_loadit == flat
assert loader[-1] == flat[-1]
def enc(x):
    if isinstance(x, dict):
        return {k: enc(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [enc(v) for v in x]
    if isinstance(x, bytes):
        return {"bytes": x.hex()}
    return x
print(json.dumps({"len": len(loader), "items": enc(via_loadit), "info": loader.info(),
                  "tuple": isinstance(flat[0]["pair"], tuple), "bytes": isinstance(flat[0]["raw"], bytes)}))
"#;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PyItem {
    id: u64,
    name: String,
    raw: Bytes,
    pair: (i32, f64),
    tags: Vec<String>,
}

fn py_item(i: u64) -> PyItem {
    PyItem {
        id: i,
        name: format!("n{i}"),
        raw: Bytes(vec![i as u8; (i % 5) as usize]),
        pair: (-(i as i32), i as f64 / 4.0),
        tags: (0..i % 3).map(|k| format!("t{k}")).collect(),
    }
}

#[test]
fn python_pickle_and_loadit_read_a_root_we_wrote() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ours");
    let n = 53u64;
    let store = ShardStore::open_with_source(
        &root,
        Options {
            info: Some(serde_json::json!({"made_by": "shard-store"})),
            ..Options::default().shard_items(10)
        },
        move || (0..n).map(py_item),
    )
    .unwrap();
    assert_eq!(store.len().unwrap(), n);
    assert!(store.all_cached_to_disk().unwrap());
    drop(store);
    let out = test_support::run_python(&py, PY_READ, &[&root]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["len"], n);
    assert_eq!(v["info"]["made_by"], "shard-store");
    assert_eq!(v["tuple"], true, "a Rust tuple reads as a Python tuple");
    assert_eq!(v["bytes"], true, "Bytes reads as Python bytes");
    for i in 0..n {
        let want = py_item(i);
        let got = &v["items"][i as usize];
        assert_eq!(got["id"], want.id);
        assert_eq!(got["name"], want.name.as_str());
        assert_eq!(got["raw"]["bytes"], hex(&want.raw).as_str());
        assert_eq!(got["pair"][0], want.pair.0);
        assert_eq!(got["pair"][1].as_f64().unwrap(), want.pair.1);
        assert_eq!(got["tags"].as_array().unwrap().len(), want.tags.len());
    }
}

/// loadit writes a root from a Python generator (partially: only what is
/// touched), then we open it, read what is cached, and fill the rest.
const PY_WRITE: &str = r#"
import sys
from loadit import LoadIt
def items():
    for i in range(45):
        yield {"id": i, "name": f"item{i}", "vec": [i, 2 * i, 3 * i], "raw": bytes([i % 256] * 3)}
loader = LoadIt(sys.argv[1], create_iter=items, max_shard_length=8)
assert loader[3]["id"] == 3
assert loader[20]["id"] == 20
print("ok")
"#;

fn record(i: i64) -> Record {
    Record {
        id: i,
        name: format!("item{i}"),
        vec: vec![i, 2 * i, 3 * i],
        raw: Bytes(vec![(i % 256) as u8; 3]),
    }
}

#[test]
fn we_continue_a_root_that_loadit_started() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("theirs");
    let out = test_support::run_python(&py, PY_WRITE, &[&root]);
    assert_eq!(out.trim(), "ok");
    // Without a source: the cached shards read, the others are NotCached.
    let cached: ShardStore<Record> = ShardStore::open(&root, Options::default()).unwrap();
    assert_eq!(cached.max_shard_length(), 8);
    assert_eq!(*cached.get(3).unwrap(), record(3));
    assert_eq!(*cached.get(20).unwrap(), record(20));
    assert!(matches!(
        cached.get(40),
        Err(shard_store::Error::NotCached { .. })
    ));
    // With a source (the same items): everything, written in loadit's layout.
    let store =
        ShardStore::open_with_source(&root, Options::default(), || (0..45).map(record)).unwrap();
    assert_eq!(store.len().unwrap(), 45);
    for i in 0..45 {
        assert_eq!(*store.get(i).unwrap(), record(i));
    }
    assert!(verify(&root).is_empty());
}
