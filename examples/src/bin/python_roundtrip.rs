//! `python_roundtrip`: write a cache of each kind here, read it in Python
//! with the tools people already use — pyarrow for segment-store (the
//! torchcachex layout), numpy.memmap and pyarrow for memmap-array,
//! `pickle` for shard-store (the loadit layout), numpy structured dtypes
//! for an FFCV `.beton`. Each step prints the Python it runs.
//!
//! Run: `cargo run -p examples --bin python_roundtrip -- [DIR]`
//!
//! The Python is the interpreter in `CACHEX_PYTHON`, else `python3`; it
//! needs numpy and pyarrow (`scripts/test` builds such a venv under
//! `target/py-venv`). Without them the steps are printed, not run.

use std::path::Path;
use std::process::Command;
use tensor_core::Value;

use memmap_array::{NewRow, RowWriter, Schema};
use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
use segment_store::{Options, SegmentStore};
use shard_store::ShardStore;
use tensor_core::{DType, Shape, Tensor};

fn python() -> String {
    std::env::var("CACHEX_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Prints `code`, runs it with `arg`, and returns whether it printed `OK`.
fn run_python(title: &str, code: &str, arg: &Path) -> bool {
    println!(
        "\n== {title}\n$ python - {}\n{}",
        arg.display(),
        code.trim()
    );
    match Command::new(python()).arg("-c").arg(code).arg(arg).output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            println!("--> {}", text.trim());
            text.contains("OK")
        }
        Ok(out) => {
            println!(
                "--> not run here: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            false
        }
        Err(e) => {
            println!("--> not run here: {e}");
            false
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let mut ok = 0;

    // 1. segment-store: Arrow IPC segments with torchcachex's columns.
    let seg = dir.join("features");
    {
        let store = SegmentStore::open(&seg, Options::default())?;
        let items: Vec<(String, Value)> = (0..10)
            .map(|i| {
                Ok((
                    format!("sample_{i}"),
                    Value::from(Tensor::from_vec([2, 3], vec![i as f32; 6])?),
                ))
            })
            .collect::<Result<_, tensor_core::TensorError>>()?;
        store.put_batch(&items)?;
        store.flush()?;
    }
    ok += usize::from(run_python(
        "segment-store -> pyarrow (the torchcachex layout)",
        r#"
import sys, glob, pyarrow as pa
rows = {}
for path in sorted(glob.glob(sys.argv[1] + "/segments/*.arrow")):
    t = pa.ipc.open_file(path).read_all()
    for k, d, s in zip(t["key"].to_pylist(), t["data"].to_pylist(), t["shape"].to_pylist()):
        rows[k] = (d, s)
assert rows["sample_7"] == ([7.0] * 6, [2, 3]), rows["sample_7"]
print("OK", len(rows), "keys; sample_7 shape", rows["sample_7"][1])
"#,
        &seg,
    ));

    // 2. memmap-array: raw .bin arrays, index.parquet, sidecar JSON.
    let mm = dir.join("rows");
    {
        let schema = Schema::builder()
            .array("x", DType::I16, [4])
            .sidecar("tag")
            .build()?;
        let mut w = RowWriter::create_or_resume(&mm, &schema, serde_json::json!({"example": 1}))?;
        for i in 0..5i16 {
            let t = Tensor::from_vec([4], vec![i, -i, i * 10, 7])?;
            let id = format!("src{i}");
            w.write(
                &NewRow::new(&id)
                    .array("x", t.view())
                    .sidecar("tag", "shared"),
            )?;
        }
        w.finalize()?;
    }
    ok += usize::from(run_python(
        "memmap-array -> numpy.memmap + pyarrow.parquet + json",
        r#"
import sys, json, numpy as np, pyarrow.parquet as pq
d = sys.argv[1]
shapes = json.load(open(d + "/shapes.json"))
x = np.memmap(d + "/x.bin", dtype="<i2", mode="r", shape=(5, 4))
idx = pq.read_table(d + "/index.parquet").to_pydict()
assert x[3].tolist() == [3, -3, 30, 7] and idx["source"][3] == "src3"
print("OK", x.shape, idx["source"], json.load(open(d + "/tag.json")))
"#,
        &mm,
    ));

    // 3. shard-store: pickle shards and metadata.json in loadit's layout.
    let sh = dir.join("items");
    {
        let store = ShardStore::open_with_source(
            &sh,
            shard_store::Options::default().shard_items(4),
            || (0..10u32).map(|i| (i, format!("item {i}"))),
        )?;
        store.wait_until_all_cached()?;
    }
    ok += usize::from(run_python(
        "shard-store -> pickle (the loadit layout)",
        r#"
import sys, os, json, pickle
root = sys.argv[1]
meta = json.load(open(root + "/metadata.json"))
items = []
for name in sorted(os.listdir(root + "/shards"), key=lambda n: int(n.split(".")[0])):
    items += pickle.load(open(root + "/shards/" + name, "rb"))
assert items[7] == (7, "item 7") and len(items) == meta["length"] == 10
print("OK", meta["length"], "items;", items[7])
"#,
        &sh,
    ));

    // 4. page-alloc's FFCV writer: a .beton numpy can parse field by field.
    let bt = dir.join("tiny.beton");
    let fields = [
        BetonField::new("label", BetonType::Int),
        BetonField::new(
            "x",
            BetonType::NDArray {
                dtype: DType::F32,
                shape: Shape::from([3]),
            },
        ),
    ];
    let xs: Vec<Tensor> = (0..4)
        .map(|i| Tensor::from_vec([3], vec![i as f32; 3]))
        .collect::<Result<_, _>>()?;
    let samples: Vec<Vec<BetonValue<'_>>> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| {
            vec![
                BetonValue::Int(i as i64 * 11),
                BetonValue::NDArray(x.view()),
            ]
        })
        .collect();
    beton::write(&bt, &fields, &samples)?;
    ok += usize::from(run_python(
        "page-alloc -> FFCV .beton read with numpy",
        r#"
import sys, numpy as np
raw = np.fromfile(sys.argv[1], dtype=np.uint8)
hdr = np.frombuffer(raw[:24], dtype=np.dtype([("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"), ("num_samples", "<u8"), ("alloc_table_ptr", "<u8")]))[0]
meta_at = 24 + 1041 * int(hdr["num_fields"])
row = np.dtype([("label", "<i8"), ("x", "<u8")], align=True)
meta = np.frombuffer(raw[meta_at:meta_at + row.itemsize * int(hdr["num_samples"])], dtype=row)
x2 = np.frombuffer(raw[int(meta["x"][2]):int(meta["x"][2]) + 12], dtype="<f4")
assert hdr["version"] == 2 and meta["label"].tolist() == [0, 11, 22, 33] and x2.tolist() == [2.0] * 3
print("OK", int(hdr["num_samples"]), "samples; labels", meta["label"].tolist())
"#,
        &bt,
    ));

    println!("\n{ok} of 4 Python reads ran and matched");
    if std::env::var_os("CACHEX_PYTHON").is_some() && ok != 4 {
        return Err("CACHEX_PYTHON is set but a Python read failed".into());
    }
    Ok(())
}
