//! One staleness path for every backend: sources and store version in
//! `fingerprint.json`, refuse or rebuild, and memmap-array's own
//! `open_or_build` agreeing with the facade on where a cache lives.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cache_facade::{
    CacheBackend, CacheConfig, FacadeError, OnStale, Source, SourcesConfig, StoreKind, open,
    open_with_source,
};
use fingerprint::Mode;
use memmap_array::{NewRow, Outcome, RowWriter, Schema};
use tensor_core::{DType, Tensor, Value};

/// A config whose fingerprint covers `data/labels.txt`.
fn config(kind: StoreKind, root: &Path, data: &Path) -> CacheConfig {
    CacheConfig::new(kind, root, "feats")
        .option("dim", 2)
        .sources(SourcesConfig {
            root: data.to_path_buf(),
            paths: vec!["labels.txt".into()],
            content: true,
        })
}

/// Rows derived from the labels file, so a rebuild shows the new content.
fn source(data: &Path) -> Source {
    let labels = data.join("labels.txt");
    Source::items(move || {
        let base: f32 = std::fs::read_to_string(&labels)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(-1.0);
        (0..6).map(move |i| {
            Value::dict([("x", Tensor::from_vec([2], vec![base, i as f32]).unwrap())])
        })
    })
}

fn first_x(cache: &dyn CacheBackend) -> f32 {
    let v = cache.get_index(0).unwrap();
    v.get("x")
        .unwrap()
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()[0]
}

fn refuses_then_rebuilds(kind: StoreKind) {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "1").unwrap();
    let cfg = config(kind, root.path(), data.path());
    let built = open_with_source(&cfg, source(data.path())).unwrap();
    assert_eq!(first_x(&*built), 1.0);
    drop(built);
    let fp =
        fingerprint::Fingerprint::read(&cfg.cache_dir().unwrap().join("fingerprint.json")).unwrap();
    assert_eq!(fp.config, cfg.identity().unwrap());
    assert_eq!(fp.sources.len(), 1);

    std::fs::write(data.path().join("labels.txt"), "2").unwrap();
    for attempt in [
        open(&cfg).err(),
        open_with_source(&cfg, source(data.path())).err(),
    ] {
        let err = attempt.expect("a stale cache is refused");
        match &err {
            FacadeError::Stale { stale, .. } => {
                assert!(
                    stale.to_string().contains("labels.txt"),
                    "{kind:?}: {stale}"
                )
            }
            other => panic!("{kind:?}: {other}"),
        }
    }
    // Refusing left the old cache alone.
    let fp_after =
        fingerprint::Fingerprint::read(&cfg.cache_dir().unwrap().join("fingerprint.json")).unwrap();
    assert_eq!(fp_after, fp);

    let rebuild = cfg.clone().on_stale(OnStale::Rebuild);
    // Without a source there is nothing to rebuild from: refused, kept.
    let err = open(&rebuild).err().unwrap();
    assert!(
        matches!(err, FacadeError::NotBuilt { .. }),
        "{kind:?}: {err}"
    );
    let rebuilt = open_with_source(&rebuild, source(data.path())).unwrap();
    assert_eq!(first_x(&*rebuilt), 2.0, "{kind:?}");
    assert_eq!(rebuilt.len().unwrap(), 6);
    drop(rebuilt);
    // The new fingerprint is current: a plain open reads the new cache.
    assert_eq!(first_x(&*open(&cfg).unwrap()), 2.0);
}

#[test]
fn memmap_array_refuses_then_rebuilds() {
    refuses_then_rebuilds(StoreKind::MemmapArray);
}

#[test]
fn page_alloc_refuses_then_rebuilds() {
    refuses_then_rebuilds(StoreKind::PageAlloc);
}

#[test]
fn shard_store_refuses_then_rebuilds() {
    refuses_then_rebuilds(StoreKind::ShardStore);
}

#[test]
fn segment_store_refuses_then_starts_over() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "1").unwrap();
    let cfg =
        CacheConfig::new(StoreKind::SegmentStore, root.path(), "feats").sources(SourcesConfig {
            root: data.path().to_path_buf(),
            paths: vec!["labels.txt".into()],
            content: true,
        });
    let cache = open(&cfg).unwrap();
    cache
        .put_batch(vec![("a".into(), Value::blob(b"old".to_vec()))])
        .unwrap();
    cache.flush().unwrap();
    drop(cache);
    std::fs::write(data.path().join("labels.txt"), "2").unwrap();
    assert!(matches!(
        open(&cfg).err().unwrap(),
        FacadeError::Stale { .. }
    ));
    let err = open_with_source(&cfg, Source::items(Vec::new))
        .err()
        .unwrap();
    assert!(matches!(err, FacadeError::Unsupported { .. }), "{err}");
    let fresh = open(&cfg.clone().on_stale(OnStale::Rebuild)).unwrap();
    assert_eq!(fresh.len().unwrap(), 0);
    assert_eq!(fresh.get("a").unwrap(), None);
}

