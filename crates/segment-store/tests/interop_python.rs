//! Interop: torchcachex's caches open here and read back exactly
//! `expected.json`; pyarrow reads the segments this crate writes.

use segment_store::{Options, SegmentStore, Structure};
use serde_json::Value;
use tensor_core::{DType, Tensor, TensorView, bf16, f16};

const MODULES: [&str; 5] = [
    "tensor_f32",
    "tensor_f16",
    "tensor_i64",
    "dict_mixed",
    "tuple_pair",
];

fn check_tensor(what: &str, view: &TensorView<'_>, want: &Value) {
    assert_eq!(
        view.dtype().name(),
        want["dtype"].as_str().unwrap(),
        "{what}: dtype"
    );
    let shape: Vec<usize> = want["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(view.shape().dims(), shape.as_slice(), "{what}: shape");
    let data: Vec<f64> = want["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_f64().unwrap())
        .collect();
    assert_eq!(view.to_f64_vec().unwrap(), data, "{what}: data");
}

fn check_part(what: &str, part: &tensor_core::Value, want: &Value) {
    match part {
        tensor_core::Value::Tensor(t) => check_tensor(what, &t.view(), want),
        tensor_core::Value::Blob(b) => {
            let got: Value = serde_pickle::from_slice(b.as_slice(), serde_pickle::DeOptions::new())
                .unwrap_or_else(|e| panic!("{what}: blob is not a pickle: {e}"));
            assert_eq!(&got, want, "{what}: blob");
        }
        other => panic!("{what}: a {} member", other.kind()),
    }
}

fn check_record(what: &str, rec: &tensor_core::Value, want: &Value) {
    match rec {
        tensor_core::Value::Tensor(t) => check_tensor(what, &t.view(), want),
        tensor_core::Value::Dict(parts) => {
            let obj = want.as_object().unwrap();
            assert_eq!(parts.len(), obj.len(), "{what}: dict size");
            for (name, part) in parts {
                check_part(&format!("{what}.{name}"), part, &obj[&**name]);
            }
        }
        tensor_core::Value::Tuple(items) | tensor_core::Value::List(items) => {
            let arr = want.as_array().unwrap();
            assert_eq!(items.len(), arr.len(), "{what}: items");
            for (i, (p, w)) in items.iter().zip(arr).enumerate() {
                check_part(&format!("{what}[{i}]"), p, w);
            }
        }
        tensor_core::Value::Blob(_) => panic!("{what}: no blob records in the fixtures"),
    }
}

#[test]
fn torchcachex_fixtures_read_back_expected_values() {
    let expected = test_support::expected();
    let modules = &expected["torchcachex"]["modules"];
    for module in MODULES {
        let tmp = tempfile::tempdir().unwrap();
        let dir = test_support::copy_fixture(&format!("torchcachex/{module}"), tmp.path());
        let want = modules[module].as_object().unwrap();
        // Open twice: the first open rebuilds our index from the segments,
        // the second reads it from the index log.
        for pass in 0..2 {
            let store = SegmentStore::open(&dir, Options::default()).unwrap();
            assert_eq!(store.len(), want.len(), "{module}: len (pass {pass})");
            let keys: Vec<&str> = want.keys().map(String::as_str).collect();
            let (records, missing) = store.get_batch(&keys).unwrap();
            assert!(missing.is_empty(), "{module}: missing {missing:?}");
            for (k, r) in keys.iter().zip(&records) {
                check_record(&format!("{module}/{k}"), r.as_ref().unwrap(), &want[*k]);
            }
            if module == "tuple_pair" {
                assert_eq!(store.schema().unwrap().structure, Structure::Tuple);
            }
            assert!(store.verify().is_empty(), "{module}: {:?}", store.verify());
        }
    }
}

#[test]
fn torchcachex_fixture_reads_without_writing() {
    // A read-only open of the pristine fixture rebuilds the index in memory.
    let expected = test_support::expected();
    let dir = test_support::fixtures_dir().join("torchcachex/tensor_f16");
    let opts = Options {
        read_only: true,
        ..Options::default()
    };
    let store = SegmentStore::open(&dir, opts).unwrap();
    let (records, missing) = store.get_batch(&["sample_3"]).unwrap();
    assert!(missing.is_empty());
    check_record(
        "tensor_f16/sample_3",
        records[0].as_ref().unwrap(),
        &expected["torchcachex"]["modules"]["tensor_f16"]["sample_3"],
    );
}

#[test]
fn fixture_cache_accepts_new_records_in_its_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = test_support::copy_fixture("torchcachex/dict_mixed", tmp.path());
    {
        let store = SegmentStore::open(&dir, Options::default()).unwrap();
        let rec = tensor_core::Value::dict([
            (
                "features",
                tensor_core::Value::from(Tensor::from_vec([4], vec![9.0f32; 4]).unwrap()),
            ),
            (
                "logits",
                tensor_core::Value::from(
                    Tensor::from_vec([2], vec![f16::from_f32(1.5); 2]).unwrap(),
                ),
            ),
            (
                "label",
                tensor_core::Value::Blob(
                    b"\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00\x8c\x04cls9\x94."
                        .to_vec()
                        .into(),
                ),
            ),
        ]);
        store.put_batch(&[("sample_new", rec)]).unwrap();
        store.flush().unwrap();
    }
    let store = SegmentStore::open(&dir, Options::default()).unwrap();
    assert_eq!(store.len(), 21);
    let (r, missing) = store.get_batch(&["sample_new"]).unwrap();
    assert!(missing.is_empty());
    let label = r[0]
        .as_ref()
        .unwrap()
        .get("label")
        .unwrap()
        .as_blob()
        .unwrap();
    let v: Value = serde_pickle::from_slice(label, serde_pickle::DeOptions::new()).unwrap();
    assert_eq!(v, Value::String("cls9".into()));
}

const PYARROW_DUMP: &str = r#"
import sys, json, glob, os
import pyarrow as pa
out = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "segments", "*.arrow"))):
    r = pa.ipc.open_file(path)
    t = r.read_all()
    meta = {k.decode(): v.decode() for k, v in (r.schema.metadata or {}).items()}
    for row in t.to_pylist():
        key = row.pop("key")
        out[key] = {c: (v.hex() if isinstance(v, bytes) else v) for c, v in row.items()}
    out["__meta__"] = meta
    out["__types__"] = {f.name: str(f.type) for f in r.schema}
