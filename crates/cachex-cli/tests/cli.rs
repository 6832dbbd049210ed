//! The cachex binary, run as a real process on real caches.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn cachex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachex"))
        .args(args)
        .output()
        .expect("spawn cachex")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok(args: &[&str]) -> String {
    let out = cachex(args);
    assert!(
        out.status.success(),
        "cachex {args:?} failed: {}\n{}{}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The demo at a small size, returning the cache directory it made.
fn demo_cache(root: &Path) -> std::path::PathBuf {
    let text = ok(&["demo", "--dir", p(root), "--n", "150", "--cost-ms", "0.1"]);
    assert!(text.contains("speed-up of the cached epoch"), "{text}");
    assert!(text.contains("100.0%"), "second epoch is all hits: {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("look inside:"))
        .expect("pointer to inspect");
    let dir = line.rsplit(' ').next().unwrap();
    std::path::PathBuf::from(dir)
}

#[test]
fn demo_then_inspect_verify_get_stats_compact() {
    let root = tempfile::tempdir().unwrap();
    let dir = demo_cache(root.path());

    let table = ok(&["inspect", p(&dir)]);
    assert!(
        table.contains("kind: segment-store") && table.contains("entries: 150"),
        "{table}"
    );
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&dir), "--json"])).unwrap();
    assert_eq!(json["kind"], "segment-store");
    assert_eq!(json["entries"], 150);
    assert_eq!(json["schema"]["output_structure"], "tensor");

    assert!(ok(&["verify", p(&dir)]).contains("sound"));

    let rec: Value = serde_json::from_str(&ok(&["get", p(&dir), "img_0000007", "--json"])).unwrap();
    assert_eq!(rec["dtype"], "float32");
    assert_eq!(rec["shape"], serde_json::json!([256]));
    let expected = cachex_cli::demo::synthetic_feature(7, 256);
    let got: Vec<f32> = rec["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, expected);

    let missing = cachex(&["get", p(&dir), "nope", "--json"]);
    assert_eq!(missing.status.code(), Some(1), "a key not in the cache");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no record with key \"nope\""));

    assert!(ok(&["stats", p(&dir)]).contains("entries: 150"));
    assert!(ok(&["compact", p(&dir)]).contains("150 live rows kept"));
    assert!(ok(&["verify", p(&dir)]).contains("sound"));
}

#[test]
fn multi_writer_caches_inspect_verify_and_compact() {
    use segment_store::{Options, SegmentStore};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ranks");
    for w in 0..3u32 {
        let s = SegmentStore::open(
            &dir,
            Options {
                writer_id: Some(w),
                ..Options::default()
            },
        )
        .unwrap();
        let items: Vec<(String, tensor_core::Value)> = (0..5)
            .map(|i| {
                let t = tensor_core::Tensor::from_vec([2], vec![w as f32, i as f32]).unwrap();
                (format!("r{w}_{i}"), tensor_core::Value::from(t))
            })
            .collect();
        s.put_batch(&items).unwrap();
        s.flush().unwrap();
    }
    let table = ok(&["inspect", p(&dir)]);
    assert!(
        table.contains("kind: segment-store") && table.contains("entries: 15"),
        "{table}"
    );
    assert!(table.contains("writer-0002.log"), "{table}");
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&dir), "--json"])).unwrap();
    assert_eq!(json["kind"], "segment-store");
    assert!(json.to_string().contains("writer-0001.log"), "{json}");
    assert!(ok(&["verify", p(&dir)]).contains("sound"));
    // A writer log that lies about a segment is found.
    let log = dir.join("writers").join("writer-0001.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&log, &bytes).unwrap();
    let bad = cachex(&["verify", p(&dir)]);
    assert_eq!(bad.status.code(), Some(1), "{}", stdout(&bad));
    assert!(stdout(&bad).contains("writer-0001.log"), "{}", stdout(&bad));
    std::fs::write(&log, {
        bytes[last] ^= 0xff;
        &bytes
    })
    .unwrap();
    assert!(ok(&["compact", p(&dir)]).contains("15 live rows kept"));
    assert!(ok(&["verify", p(&dir)]).contains("sound"));
    let rec: Value = serde_json::from_str(&ok(&["get", p(&dir), "r2_4", "--json"])).unwrap();
    assert_eq!(rec["data"], serde_json::json!([2.0, 4.0]));
}

