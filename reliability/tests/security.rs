//! Untrusted cache metadata: no name read from disk reaches outside the
//! cache directory, and no size read from disk drives a huge allocation.

use std::path::Path;

use memmap_array::{MemmapArray, NewRow, RowWriter, Schema};
use tensor_core::{DType, Tensor};

fn memmap_cache(dir: &Path) {
    let schema = Schema::builder()
        .array("data", DType::I16, [4])
        .sidecar("panel")
        .build()
        .unwrap();
    let mut w = RowWriter::create_or_resume(dir, &schema, serde_json::json!(1)).unwrap();
    for i in 0..3i16 {
        let t = Tensor::from_vec([4], vec![i; 4]).unwrap();
        let id = format!("s{i}");
        w.write(
            &NewRow::new(&id)
                .array("data", t.view())
                .sidecar("panel", "A"),
        )
        .unwrap();
    }
    w.finalize().unwrap();
}

/// Rewrites shapes.json with `edit` applied to its JSON.
fn edit_shapes(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join(memmap_array::SHAPES_FILE);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn array_and_sidecar_names_cannot_escape_the_cache_dir() {
    let outside = tempfile::tempdir().unwrap();
    // A file the hostile names point at: it must never be opened as data.
    std::fs::write(outside.path().join("secret.bin"), [7u8; 24]).unwrap();
    std::fs::write(outside.path().join("secret.json"), r#"{"0": "leak"}"#).unwrap();
    let abs = outside.path().join("secret").to_string_lossy().into_owned();
    for hostile in [
        "../secret",
        "../../secret",
        abs.as_str(),
        "a/../../secret",
        "..",
        "",
    ] {
        for field in ["arrays", "sidecars"] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("cache");
            memmap_cache(&dir);
            std::fs::copy(
                outside.path().join("secret.bin"),
                tmp.path().join("secret.bin"),
            )
            .unwrap();
            edit_shapes(&dir, |v| {
                if field == "arrays" {
                    v["arrays"][0]["name"] = serde_json::json!(hostile);
                } else {
                    v["sidecars"][0] = serde_json::json!(hostile);
                }
            });
            let opened = MemmapArray::open(&dir);
            assert!(opened.is_err(), "{field} named {hostile:?} was accepted");
            let problems = memmap_array::verify(&dir);
            assert!(
                !problems.is_empty(),
                "verify missed {field} named {hostile:?}"
            );
        }
    }
}

#[test]
fn huge_counts_from_disk_are_refused_before_allocating() {
    // memmap-array: shapes.json claiming 2^60 rows.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    memmap_cache(&dir);
    edit_shapes(&dir, |v| v["rows"] = serde_json::json!(1u64 << 60));
    assert!(MemmapArray::open(&dir).is_err());
    edit_shapes(&dir, |v| {
        v["rows"] = serde_json::json!(3);
        v["arrays"][0]["shape"] = serde_json::json!([1u64 << 40, 1u64 << 40]);
    });
    assert!(MemmapArray::open(&dir).is_err());

    // page-alloc: a header claiming 2^60 samples (checksums recomputed, so
    // only the bounds checks stand between the count and an allocation).
    let path = tmp.path().join("f.pages");
    let mut w = page_alloc::PageWriter::create(
        &path,
        page_alloc::Schema::new().int("i"),
        page_alloc::WriterOptions::default(),
    )
    .unwrap();
    w.append(&[page_alloc::Value::Int(1)]).unwrap();
    w.finalize().unwrap();
    let good = std::fs::read(&path).unwrap();
    for offset in 0..64usize {
        // Every u64-aligned header word set to 2^60 in turn.
        if offset % 8 != 0 {
            continue;
        }
        let mut bad = good.clone();
        bad[offset..offset + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        page_alloc::fuzz_entry::reseal(&mut bad);
        assert!(
            page_alloc::fuzz_entry::open_and_read(&bad).is_err(),
            "header word at {offset} set to 2^60 was accepted"
        );
    }

    // segment-store: an index group claiming 2^32-1 rows.
    let seg = tmp.path().join("seg");
    {
        let store =
            segment_store::SegmentStore::open(&seg, segment_store::Options::default()).unwrap();
        let t = Tensor::from_vec([1], vec![1.0f32]).unwrap();
        store
            .put_batch(&[("k", tensor_core::Value::from(t))])
            .unwrap();
        store.flush().unwrap();
    }
    let log = seg.join(segment_store::format::INDEX_FILE);
    let mut bytes = std::fs::read(&log).unwrap();
    // Group header: magic(4) segment_id(4) count(4) at offset 16 + 8.
    bytes[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&log, &bytes).unwrap();
    let store = segment_store::SegmentStore::open(&seg, segment_store::Options::default()).unwrap();
    // The bad group is a torn tail: dropped, the segment re-indexed from its keys.
    let (found, _) = store.get_batch(&["k"]).unwrap();
    assert!(found[0].is_some());
}
