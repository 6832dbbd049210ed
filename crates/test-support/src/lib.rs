//! Helpers shared by the cachex test suites (a dev-dependency only).
//!
//! - [`fixtures_dir`]: `../shared/fixtures`, the caches written by the real
//!   FFCV, torchcachex and loadit, with `expected.json`.
//! - [`python`]: the interpreter of the interop venv that `scripts/test`
//!   builds (pyarrow, numpy, loadit). `scripts/test` exports its path as
//!   `CACHEX_PYTHON`; a plain `cargo test` finds `target/py-venv` when it
//!   exists. Under CI (`CI=true`) a missing venv fails the test instead of
//!   skipping it, so interop can never silently stop running.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the folder holding the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/test-support sits two levels below the root")
        .to_path_buf()
}

/// `../shared/fixtures` beside the workspace, or `CACHEX_FIXTURES` when set.
pub fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CACHEX_FIXTURES") {
        return PathBuf::from(dir);
    }
    let dir = workspace_root().join("../shared/fixtures");
    assert!(
        dir.join("expected.json").is_file(),
        "fixtures not found at {} (set CACHEX_FIXTURES)",
        dir.display()
    );
    dir
}

/// `expected.json` of the fixtures, parsed.
pub fn expected() -> serde_json::Value {
    let path = fixtures_dir().join("expected.json");
    let text = std::fs::read_to_string(&path).expect("read expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

/// Copies a fixture folder (or file) into `dest`, so that a test may open
/// it with code that writes. Returns the copy's path.
pub fn copy_fixture(rel: &str, dest: &Path) -> PathBuf {
    let src = fixtures_dir().join(rel);
    let target = dest.join(src.file_name().expect("fixture has a name"));
    copy_recursive(&src, &target);
    target
}

fn copy_recursive(src: &Path, dst: &Path) {
    if src.is_dir() {
        std::fs::create_dir_all(dst).expect("create fixture copy dir");
        for entry in std::fs::read_dir(src).expect("read fixture dir") {
            let entry = entry.expect("fixture dir entry");
            copy_recursive(&entry.path(), &dst.join(entry.file_name()));
        }
    } else {
        std::fs::copy(src, dst).expect("copy fixture file");
    }
}

/// The interop venv's Python, or `None` (after saying so on stderr) when it
/// is absent outside CI. Panics under CI when it is absent.
pub fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("CACHEX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/py-venv/bin/python"));
    if candidate.is_file() {
        return Some(candidate);
    }
    let msg = format!(
        "interop venv missing ({}): run scripts/test to build it",
        candidate.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("skipping Python interop check: {msg}");
    None
}

/// Runs `script` with the venv's Python and `args`; panics with the
/// script's stderr when it fails. Returns its stdout.
pub fn run_python(python: &Path, script: &str, args: &[&Path]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("spawn python");
    assert!(
        out.status.success(),
        "python failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
