//! Many readers at once; one writer at a time.

mod common;

use std::sync::Arc;

use memmap_array::{Error, MemmapArray, RowWriter};

#[test]
fn cache_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MemmapArray>();
    assert_send_sync::<RowWriter>();
}

#[test]
fn many_threads_read_one_cache() {
    let dir = tempfile::tempdir().unwrap();
    let n = 40;
    // Not opened yet: the threads race on the lazy first map.
    drop(common::build(dir.path(), n));
    let cache = Arc::new(MemmapArray::open(dir.path()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                for round in 0..5 {
                    for k in 0..n {
                        let i = (k * 7 + t * 3 + round) % n;
                        let row = cache.row(i as u64).unwrap();
                        assert_eq!(
                            row.get("data").unwrap().unwrap().bytes(),
                            common::data(i).bytes()
                        );
                        let expected = (!i.is_multiple_of(5)).then(|| common::config(i));
                        assert_eq!(row.sidecar("config").unwrap(), expected.as_deref());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    common::check_rows(&cache, n);
}

#[test]
fn second_writer_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = common::writer(dir.path(), 1);
    common::write_row(&mut first, 0);
    let e = common::writer_result(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
    assert!(e.to_string().contains("another writer"), "{e}");
    // A refused writer touched nothing; the first goes on.
    common::write_row(&mut first, 1);
    drop(first);
    let mut second = common::writer(dir.path(), 1);
    assert_eq!(second.committed_rows(), 2);
    common::write_row(&mut second, 2);
    second.finalize().unwrap();
    common::check_rows(&MemmapArray::open(dir.path()).unwrap(), 3);
}

#[test]
fn second_writer_in_another_thread_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::writer(dir.path(), 1);
    let path = dir.path().to_path_buf();
    let refused = std::thread::spawn(move || common::writer_result(&path).map(|_| ()))
        .join()
        .unwrap();
    assert!(matches!(refused, Err(Error::Locked { .. })));
    drop(first);
}

#[test]
fn open_reader_keeps_its_bytes_while_a_stale_cache_is_rebuilt() {
    use fingerprint::{Mode, stamp_sources};
    use memmap_array::{NewRow, Outcome, Schema, open_or_build};
    use tensor_core::{DType, Tensor};

    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("src.txt"), "v1").unwrap();
    let schema = Schema::builder()
        .array("x", DType::U8, [4096])
        .build()
        .unwrap();
    let config = serde_json::json!({"what": "rebuild under a reader"});
    let build_with = |value: u8| {
        move |w: &mut RowWriter| -> Result<(), Error> {
            let t = Tensor::from_vec([4096], vec![value; 4096]).unwrap();
            w.write(&NewRow::new("only").array("x", t.view()))
        }
    };
    let stamps = || stamp_sources(root.path(), ["src.txt"], Mode::Content).unwrap();
    let old = open_or_build(
        root.path(),
        "cache",
        &config,
        stamps(),
        &schema,
        build_with(1),
    )
    .unwrap();
    let before = old.cache.array(0, "x").unwrap().unwrap();
    assert_eq!(before.bytes()[0], 1);

    std::fs::write(root.path().join("src.txt"), "v2").unwrap();
    let new = open_or_build(
        root.path(),
        "cache",
        &config,
        stamps(),
        &schema,
        build_with(2),
    )
    .unwrap();
    assert!(
        matches!(new.outcome, Outcome::Rebuilt { .. }),
        "{}",
        new.outcome
    );
    assert_eq!(
        new.cache.array(0, "x").unwrap().unwrap().bytes(),
        &[2; 4096]
    );
    // The old reader's map still shows the old, whole row.
    assert_eq!(before.bytes(), &[1; 4096]);
    assert_eq!(
        old.cache.array(0, "x").unwrap().unwrap().bytes(),
        &[1; 4096]
    );
}