print(json.dumps(out))
"#;

#[test]
fn pyarrow_reads_segments_we_write() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // A dict cache with every dtype pyarrow has, plus bf16 and a blob.
    let dir = tmp.path().join("all_dtypes");
    let store = SegmentStore::open(&dir, Options::default()).unwrap();
    let mut items = Vec::new();
    for i in 0..3u8 {
        let mut parts: Vec<(std::sync::Arc<str>, tensor_core::Value)> = Vec::new();
        for d in DType::ALL {
            let n = 2 + usize::from(i);
            let bytes: Vec<u8> = match d {
                DType::Bool => (0..n).map(|j| ((j + usize::from(i)) % 2) as u8).collect(),
                DType::F16 => (0..n)
                    .flat_map(|j| f16::from_f32(j as f32 + f32::from(i)).to_le_bytes())
                    .collect(),
                DType::BF16 => (0..n)
                    .flat_map(|j| bf16::from_f32(j as f32 * 2.0).to_le_bytes())
                    .collect(),
                DType::F32 => (0..n)
                    .flat_map(|j| (j as f32 / 4.0).to_le_bytes())
                    .collect(),
                DType::F64 => (0..n)
                    .flat_map(|j| (j as f64 / 8.0).to_le_bytes())
                    .collect(),
                _ => (0..n * d.size()).map(|j| (j % 7) as u8 + i).collect(),
            };
            let t = Tensor::new(d, [1, n], &bytes).unwrap();
            parts.push((d.name().into(), tensor_core::Value::from(t)));
        }
        parts.push((
            "meta".into(),
            tensor_core::Value::Blob(vec![i, 0xff].into()),
        ));
        items.push((format!("k{i}"), tensor_core::Value::Dict(parts)));
    }
    store.put_batch(&items).unwrap();
    store.flush().unwrap();
    let out = test_support::run_python(&py, PYARROW_DUMP, &[&dir]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["__types__"]["float16_data"], "list<item: halffloat>");
    assert_eq!(got["__types__"]["bfloat16_data"], "list<item: uint16>");
    assert!(
        got["__meta__"]["tensor_keys"]
            .as_str()
            .unwrap()
            .contains("bfloat16")
    );
    for (key, rec) in &items {
        let row = &got[key];
        let tensor_core::Value::Dict(parts) = rec else {
            unreachable!()
        };
        for (name, part) in parts {
            match part {
                tensor_core::Value::Tensor(t) => {
                    let v = t.view();
                    let want: Vec<f64> = if v.dtype() == DType::BF16 {
                        // pyarrow sees the raw uint16 bits.
                        v.bytes()
                            .chunks_exact(2)
                            .map(|c| f64::from(u16::from_le_bytes([c[0], c[1]])))
                            .collect()
                    } else {
                        v.to_f64_vec().unwrap()
                    };
                    let data: Vec<f64> = row[format!("{name}_data")]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| {
                            x.as_f64()
                                .or_else(|| x.as_bool().map(|b| f64::from(u8::from(b))))
                                .unwrap()
                        })
                        .collect();
                    assert_eq!(data, want, "{key}.{name}");
                    let shape: Vec<u64> = row[format!("{name}_shape")]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap())
                        .collect();
                    let dims: Vec<u64> = v.shape().dims().iter().map(|&d| d as u64).collect();
                    assert_eq!(shape, dims, "{key}.{name} shape");
                }
                tensor_core::Value::Blob(b) => {
                    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                    assert_eq!(row[format!("{name}_blob")], Value::String(hex));
                }
                other => panic!("{key}.{name}: a {} member", other.kind()),
            }
        }
    }
}

