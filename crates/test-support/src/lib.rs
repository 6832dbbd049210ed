#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[cfg(feature = "object-store")]
pub mod intercept;
pub mod s3;
pub mod servers;

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

/// The peer fixtures kept in this crate (`crates/test-support/fixtures`), or
/// `CACHEX_FIXTURES` when set.
pub fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CACHEX_FIXTURES") {
        return PathBuf::from(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
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

/// Crash loops: a parent test spawns the test binary itself as a writer
/// child, kills it with SIGKILL at a seeded moment, then checks what the
/// child reported as committed against what recovery finds.
pub mod crash {
    use std::io::{BufRead, BufReader};
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    const ROLE_ENV: &str = "CACHEX_CRASH_ROLE";
    const DIR_ENV: &str = "CACHEX_CRASH_DIR";
    const SEED_ENV: &str = "CACHEX_CRASH_SEED";
    const COMMIT_PREFIX: &str = "CACHEX-COMMIT ";
    const ERROR_PREFIX: &str = "CACHEX-ERROR ";

    /// What a child is asked to do.
    #[derive(Debug, Clone)]
    pub struct ChildArgs {
        /// Which writer role (the test decides what it means).
        pub role: String,
        /// The cache directory to write into.
        pub dir: PathBuf,
        /// Seed of the deterministic stream.
        pub seed: u64,
    }

    /// In a child: the role it was spawned for; `None` in a normal test run.
    pub fn child_args() -> Option<ChildArgs> {
        let role = std::env::var(ROLE_ENV).ok()?;
        let dir = PathBuf::from(std::env::var_os(DIR_ENV)?);
        let seed = std::env::var(SEED_ENV).ok()?.parse().ok()?;
        Some(ChildArgs { role, dir, seed })
    }

    /// In a child: reports `what` as durably committed (call only after the
    /// store's commit returned). Flushed at once, so a kill cannot lose it.
    pub fn report_commit(what: &str) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{COMMIT_PREFIX}{what}");
        let _ = out.flush();
    }

    /// In a child: reports that an operation returned an error (the child
    /// then stops writing and exits normally: an error is not a crash).
    pub fn report_error(what: &str) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{ERROR_PREFIX}{}", what.replace('\n', " "));
        let _ = out.flush();
    }

    /// What the parent saw of one child.
    #[derive(Debug, Clone)]
    pub struct Outcome {
        /// Everything the child reported as committed, in order.
        pub committed: Vec<String>,
        /// Errors the child reported (from operations that failed cleanly).
        pub errors: Vec<String>,
        /// Whether the child was killed (false: it finished first).
        pub killed: bool,
    }

    /// A child run of the current test binary, configured step by step.
    #[derive(Debug, Clone)]
    pub struct ChildRun {
        test_name: String,
        role: String,
        dir: PathBuf,
        seed: u64,
        env: Vec<(String, String)>,
        kill_after: Option<Duration>,
    }

    /// Prepares a run of test `test_name` as a child with `role` in `dir`.
    pub fn child(test_name: &str, role: &str, dir: &Path, seed: u64) -> ChildRun {
        ChildRun {
            test_name: test_name.to_owned(),
            role: role.to_owned(),
            dir: dir.to_path_buf(),
            seed,
            env: Vec::new(),
            kill_after: None,
        }
    }

    impl ChildRun {
        /// Sets an environment variable of the child (e.g. `LD_PRELOAD`).
        pub fn env(mut self, key: &str, value: impl Into<String>) -> ChildRun {
            self.env.push((key.to_owned(), value.into()));
            self
        }

        /// Kills the child with SIGKILL after `after`, if still running.
        pub fn kill_after(mut self, after: Duration) -> ChildRun {
            self.kill_after = Some(after);
            self
        }

        /// Runs the child to its end (or its kill). Panics when it exits
        /// unsuccessfully on its own: a panic in a writer is a bug.
        pub fn run(self) -> Outcome {
            let exe = std::env::current_exe().expect("current test binary");
            let mut cmd = Command::new(exe);
            cmd.args([
                self.test_name.as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, &self.role)
            .env(DIR_ENV, &self.dir)
            .env(SEED_ENV, self.seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().expect("spawn crash child");
            let stdout = child.stdout.take().expect("child stdout");
            let stderr = child.stderr.take().expect("child stderr");
            let (tx, rx) = mpsc::channel();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
            let err_reader = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
                text
            });
            let deadline = self.kill_after.map(|d| Instant::now() + d);
            let mut killed = false;
            let status = loop {
                if let Some(status) = child.try_wait().expect("wait for crash child") {
                    break Some(status);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    // std's kill is SIGKILL on Unix: no destructors, no flushes.
                    let _ = child.kill();
                    let _ = child.wait();
                    killed = true;
                    break None;
                }
                std::thread::sleep(Duration::from_micros(500));
            };
            let _ = reader.join();
            let stderr_text = err_reader.join().unwrap_or_default();
            let lines: Vec<String> = rx.try_iter().collect();
            if let Some(status) = status {
                assert!(
                    status.success(),
                    "child {} ({:?}) failed: {status}\n{}\n{stderr_text}",
                    self.role,
                    self.env,
                    lines.join("\n")
                );
            }
            Outcome {
                committed: tagged(&lines, COMMIT_PREFIX),
                errors: tagged(&lines, ERROR_PREFIX),
                killed,
            }
        }
    }

    /// The text after `prefix` on each line that has it. libtest prints
    /// `test name ... ` without a newline before the test's own output, so
    /// the tag is looked for anywhere in the line.
    fn tagged(lines: &[String], prefix: &str) -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.find(prefix).map(|at| l[at + prefix.len()..].to_owned()))
            .collect()
    }

    /// Runs test `test_name` as a child with `role` and kills it with
    /// SIGKILL after `kill_after` (or lets it finish, whichever is first).
    pub fn run_and_kill(
        test_name: &str,
        role: &str,
        dir: &Path,
        seed: u64,
        kill_after: Duration,
    ) -> Outcome {
        child(test_name, role, dir, seed)
            .kill_after(kill_after)
            .run()
    }

    /// Cycles to run: `CACHEX_CRASH_CYCLES` or `default`.
    pub fn cycles(default: usize) -> usize {
        std::env::var("CACHEX_CRASH_CYCLES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }
}

/// A local tier's count checked against its disk (the tier tests' and the
/// node soaks').
pub mod tier_disk {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    /// The allowance the tier counts for a small sparse copy's metadata
    /// (block map, touch clocks, a page of extent tree): three pages.
    pub const ALLOWANCE: u64 = 3 * 4096;

    /// What the disk holds under the tier's `objects/`, and the sparse
    /// copies there.
    pub fn disk(tier_dir: &Path) -> (u64, u64) {
        let mut bytes = 0;
        let mut sparse = 0;
        for e in std::fs::read_dir(tier_dir.join("objects"))
            .unwrap()
            .flatten()
        {
            if let Ok(m) = e.metadata() {
                bytes += m.blocks() * 512;
            }
            sparse += u64::from(e.file_name().to_string_lossy().ends_with(".sparse"));
        }
        (bytes, sparse)
    }

    /// The count (`allocated`) is above the disk by at most the allowances
    /// of the sparse copies present, and below it by at most `unmarked`:
    /// bytes that fetches which died between their write and their mark
    /// left in copies (none unless a process ended mid-fetch).
    pub fn assert_count_matches_disk(tier_dir: &Path, allocated: u64, step: &str, unmarked: u64) {
        let (held, sparse) = disk(tier_dir);
        assert!(
            allocated + unmarked >= held && allocated <= held + sparse * ALLOWANCE,
            "{step}: the count states {allocated} for {held} bytes on disk ({sparse} sparse copies)"
        );
    }
}
