//! The files are what the Python ecosystem reads: numpy.memmap for the
//! `.bin` arrays, pyarrow for `index.parquet`, `json` for the rest.

mod common;

use serde_json::Value;

const READ_CACHE: &str = r#"
import json, os, sys
import numpy as np
import pyarrow.parquet as pq

d = sys.argv[1]
shapes = json.load(open(os.path.join(d, "shapes.json")))
out = {"rows": shapes["rows"], "arrays": {}, "sidecars": {}}
for a in shapes["arrays"]:
    m = np.memmap(os.path.join(d, a["name"] + ".bin"), dtype=np.dtype(a["dtype"]),
                  mode="r", shape=(shapes["rows"], *a["shape"]))
    assert m.dtype.itemsize * int(np.prod(a["shape"], dtype=np.int64)) == a["row_bytes"]
    out["arrays"][a["name"]] = {"dtype": m.dtype.str, "shape": list(m.shape),
                                "values": m.astype(np.float64).ravel().tolist()}
t = pq.read_table(os.path.join(d, "index.parquet"))
out["columns"] = t.column_names
out["types"] = [str(f.type) for f in t.schema]
out["index"] = t.to_pydict()
out["version"] = t.schema.metadata[b"memmap_array.version"].decode()
for s in shapes["sidecars"]:
    out["sidecars"][s] = json.load(open(os.path.join(d, s + ".json")))
out["fingerprint"] = json.load(open(os.path.join(d, "fingerprint.json")))
print(json.dumps(out))
"#;

#[test]
fn numpy_pyarrow_and_json_read_the_cache() {
    let Some(py) = test_support::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let n = 11;
    drop(common::build(dir.path(), n));
    let out = test_support::run_python(&py, READ_CACHE, &[dir.path()]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"], n);

    // numpy.memmap sees (N, *shape) with the right dtype and values.
    let data = &v["arrays"]["data"];
    assert_eq!(data["dtype"], "<i2");
    assert_eq!(data["shape"], serde_json::json!([n, 2, 3]));
    let mask = &v["arrays"]["mask"];
    assert_eq!(mask["dtype"], "|u1");
    let score = &v["arrays"]["score"];
    assert_eq!(score["dtype"], "<f4");
    assert_eq!(score["shape"], serde_json::json!([n]));
    for i in 0..n {
        let expect_data: Vec<f64> = common::data(i).view().to_f64_vec().unwrap();
        let got: Vec<f64> = data["values"].as_array().unwrap()[i * 6..(i + 1) * 6]
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(got, expect_data, "data row {i}");
        let expect_mask = if i.is_multiple_of(2) {
            common::mask(i).view().to_f64_vec().unwrap()
        } else {
            vec![0.0; 4]
        };
        let got: Vec<f64> = mask["values"].as_array().unwrap()[i * 4..(i + 1) * 4]
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(got, expect_mask, "mask row {i}");
        assert_eq!(score["values"][i].as_f64().unwrap(), i as f64 * 0.5);
    }

    // pyarrow reads the index with the documented columns.
    assert_eq!(
        v["columns"],
        serde_json::json!([
            "row",
            "source",
            "has_data",
            "has_mask",
            "has_score",
            "key_config",
            "meta_json"
        ])
    );
    assert_eq!(
        v["types"],
        serde_json::json!(["int64", "string", "bool", "bool", "bool", "int64", "string"])
    );
    assert_eq!(v["version"], "1");
    let index = &v["index"];
    let sidecar = &v["sidecars"]["config"];
    for i in 0..n {
        assert_eq!(index["row"][i], i);
        assert_eq!(index["source"][i], common::source(i));
        assert_eq!(index["has_data"][i], true);
        assert_eq!(index["has_mask"][i], i.is_multiple_of(2));
        assert_eq!(index["meta_json"][i], common::meta(i));
        // Python's json reads the sidecar; the index key finds the value.
        match index["key_config"][i].as_u64() {
            Some(key) => assert_eq!(sidecar[key.to_string()], common::config(i)),
            None => assert_eq!(i % 5, 0),
        }
    }
    assert_eq!(sidecar.as_object().unwrap().len(), 3);
    assert_eq!(v["fingerprint"], "fp-1");
}

const WRITE_EXPECTED: &str = r#"
import json, os, sys
import numpy as np
d = sys.argv[1]
shapes = json.load(open(os.path.join(d, "shapes.json")))
a = shapes["arrays"][0]
m = np.memmap(os.path.join(d, a["name"] + ".bin"), dtype=a["dtype"], mode="r",
              shape=(shapes["rows"], *a["shape"]))
print(json.dumps({"sum": int(m.astype(np.int64).sum()), "last": m[-1].tolist()}))
"#;

#[test]
fn numpy_reads_a_resumed_cache_without_leftover_bytes() {
    let Some(py) = test_support::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 4);
    for i in 0..6 {
        common::write_row(&mut w, i);
    }
    drop(w); // crash: rows 4 and 5 were never committed
    let mut w = common::writer(dir.path(), 4);
    for i in 4..7 {
        common::write_row(&mut w, i);
    }
    w.finalize().unwrap();
    let out = test_support::run_python(&py, WRITE_EXPECTED, &[dir.path()]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let sum: i64 = (0..7)
        .flat_map(|i| common::data(i).as_slice::<i16>().unwrap().to_vec())
        .map(i64::from)
        .sum();
    assert_eq!(v["sum"], sum);
    let last: Vec<i16> = common::data(6).as_slice::<i16>().unwrap().to_vec();
    assert_eq!(v["last"], serde_json::json!([&last[..3], &last[3..]]));
}