#[test]
fn verify_names_the_corrupt_file_and_exits_1() {
    let root = tempfile::tempdir().unwrap();
    let dir = demo_cache(root.path());
    let seg = dir.join("segments/segment_000000.arrow");
    let mut bytes = std::fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xff;
    }
    std::fs::write(&seg, &bytes).unwrap();
    let out = cachex(&["verify", p(&dir)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("segment_000000.arrow"),
        "{}",
        stdout(&out)
    );

    std::fs::write(&seg, &bytes[..100]).unwrap();
    let out = cachex(&["verify", p(&dir)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("segment_000000.arrow"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn torchcachex_fixtures_read_as_python_wrote_them() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = test_support::expected();
    let dir = test_support::copy_fixture("torchcachex/dict_mixed", tmp.path());
    let table = ok(&["inspect", p(&dir)]);
    assert!(table.contains("kind: torchcachex"), "{table}");
    assert!(ok(&["verify", p(&dir)]).contains("sound"));
    let rec: Value = serde_json::from_str(&ok(&["get", p(&dir), "sample_3", "--json"])).unwrap();
    let want = &expected["torchcachex"]["modules"]["dict_mixed"]["sample_3"];
    assert!(
        want.is_object(),
        "expected.json has dict_mixed/sample_3: {want}"
    );
    for (name, tensor) in want.as_object().unwrap() {
        if let Some(data) = tensor.get("data") {
            let got = &rec[name]["data"];
            let a: Vec<f64> = got
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let b: Vec<f64> = data
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(a, b, "{name}");
        }
    }
    // A compact refuses the Python tool's directory rather than rewriting it.
    let out = cachex(&["compact", p(&dir)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("this is torchcachex"));
}

#[test]
fn usage_errors_and_unknown_paths_exit_2() {
    assert_eq!(cachex(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(cachex(&["get"]).status.code(), Some(2));
    let tmp = tempfile::tempdir().unwrap();
    for cmd in ["inspect", "verify", "stats"] {
        let out = cachex(&[cmd, p(&tmp.path().join("none"))]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
        let out = cachex(&[cmd, p(tmp.path())]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a cache cachex knows"));
    }
    let out = cachex(&["demo", "--temp", "--cost-ms", "-1"]);
    assert_eq!(out.status.code(), Some(2), "--cost-ms out of range");
    let out = cachex(&["demo", "--temp", "--dir", p(tmp.path())]);
    assert_eq!(out.status.code(), Some(2), "--temp and --dir conflict");
}

#[test]
fn page_alloc_files_inspect_get_and_verify() {
    use page_alloc::{PageWriter, Schema, Value as PValue, WriterOptions};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("train.pages");
    let schema = Schema::new().int("label").bytes("jpeg");
    let mut writer = PageWriter::create(&path, schema, WriterOptions::default()).unwrap();
    for i in 0..20i64 {
        let bytes = vec![i as u8; 100 + i as usize];
        writer
            .append(&[PValue::Int(i * 3), PValue::Bytes(&bytes)])
            .unwrap();
    }
    writer.finalize().unwrap();

    assert!(ok(&["inspect", p(&path)]).contains("kind: page-alloc"));
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&path), "--json"])).unwrap();
    assert_eq!(json["num_samples"], 20);
    let rec: Value = serde_json::from_str(&ok(&["get", p(&path), "-1", "--json"])).unwrap();
    assert_eq!(rec["label"], 57);
    assert_eq!(rec["jpeg"]["$bytes_hex"].as_str().unwrap().len(), 2 * 119);
    assert!(ok(&["verify", p(&path)]).contains("sound"));

    // A flipped byte in a page: verify names the file and exits 1.
    // (a byte of sample 7's value, 107 7s, wherever the data pages start).
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(107).position(|w| w == [7u8; 107]).unwrap() + 50;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let out = cachex(&["verify", p(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("train.pages"), "{}", stdout(&out));
}

#[test]
fn beton_fixtures_read_as_ffcv_wrote_them() {
    let expected = test_support::expected();
    for file in ["small_w1.beton", "small_w2.beton"] {
        let path = test_support::fixtures_dir().join("ffcv").join(file);
        let table = ok(&["inspect", p(&path)]);
        assert!(table.contains("samples: 40"), "{table}");
        assert!(ok(&["verify", p(&path)]).contains("sound"));
        for want in expected["ffcv"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .step_by(7)
        {
            let i = want["index"].as_u64().unwrap().to_string();
            let rec: Value = serde_json::from_str(&ok(&["get", p(&path), &i, "--json"])).unwrap();
            assert_eq!(rec["id"], want["id"], "{file} {i}");
            assert_eq!(rec["score"], want["score"], "{file} {i}");
            assert_eq!(rec["blob"]["$bytes_hex"], want["blob_hex"], "{file} {i}");
            assert_eq!(rec["arr"]["data"], want["arr"]["data"], "{file} {i}");
            assert_eq!(rec["meta"], want["meta"], "{file} {i}");
        }
    }
    // A truncated copy is reported, not read.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("cut.beton");
    let bytes = std::fs::read(test_support::fixtures_dir().join("ffcv/small_w1.beton")).unwrap();
    std::fs::write(&copy, &bytes[..bytes.len() - 30]).unwrap();
    let out = cachex(&["verify", p(&copy)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("cut.beton"), "{}", stdout(&out));
}

#[test]
fn memmap_array_caches_inspect_get_and_verify() {
    use memmap_array::{NewRow, RowWriter, Schema};
    use tensor_core::{DType, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rows");
    let schema = Schema::builder()
        .array("x", DType::I16, [2, 3])
        .nullable_array("y", DType::F32, [4])
        .sidecar("tag")
        .build()
        .unwrap();
    let mut w = RowWriter::create_or_resume(&dir, &schema, serde_json::json!({"t": 1})).unwrap();
    for i in 0..10i16 {
        let x = Tensor::from_vec([2, 3], vec![i; 6]).unwrap();
        let y = Tensor::from_vec([4], vec![i as f32 * 0.5; 4]).unwrap();
        let id = format!("src{i}");
        let row = NewRow::new(&id)
            .array("x", x.view())
            .sidecar("tag", "common");
        let row = if i % 3 == 0 {
            row.null("y")
        } else {
            row.array("y", y.view())
        };
        w.write(&row).unwrap();
    }
    w.finalize().unwrap();

    assert!(ok(&["inspect", p(&dir)]).contains("kind: memmap-array"));
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&dir), "--json"])).unwrap();
    assert_eq!(json["rows"], 10);
    assert_eq!(json["complete"], true);
    let by_source: Value = serde_json::from_str(&ok(&["get", p(&dir), "src4", "--json"])).unwrap();
    assert_eq!(
        by_source["arrays"]["x"]["data"],
        serde_json::json!([4, 4, 4, 4, 4, 4])
    );
    assert_eq!(
        by_source["arrays"]["y"]["data"],
        serde_json::json!([2.0, 2.0, 2.0, 2.0])
    );
    assert_eq!(by_source["sidecars"]["tag"], "common");
    let by_index: Value = serde_json::from_str(&ok(&["get", p(&dir), "3", "--json"])).unwrap();
    assert_eq!(by_index["source"], "src3");
    assert_eq!(
        by_index["arrays"]["y"],
        Value::Null,
        "absent array prints as null"
    );
    assert!(ok(&["verify", p(&dir)]).contains("sound"));

    // A short .bin is named by verify.
    let bin = dir.join("x.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let out = cachex(&["verify", p(&dir)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("x.bin"), "{}", stdout(&out));
}

#[test]
fn loadit_roots_read_as_loadit_wrote_them() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = test_support::expected();
    let root = test_support::copy_fixture("loadit/records", tmp.path());
    let table = ok(&["inspect", p(&root)]);
    assert!(
        table.contains("shard-store") && table.contains("length: 150"),
        "{table}"
    );
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&root), "--json"])).unwrap();
    assert_eq!(json["shards"], 5);
    assert!(ok(&["verify", p(&root)]).contains("sound"));
    for i in [0usize, 31, 32, 149] {
        let want = &expected["loadit"]["items"][i];
        let got: Value =
            serde_json::from_str(&ok(&["get", p(&root), &i.to_string(), "--json"])).unwrap();
        assert_eq!(got["id"], want["id"]);
        assert_eq!(got["vec"], want["vec"]);
        assert_eq!(got["raw"]["$bytes_hex"], want["raw_hex"]);
    }
    let last: Value = serde_json::from_str(&ok(&["get", p(&root), "-1", "--json"])).unwrap();
    assert_eq!(last["id"], 149);
    // Without --json: a table, one field a line.
    let table = ok(&["get", p(&root), "-1"]);
    assert!(serde_json::from_str::<Value>(&table).is_err(), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["id", "149"]),
        "{table}"
    );
    let out = cachex(&["get", p(&root), "first"]);
    assert_eq!(out.status.code(), Some(2), "an index cache takes no key");
    let out = cachex(&["get", p(&root), "150"]);
    assert_eq!(out.status.code(), Some(1), "out of range");
    // A truncated shard is named.
    let shard = root.join("shards/32.64.shard.pickle");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let out = cachex(&["verify", p(&root)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("32.64.shard.pickle"),
        "{}",
        stdout(&out)
    );
}