#[test]
fn pyarrow_reads_a_single_tensor_cache_like_torchcachex() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("single");
    let store = SegmentStore::open(&dir, Options::default()).unwrap();
    let t = Tensor::from_vec([2, 2], vec![1i64, -2, 3, -4]).unwrap();
    store
        .put_batch(&[("a", tensor_core::Value::from(t))])
        .unwrap();
    store.flush().unwrap();
    let out = test_support::run_python(&py, PYARROW_DUMP, &[&dir]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["a"]["data"], serde_json::json!([1, -2, 3, -4]));
    assert_eq!(got["a"]["shape"], serde_json::json!([2, 2]));
    assert_eq!(got["__meta__"]["torch_dtype"], "torch.int64");
    assert_eq!(got["__types__"]["data"], "list<item: int64>");
    // schema.json in torchcachex's shape.
    let js: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("schema.json")).unwrap()).unwrap();
    assert_eq!(js["output_structure"], "tensor");
    assert_eq!(
        js["fields"][1],
        serde_json::json!({"name": "data", "type": "list<int64>"})
    );
}

#[test]
fn pyarrow_reads_tuple_and_blob_caches() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let tuples = tmp.path().join("tuples");
    let store = SegmentStore::open(&tuples, Options::default()).unwrap();
    let rec = tensor_core::Value::Tuple(vec![
        tensor_core::Value::from(Tensor::from_vec([3], vec![0.5f64, 1.5, 2.5]).unwrap()),
        tensor_core::Value::from(Tensor::new(DType::Bool, [2], &[1, 0]).unwrap()),
        tensor_core::Value::Blob(vec![7, 8].into()),
    ]);
    store.put_batch(&[("t", rec)]).unwrap();
    store.flush().unwrap();
    let out = test_support::run_python(&py, PYARROW_DUMP, &[&tuples]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["t"]["item0_data"], serde_json::json!([0.5, 1.5, 2.5]));
    assert_eq!(got["t"]["item1_data"], serde_json::json!([true, false]));
    assert_eq!(got["t"]["item2_blob"], "0708");
    assert_eq!(got["__types__"]["item1_data"], "list<item: bool>");

    let blobs = tmp.path().join("blobs");
    let store = SegmentStore::open(&blobs, Options::default()).unwrap();
    store
        .put_batch(&[("b", tensor_core::Value::blob(vec![1, 2, 255]))])
        .unwrap();
    store.flush().unwrap();
    let out = test_support::run_python(&py, PYARROW_DUMP, &[&blobs]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["b"]["blob"], "0102ff");
    let js: Value =
        serde_json::from_str(&std::fs::read_to_string(blobs.join("schema.json")).unwrap()).unwrap();
    assert_eq!(js["output_structure"], "blob");
}

