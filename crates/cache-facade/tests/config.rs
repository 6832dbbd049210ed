//! Config keying, directories, kinds and stale caches.

use cache_facade::{
    CacheBackend, CacheConfig, FacadeError, OnStale, SegmentBackend, SourcesConfig, StoreKind,
};
use tensor_core::{Tensor, Value};

fn put_one(backend: &SegmentBackend, key: &str) {
    let r = Value::from(Tensor::from_vec([1], vec![1.0f32]).unwrap());
    backend.put_batch(vec![(key.to_owned(), r)]).unwrap();
    backend.flush().unwrap();
}

#[test]
fn options_change_the_key_but_order_and_root_do_not() {
    let a = CacheConfig::new(StoreKind::SegmentStore, "/r1", "feat")
        .option("flush_every", 8u64)
        .option("lru_bytes", 0u64);
    let b = CacheConfig::new(StoreKind::SegmentStore, "/r2", "feat")
        .option("lru_bytes", 0u64)
        .option("flush_every", 8u64);
    let c = CacheConfig::new(StoreKind::SegmentStore, "/r1", "feat")
        .option("flush_every", 9u64)
        .option("lru_bytes", 0u64);
    let d = CacheConfig::new(StoreKind::MemmapArray, "/r1", "feat")
        .option("flush_every", 8u64)
        .option("lru_bytes", 0u64);
    assert_eq!(a.key().unwrap(), b.key().unwrap());
    assert_ne!(a.key().unwrap(), c.key().unwrap());
    assert_ne!(a.key().unwrap(), d.key().unwrap());
    let dir = a.cache_dir().unwrap();
    assert_eq!(dir.parent().unwrap(), std::path::Path::new("/r1/feat"));
    assert_eq!(
        dir.file_name().unwrap().to_str().unwrap(),
        a.key().unwrap().as_str()
    );
}

#[test]
fn the_remote_section_is_the_tier_options_and_options_is_storage_options() {
    let with = |remote: &str| {
        CacheConfig::from_json(&format!(
            r#"{{"backend": "segment-store", "root": "s3://b/p", "name": "f", "remote": {remote}}}"#
        ))
    };
    let new =
        with(r#"{"tier_dir": "/t", "tier_budget": 5, "storage_options": {"aws_region": "x"}}"#)
            .unwrap();
    let old =
        with(r#"{"tier_dir": "/t", "tier_budget": 5, "options": {"aws_region": "x"}}"#).unwrap();
    let remote = new.remote.clone().unwrap();
    assert_eq!(remote.tier_dir.as_deref(), Some(std::path::Path::new("/t")));
    assert_eq!(remote.tier_budget, Some(5));
    assert_eq!(
        remote.storage_options.get("aws_region").map(String::as_str),
        Some("x")
    );
    assert_eq!(new.remote, old.remote);
    assert!(with(r#"{"tier_dri": "/t"}"#).is_err());
}

#[test]
fn json_configs_parse_and_typos_are_refused() {
    let cfg = CacheConfig::from_json(r#"{"backend": "segment-store", "root": "/tmp/x", "name": "f", "options": {"flush_every": 16}}"#).unwrap();
    assert_eq!(cfg.backend, StoreKind::SegmentStore);
    assert!(CacheConfig::from_json(r#"{"backend": "redis", "root": "/", "name": "f"}"#).is_err());
    assert!(
        CacheConfig::from_json(
            r#"{"backend": "segment-store", "root": "/", "name": "f", "rooot": 1}"#
        )
        .is_err()
    );

    let root = tempfile::tempdir().unwrap();
    let typo =
        CacheConfig::new(StoreKind::SegmentStore, root.path(), "f").option("flush_evry", 3u64);
    let err = SegmentBackend::open(&typo).err().unwrap();
    assert!(
        err.to_string().contains("unknown option \"flush_evry\""),
        "{err}"
    );
    let wrong_type =
        CacheConfig::new(StoreKind::SegmentStore, root.path(), "f").option("flush_every", "many");
    let err = SegmentBackend::open(&wrong_type).err().unwrap();
    assert!(err.to_string().contains("flush_every"), "{err}");
}

#[test]
fn names_cannot_escape_the_root() {
    for bad in ["..", "../evil", "a/b", "", ".", "/abs"] {
        let cfg = CacheConfig::new(StoreKind::SegmentStore, "/tmp", bad);
        let err = cfg.cache_dir().unwrap_err();
        assert!(matches!(err, FacadeError::Config(_)), "{bad:?}: {err}");
    }
}

#[test]
fn a_missing_root_is_an_error_unless_created() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("not-yet");
    let cfg = CacheConfig::new(StoreKind::SegmentStore, &root, "f");
    let err = SegmentBackend::open(&cfg).err().unwrap();
    assert!(
        matches!(err, FacadeError::MissingRoot(ref p) if *p == root),
        "{err}"
    );
    let backend = SegmentBackend::open(&cfg.create_root(true)).unwrap();
    assert!(backend.path().starts_with(&root));
}

#[test]
fn a_directory_of_another_kind_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let cfg = CacheConfig::new(StoreKind::SegmentStore, root.path(), "f");
    let dir = cfg.cache_dir().unwrap();
    std::fs::create_dir_all(dir.join("segments")).unwrap();
    let err = SegmentBackend::open(&cfg).err().unwrap();
    assert!(matches!(err, FacadeError::KindMismatch { .. }), "{err}");
    assert!(err.to_string().contains("torchcachex"), "{err}");
}

#[test]
fn stale_caches_say_why_and_rebuild_on_request() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("labels.csv"), "a,1\n").unwrap();
    let cfg = CacheConfig::new(StoreKind::SegmentStore, root.path(), "f").sources(SourcesConfig {
        root: data.path().to_path_buf(),
        paths: vec!["labels.csv".into()],
        content: true,
    });
    {
        let b = SegmentBackend::open(&cfg).unwrap();
        put_one(&b, "k");
    }
    // Unchanged sources: the cache is reused.
    assert_eq!(SegmentBackend::open(&cfg).unwrap().len().unwrap(), 1);

    std::fs::write(data.path().join("labels.csv"), "a,2\n").unwrap();
    let err = SegmentBackend::open(&cfg).err().unwrap();
    match &err {
        FacadeError::Stale { stale, .. } => {
            assert!(
                stale
                    .to_string()
                    .contains("source labels.csv changed (content differs)"),
                "{stale}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("OnStale::Rebuild"), "{err}");

    let rebuilt = SegmentBackend::open(&cfg.clone().on_stale(OnStale::Rebuild)).unwrap();
    assert_eq!(rebuilt.len().unwrap(), 0, "a rebuilt cache starts empty");
    put_one(&rebuilt, "k2");
    drop(rebuilt);
    assert_eq!(
        SegmentBackend::open(&cfg).unwrap().len().unwrap(),
        1,
        "the new fingerprint is current"
    );
}
