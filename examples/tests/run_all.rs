//! Every example runs to completion (each asserts its own results).

use std::process::Command;

fn run(exe: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(exe)
        .arg(dir.path())
        .output()
        .expect("spawn example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{exe} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn feature_cache() {
    let out = run(env!("CARGO_BIN_EXE_feature_cache"));
    assert!(out.contains("epoch 2: model ran on 0 samples"), "{out}");
    assert!(out.contains("predicted class: Some(7)"), "{out}");
}

#[test]
fn one_config() {
    let out = run(env!("CARGO_BIN_EXE_one_config"));
    assert!(out.contains("cannot put"), "{out}");
    assert!(out.contains("rebuilt page-alloc cache"), "{out}");
}

#[test]
fn paged_loader() {
    let out = run(env!("CARGO_BIN_EXE_paged_loader"));
    assert!(out.contains("every sample checked"), "{out}");
}

#[test]
fn dataset_memmap() {
    let out = run(env!("CARGO_BIN_EXE_dataset_memmap"));
    assert!(
        out.contains("first build: interrupted after 120 rows"),
        "{out}"
    );
    assert!(out.contains("after editing a source"), "{out}");
    assert!(
        out.contains("facade: open(config) found the cache"),
        "{out}"
    );
}

#[test]
fn iterable_random_access() {
    let out = run(env!("CARGO_BIN_EXE_iterable_random_access"));
    assert!(out.contains("random reads checked"), "{out}");
}

#[test]
fn python_roundtrip() {
    let out = run(env!("CARGO_BIN_EXE_python_roundtrip"));
    if std::env::var_os("CACHEX_PYTHON").is_some() {
        assert!(out.contains("4 of 4 Python reads ran and matched"), "{out}");
    } else {
        assert!(out.contains("Python reads ran"), "{out}");
    }
}
