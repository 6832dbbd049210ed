//! Rebuild under the lock: processes that open the same stale cache at
//! once never see a half-cleared directory. Each cycle makes the cache
//! stale, then two rebuilders and a reader — real processes, this test
//! binary re-executed — open it at the same moment.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cache_facade::{
    CacheBackend, CacheConfig, FacadeError, OnStale, Source, SourcesConfig, StoreKind, open,
    open_with_source,
};
use tensor_core::{Tensor, Value};
use test_support::crash;

const TEST: &str = "two_processes_rebuild_one_stale_cache_at_once";
const ROWS: usize = 40;

fn kind_of(role: &str) -> StoreKind {
    if role.starts_with("page") {
        StoreKind::PageAlloc
    } else {
        StoreKind::MemmapArray
    }
}

fn config(kind: StoreKind, dir: &Path) -> CacheConfig {
    CacheConfig::new(kind, dir.join("root"), "race")
        .create_root(true)
        .sources(SourcesConfig {
            root: dir.join("data"),
            paths: vec!["version.txt".into()],
            content: true,
        })
}

/// Every row of the build for `version` holds `version` in x[0].
fn source(dir: &Path, builds: Arc<AtomicUsize>) -> Source {
    let file = dir.join("data/version.txt");
    Source::items(move || {
        builds.fetch_add(1, Ordering::SeqCst);
        let version: f32 = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(-1.0);
        (0..ROWS).map(move |i| {
            Value::dict([(
                "x",
                Tensor::from_vec([64], vec![version + 0.0 * i as f32; 64]).unwrap(),
            )])
        })
    })
}

/// The version every row of an open cache holds (all rows must agree).
fn version_of(cache: &dyn CacheBackend) -> Result<f32, String> {
    let indices: Vec<i64> = (0..ROWS as i64).collect();
    let values = cache.get_indices(&indices).map_err(|e| e.to_string())?;
    let mut seen = None;
    for v in &values {
        let x = v
            .get("x")
            .and_then(Value::as_tensor)
            .ok_or("a row lacks x")?
            .as_slice::<f32>()
            .map_err(|e| e.to_string())?;
        if x.iter().any(|&e| e != x[0]) || seen.is_some_and(|s| s != x[0]) {
            return Err(format!("rows of mixed builds: {x:?}"));
        }
        seen = Some(x[0]);
    }
    seen.ok_or_else(|| "no rows".into())
}

fn child(args: crash::ChildArgs) {
    let kind = kind_of(&args.role);
    let cfg = config(kind, &args.dir);
    let expected = args.seed as f32;
    if args.role.ends_with("reader") {
        // A plain reader: the committed old cache (refused as stale) or,
        // after waiting out the rebuild, the new one. Nothing else.
        match open(&cfg) {
            Ok(cache) => match version_of(&*cache) {
                Ok(v) if v == expected => crash::report_commit("read new"),
                Ok(v) => crash::report_error(&format!("read version {v}, expected {expected}")),
                Err(e) => crash::report_error(&e),
            },
            Err(FacadeError::Stale { .. }) => crash::report_commit("refused stale"),
            Err(e) => crash::report_error(&e.to_string()),
        }
        return;
    }
    let builds = Arc::new(AtomicUsize::new(0));
    let cfg = cfg.on_stale(OnStale::Rebuild);
    match open_with_source(&cfg, source(&args.dir, Arc::clone(&builds))) {
        Ok(cache) => match version_of(&*cache) {
            Ok(v) if v == expected => {
                crash::report_commit(&format!("built {}", builds.load(Ordering::SeqCst)))
            }
            Ok(v) => crash::report_error(&format!("read version {v}, expected {expected}")),
            Err(e) => crash::report_error(&e),
        },
        Err(e) => crash::report_error(&e.to_string()),
    }
}

#[test]
fn two_processes_rebuild_one_stale_cache_at_once() {
    if let Some(args) = crash::child_args() {
        child(args);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let cycles = crash::cycles(300);
    for cycle in 0..cycles {
        let kind = if cycle % 2 == 0 { "page" } else { "memmap" };
        // A current cache of version `cycle`, then the source changes.
        std::fs::write(dir.path().join("data/version.txt"), cycle.to_string()).unwrap();
        let cfg = config(kind_of(kind), dir.path()).on_stale(OnStale::Rebuild);
        let builds = Arc::new(AtomicUsize::new(0));
        drop(open_with_source(&cfg, source(dir.path(), builds)).unwrap());
        let next = (cycle + 1) as u64;
        std::fs::write(dir.path().join("data/version.txt"), next.to_string()).unwrap();

        let roles = [
            format!("{kind}-a"),
            format!("{kind}-b"),
            format!("{kind}-reader"),
        ];
        let outcomes: Vec<crash::Outcome> = std::thread::scope(|s| {
            let runs: Vec<_> = roles
                .iter()
                .map(|role| s.spawn(|| crash::child(TEST, role, dir.path(), next).run()))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (role, outcome) in roles.iter().zip(&outcomes) {
            assert!(
                outcome.errors.is_empty(),
                "cycle {cycle}, {role}: {:?}",
                outcome.errors
            );
            assert_eq!(
                outcome.committed.len(),
                1,
                "cycle {cycle}, {role}: {outcome:?}"
            );
        }
        // Exactly one of the two rebuilt; the other waited and read it.
        let built: usize = outcomes[..2]
            .iter()
            .map(|o| {
                o.committed[0]
                    .trim_start_matches("built ")
                    .parse::<usize>()
                    .unwrap()
            })
            .sum();
        assert_eq!(built, 1, "cycle {cycle}: {outcomes:?}");
        let cache = open(&config(kind_of(kind), dir.path())).unwrap();
        assert_eq!(version_of(&*cache), Ok(next as f32), "cycle {cycle}");
    }
}