/// torchcachex's rebuild of `index.pkl` from the segments: ids parsed from
/// the names and sorted numerically, later rows winning.
const TORCHCACHEX_REBUILD: &str = r#"
import sys, json, os, re
import pyarrow as pa
seg_dir = os.path.join(sys.argv[1], "segments")
ids = sorted(int(m.group(1)) for m in
             (re.fullmatch(r"segment_(\d+)\.arrow", n) for n in os.listdir(seg_dir)) if m)
index = {}
for sid in ids:
    t = pa.ipc.open_file(os.path.join(seg_dir, "segment_%06d.arrow" % sid)).read_all()
    for row, key in enumerate(t.column("key").to_pylist()):
        index[key] = (sid, row)
out = {}
for key, (sid, row) in index.items():
    t = pa.ipc.open_file(os.path.join(seg_dir, "segment_%06d.arrow" % sid)).read_all()
    out[key] = t.column("data")[row].as_py()
print(json.dumps(out))
"#;

#[test]
fn torchcachex_rebuild_reads_a_multi_writer_cache() {
    let Some(py) = test_support::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("multi");
    let writers: Vec<SegmentStore> = (0..4)
        .map(|w| {
            let opts = Options {
                writer_id: Some(w),
                flush_every: 5,
                ..Options::default()
            };
            SegmentStore::open(&dir, opts).unwrap()
        })
        .collect();
    // Disjoint keys, and keys every writer writes, in interleaved flushes.
    for round in 0..3 {
        for (w, s) in writers.iter().enumerate() {
            let mut items = Vec::new();
            for i in 0..4 {
                let v = vec![w as f32, round as f32, i as f32];
                items.push((format!("w{w}_r{round}_{i}"), v.clone()));
                items.push((format!("shared_{i}"), v));
            }
            let items: Vec<(String, tensor_core::Value)> = items
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        tensor_core::Value::from(Tensor::from_vec([3], v).unwrap()),
                    )
                })
                .collect();
            s.put_batch(&items).unwrap();
            s.flush().unwrap();
        }
    }
    drop(writers);
    let out = test_support::run_python(&py, TORCHCACHEX_REBUILD, &[&dir]);
    let got: serde_json::Map<String, Value> = serde_json::from_str(out.trim()).unwrap();
    let reader = SegmentStore::open(
        &dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(got.len(), 4 * 3 * 4 + 4);
    assert_eq!(reader.len(), got.len());
    let keys: Vec<&String> = got.keys().collect();
    let (recs, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty());
    for (k, r) in keys.iter().zip(&recs) {
        let ours: Vec<f64> = r
            .as_ref()
            .unwrap()
            .as_tensor()
            .unwrap()
            .view()
            .to_f64_vec()
            .unwrap();
        let theirs: Vec<f64> = got[*k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        // Duplicate keys resolve the same way on both sides.
        assert_eq!(ours, theirs, "{k}");
    }
}