#[test]
fn a_stale_segment_cache_with_a_live_writer_is_not_cleared() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "1").unwrap();
    let cfg =
        CacheConfig::new(StoreKind::SegmentStore, root.path(), "feats").sources(SourcesConfig {
            root: data.path().to_path_buf(),
            paths: vec!["labels.txt".into()],
            content: false,
        });
    let writer = open(&cfg).unwrap();
    writer
        .put_batch(vec![("a".into(), Value::blob(b"kept".to_vec()))])
        .unwrap();
    writer.flush().unwrap();
    std::fs::write(data.path().join("labels.txt"), "changed").unwrap();
    let err = open(&cfg.clone().on_stale(OnStale::Rebuild)).err().unwrap();
    assert!(matches!(err, FacadeError::InUse { .. }), "{err}");
    assert_eq!(
        writer.get("a").unwrap().unwrap().as_blob(),
        Some(&b"kept"[..])
    );
}

fn schema() -> Schema {
    Schema::builder()
        .array("x", DType::F32, [2])
        .build()
        .unwrap()
}

#[test]
fn memmap_built_by_open_or_build_is_found_by_the_facade() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "7").unwrap();
    let cfg = config(StoreKind::MemmapArray, root.path(), data.path());
    let stamps = fingerprint::stamp_sources(data.path(), ["labels.txt"], Mode::Content).unwrap();
    let opened = memmap_array::open_or_build(
        root.path(),
        "feats",
        &serde_json::json!({"dim": 2}),
        stamps,
        &schema(),
        |w: &mut RowWriter| -> memmap_array::Result<()> {
            for i in 0..3 {
                let t = Tensor::from_vec([2], vec![7.0f32, i as f32]).unwrap();
                w.write(&NewRow::new(&format!("r{i}")).array("x", t.view()))?;
            }
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(opened.dir, cfg.cache_dir().unwrap());
    // Found by the facade without building: open() has no source.
    let cache = open(&cfg).unwrap();
    assert_eq!(first_x(&*cache), 7.0);
    assert_eq!(
        cache
            .get("r2")
            .unwrap()
            .unwrap()
            .get("x")
            .unwrap()
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        &[7.0, 2.0]
    );
}

#[test]
fn memmap_built_by_the_facade_is_a_hit_for_open_or_build() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "3").unwrap();
    let cfg = config(StoreKind::MemmapArray, root.path(), data.path());
    drop(open_with_source(&cfg, source(data.path())).unwrap());
    let stamps = fingerprint::stamp_sources(data.path(), ["labels.txt"], Mode::Content).unwrap();
    let opened = memmap_array::open_or_build(
        root.path(),
        "feats",
        &serde_json::json!({"dim": 2}),
        stamps,
        &schema(),
        |_: &mut RowWriter| -> memmap_array::Result<()> { panic!("a hit builds nothing") },
    )
    .unwrap();
    assert_eq!(opened.outcome, Outcome::Hit);
    assert_eq!(opened.dir, cfg.cache_dir().unwrap());
    assert_eq!(opened.cache.len(), 6);
}

#[test]
fn an_interrupted_memmap_build_resumes_without_recomputing_committed_rows() {
    let root = tempfile::tempdir().unwrap();
    let cfg = CacheConfig::new(StoreKind::MemmapArray, root.path(), "rows");
    let ids: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    let calls = Arc::new(AtomicUsize::new(0));
    let keyed = |fail_at: Option<&'static str>, calls: Arc<AtomicUsize>| {
        Source::keyed(ids.clone(), move |id: &str| {
            calls.fetch_add(1, Ordering::SeqCst);
            if Some(id) == fail_at {
                return Err("decoder crashed".to_owned());
            }
            let i: f32 = id[1..].parse().map_err(|_| "bad id".to_owned())?;
            Ok(Value::dict([(
                "x",
                Tensor::from_vec([2], vec![i, 0.0]).unwrap(),
            )]))
        })
    };
    let err = open_with_source(&cfg, keyed(Some("r12"), Arc::clone(&calls)))
        .err()
        .unwrap();
    assert!(
        matches!(err, FacadeError::Source { ref id, .. } if id == "r12"),
        "{err}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 13);

    let again = Arc::new(AtomicUsize::new(0));
    let cache = open_with_source(&cfg, keyed(None, Arc::clone(&again))).unwrap();
    assert_eq!(cache.len().unwrap(), 20);
    // r00 once (the schema comes from the first row), then r12..r19.
    assert_eq!(again.load(Ordering::SeqCst), 1 + 8);
    let v = cache.get("r15").unwrap().unwrap();
    assert_eq!(
        v.get("x")
            .unwrap()
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        &[15.0, 0.0]
    );
}

#[test]
fn an_unfinished_build_is_redone_without_asking_but_never_opened() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.txt"), "4").unwrap();
    for kind in [StoreKind::PageAlloc, StoreKind::ShardStore] {
        let cfg = config(kind, root.path(), data.path());
        // A crash before the fingerprint committed the cache: content, no
        // fingerprint.json.
        let dir = cfg.cache_dir().unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data.pages.tmp"), b"half a file").unwrap();
        let err = open(&cfg).err().unwrap();
        assert!(
            matches!(err, FacadeError::NotBuilt { .. }),
            "{kind:?}: {err}"
        );
        // Building it is not a rebuild of a stale cache: on_stale = error is fine.
        let cache = open_with_source(&cfg, source(data.path())).unwrap();
        assert_eq!(first_x(&*cache), 4.0, "{kind:?}");
        assert!(
            !dir.join("data.pages.tmp").exists(),
            "{kind:?}: the leftover is cleared"
        );
    }
}
