//! One check contract over every kind of cache, through the real binary:
//! `verify` problems of one shape, exit codes 0 / 1 / 2, `stats` that says
//! what `inspect` does not, `get` as a table or as JSON, and `.beton`
//! detection by header.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn cachex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachex"))
        .args(args)
        .output()
        .expect("spawn cachex")
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(args: &[&str], code: i32) -> String {
    let out = cachex(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "cachex {args:?}: {}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

fn json(args: &[&str]) -> Value {
    let text = run(args, 0);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("cachex {args:?}: {e}: {text}"))
}

/// One cache of a kind, a key or index it holds, and how to damage it.
struct Case {
    kind: &'static str,
    path: PathBuf,
    key: &'static str,
    damage: Box<dyn Fn(&Path)>,
    /// The kind of problem the damage must be reported as, when one kind
    /// is certain.
    expect: Option<&'static str>,
}

fn truncate(file: PathBuf, by: u64) -> Box<dyn Fn(&Path)> {
    Box::new(move |_| {
        let len = std::fs::metadata(&file).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(len - by.min(len / 2).max(1))
            .unwrap();
    })
}

fn cases(tmp: &Path) -> Vec<Case> {
    use tensor_core::{DType, Tensor};
    let mut out = Vec::new();

    let seg = tmp.join("segments");
    {
        use segment_store::{Options, SegmentStore};
        let store = SegmentStore::open(&seg, Options::default()).unwrap();
        for i in 0..20 {
            let t = Tensor::from_vec([4], vec![i as f32; 4]).unwrap();
            store
                .put_batch(&[(format!("k{i}").as_str(), tensor_core::Value::from(t))])
                .unwrap();
        }
        store.flush().unwrap();
    }
    out.push(Case {
        kind: "segment-store",
        key: "k3",
        damage: truncate(seg.join("segments/segment_000000.arrow"), 1 << 20),
        expect: Some("truncated"),
        path: seg,
    });

    let torch = test_support::copy_fixture("torchcachex/tensor_f32", tmp);
    let first_segment = std::fs::read_dir(torch.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    out.push(Case {
        kind: "torchcachex",
        key: "sample_0",
        damage: truncate(first_segment, 1 << 20),
        expect: None,
        path: torch,
    });

    let rows = tmp.join("rows");
    {
        use memmap_array::{NewRow, RowWriter, Schema};
        let schema = Schema::builder()
            .array("x", DType::I16, [3])
            .build()
            .unwrap();
        let mut w = RowWriter::create_or_resume(&rows, &schema, serde_json::json!({})).unwrap();
        for i in 0..6i16 {
            let x = Tensor::from_vec([3], vec![i; 3]).unwrap();
            let id = format!("src{i}");
            w.write(&NewRow::new(&id).array("x", x.view())).unwrap();
        }
        w.finalize().unwrap();
    }
    out.push(Case {
        kind: "memmap-array",
        key: "src2",
        damage: truncate(rows.join("x.bin"), 5),
        expect: Some("truncated"),
        path: rows,
    });

    let loadit = test_support::copy_fixture("loadit/records", tmp);
    out.push(Case {
        kind: "shard-store",
        key: "31",
        damage: truncate(loadit.join("shards/32.64.shard.pickle"), 1 << 20),
        expect: None,
        path: loadit,
    });

    let pages = tmp.join("train.pages");
    {
        use page_alloc::{PageWriter, Schema, Value as PValue, WriterOptions};
        let schema = Schema::new().int("label").bytes("jpeg");
        let mut w = PageWriter::create(&pages, schema, WriterOptions::default()).unwrap();
        for i in 0..10i64 {
            let bytes = vec![i as u8; 50];
            w.append(&[PValue::Int(i), PValue::Bytes(&bytes)]).unwrap();
        }
        w.finalize().unwrap();
    }
    let flipped = pages.clone();
    out.push(Case {
        kind: "page-alloc",
        key: "-1",
        damage: Box::new(move |_| {
            // A byte of sample 5's value (fifty 5s), wherever the format
            // version puts the data pages.
            let mut bytes = std::fs::read(&flipped).unwrap();
            let at = bytes.windows(50).position(|w| w == [5u8; 50]).unwrap();
            bytes[at + 10] ^= 0x20;
            std::fs::write(&flipped, bytes).unwrap();
        }),
        expect: Some("checksum-mismatch"),
        path: pages,
    });

    let beton = test_support::copy_fixture("ffcv/small_w1.beton", tmp);
    out.push(Case {
        kind: "beton",
        key: "5",
        damage: truncate(beton.clone(), 30),
        expect: None,
        path: beton,
    });
    out
}

const KINDS: [&str; 9] = [
    "missing",
    "truncated",
    "checksum-mismatch",
    "structure",
    "stale",
    "foreign-version",
    "unindexed",
    "interrupted",
    "io",
];

#[test]
fn every_kind_answers_every_command_in_one_shape() {
    let tmp = tempfile::tempdir().unwrap();
    for case in cases(tmp.path()) {
        let path = p(&case.path);
        let kind = case.kind;

        let text = run(&["verify", path], 0);
        assert!(text.contains("sound"), "{kind}: {text}");
        let v = json(&["verify", path, "--json"]);
        assert_eq!(v["kind"], kind);
        assert_eq!(v["problems"], serde_json::json!([]), "{kind}");

        let inspect = json(&["inspect", path, "--json"]);
        assert_eq!(inspect["kind"], kind);
        let stats = json(&["stats", path, "--json"]);
        assert_eq!(stats["kind"], kind);
        let new: Vec<&String> = stats
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| inspect.get(k.as_str()).is_none())
            .collect();
        assert!(
            new.iter().any(|k| k.contains("_per_")),
            "{kind}: stats adds a per-item ratio to inspect: {new:?}"
        );
        assert_ne!(
            run(&["stats", path], 0),
            run(&["inspect", path], 0),
            "{kind}"
        );

        let record = json(&["get", path, case.key, "--json"]);
        let table = run(&["get", path, case.key], 0);
        assert!(
            serde_json::from_str::<Value>(&table).is_err(),
            "{kind}: without --json, get prints a table: {table}"
        );
        let shown = match record.get("dtype") {
            Some(dtype) => dtype.as_str().unwrap().to_owned(),
            None => record.as_object().unwrap().keys().next().unwrap().clone(),
        };
        assert!(table.contains(&shown), "{kind}: {shown} in {table}");

        (case.damage)(&case.path);
        let text = run(&["verify", path], 1);
        assert!(text.contains("problem ("), "{kind}: {text}");
        let out = cachex(&["verify", path, "--json"]);
        assert_eq!(out.status.code(), Some(1), "{kind}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let problems = v["problems"].as_array().unwrap();
        assert!(!problems.is_empty(), "{kind}");
        for problem in problems {
            let file = problem["path"].as_str().unwrap();
            assert!(file.starts_with(path), "{kind}: {problem}");
            assert!(
                KINDS.contains(&problem["kind"].as_str().unwrap()),
                "{kind}: {problem}"
            );
            assert!(!problem["detail"].as_str().unwrap().is_empty(), "{kind}");
        }
        if let Some(want) = case.expect {
            assert!(
                problems.iter().any(|p| p["kind"] == want),
                "{kind}: expected a {want} problem: {problems:?}"
            );
        }
    }
}

#[test]
fn beton_files_are_recognised_by_their_header_not_two_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = test_support::fixtures_dir().join("ffcv/small_w1.beton");
    let bytes = std::fs::read(&fixture).unwrap();

    // Without the extension, a sound header is enough.
    let renamed = tmp.path().join("train.data");
    std::fs::write(&renamed, &bytes).unwrap();
    assert_eq!(json(&["inspect", p(&renamed), "--json"])["kind"], "beton");
    assert!(run(&["verify", p(&renamed)], 0).contains("sound"));

    let header = |version: u16, fields: u16, page: u32, samples: u64, table: u64| {
        let mut h = Vec::new();
        h.extend(version.to_le_bytes());
        h.extend(fields.to_le_bytes());
        h.extend(page.to_le_bytes());
        h.extend(samples.to_le_bytes());
        h.extend(table.to_le_bytes());
        h.resize(4096, 0);
        h
    };
    // Two bytes of version 2 and nothing that adds up: not a cache.
    let not_beton = [
        ("no fields", header(2, 0, 1 << 21, 1, 0)),
        ("page size", header(2, 1, 1000, 1, 0)),
        ("descriptors beyond the file", header(2, 9, 1 << 21, 1, 0)),
        ("samples beyond the file", header(2, 1, 1 << 21, 1 << 40, 0)),
        ("table beyond the file", header(2, 1, 1 << 21, 1, 1 << 30)),
        ("table of partial rows", header(2, 1, 1 << 21, 1, 4096 - 25)),
    ];
    for (what, bytes) in not_beton {
        let path = tmp.path().join("blob.data");
        std::fs::write(&path, &bytes).unwrap();
        let out = cachex(&["verify", p(&path)]);
        assert_eq!(out.status.code(), Some(2), "{what}: {}", stdout(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a cache cachex knows"));
    }

    // A `.beton` of another version is no cache we know either.
    let other = tmp.path().join("v3.beton");
    let mut v3 = bytes.clone();
    v3[0] = 3;
    std::fs::write(&other, &v3).unwrap();
    assert_eq!(cachex(&["inspect", p(&other)]).status.code(), Some(2));

    // A damaged `.beton` (the name says what it is) is verified: exit 1.
    let cut = tmp.path().join("cut.beton");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert!(run(&["verify", p(&cut)], 1).contains("cut.beton"));
}

#[test]
fn the_library_verify_names_each_problem_with_a_shared_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let root = test_support::copy_fixture("loadit/records", tmp.path());
    std::fs::write(root.join("shards/7.x.shard.pickle"), b"junk").unwrap();
    let (kind, problems) = cachex_cli::verify_path(&root).unwrap();
    assert_eq!(
        kind,
        cache_facade::Detected::own(cache_facade::StoreKind::ShardStore)
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].kind, cachex_cli::ProblemKind::Structure);
    assert!(problems[0].path.ends_with("7.x.shard.pickle"));
    let err = cachex_cli::verify_path(tmp.path()).unwrap_err();
    assert_eq!(err.exit_code(), cachex_cli::EXIT_USAGE);
}
