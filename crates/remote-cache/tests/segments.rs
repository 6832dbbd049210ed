//! segment-store on S3 and Azure Blob: a writer publishes, a cold reader reads; more
//! writes, a refresh; two writers with their own ids both land; two that
//! claim one segment id cannot both publish; a publish that fails before
//! its commit leaves the remote at its last commit.

mod common;

use common::{Backend, Server, keyed, location};
use remote_cache::{Error, SegmentsAt};
use segment_store::Options;
use tensor_core::Tensor;
use tensor_core::Value;

fn record(i: usize) -> Value {
    let values: Vec<f32> = (0..64).map(|j| (i * 64 + j) as f32).collect();
    Value::from(Tensor::from_vec([8, 8], values).unwrap())
}

fn writer_options(id: Option<u32>) -> Options {
    Options {
        writer_id: id,
        flush_every: 25,
        ..Options::default()
    }
}

fn reader_options() -> Options {
    Options {
        read_only: true,
        ..Options::default()
    }
}

fn put(store: &SegmentsAt, range: std::ops::Range<usize>) {
    store.put_batch(&keyed("sample_", range, record)).unwrap();
}

fn assert_records(store: &SegmentsAt, range: std::ops::Range<usize>) {
    let keys: Vec<String> = range.clone().map(|i| format!("sample_{i}")).collect();
    let (records, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in range.zip(records) {
        assert!(r.as_ref() == Some(&record(i)), "sample_{i}");
    }
}

// Not on GCS: its emulator refuses object_store's uploads (RELIABILITY.md).
test_support::on_backends!(
    [s3 = S3, azure = Azure]
    a_writer_publishes_and_a_cold_reader_reads_then_refreshes,
    writers_with_their_own_ids_both_publish_and_readers_merge,
    two_writers_claiming_one_segment_id_cannot_both_publish,
);

fn a_writer_publishes_and_a_cold_reader_reads_then_refreshes(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "caches/seg");
    let (wt, rt) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&location(&server, &url, wt.path()), writer_options(None)).unwrap();
    put(&writer, 0..100);
    let first = writer.publish().unwrap();
    assert_eq!(first.seq, Some(1));
    assert_eq!(first.uploaded, first.pieces);
    assert!(
        writer.publish().unwrap().seq.is_none(),
        "nothing new, no commit"
    );

    let reader = SegmentsAt::open(&location(&server, &url, rt.path()), reader_options()).unwrap();
    assert_eq!(reader.len(), 100);
    assert_records(&reader, 0..100);

    // Appends travel as new segments and the bytes added to the index log.
    put(&writer, 100..160);
    let second = writer.publish().unwrap();
    assert_eq!(second.seq, Some(2));
    let (log, gained) = reader.refresh().unwrap();
    assert_eq!((log.seq, log.commits), (2, 1));
    assert!(gained > 0, "the store saw the new segments");
    assert_eq!(reader.len(), 160);
    assert_records(&reader, 0..160);

    // A reader reopened on the same working directory applies nothing again.
    drop(reader);
    let again = SegmentsAt::open(&location(&server, &url, rt.path()), reader_options()).unwrap();
    assert_eq!(again.remote().unwrap().seq(), 2);
    assert_records(&again, 0..160);
}

fn writers_with_their_own_ids_both_publish_and_readers_merge(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "multi");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    std::thread::scope(|s| {
        for (w, dir) in dirs[..2].iter().enumerate() {
            let (server, url) = (&server, &url);
            s.spawn(move || {
                let store = SegmentsAt::open(
                    &location(server, url, dir.path()),
                    writer_options(Some(w as u32)),
                )
                .unwrap();
                for round in 0..3 {
                    let base = w * 1000 + round * 50;
                    put(&store, base..base + 50);
                    store.publish().unwrap();
                }
            });
        }
    });
    let reader =
        SegmentsAt::open(&location(&server, &url, dirs[2].path()), reader_options()).unwrap();
    assert_eq!(reader.remote().unwrap().seq(), 6, "six commits, none lost");
    assert_eq!(reader.len(), 300);
    assert_records(&reader, 0..150);
    assert_records(&reader, 1000..1150);
}

fn two_writers_claiming_one_segment_id_cannot_both_publish(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "claim");
    let (a, b, r) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // Both open before either publishes: both write segment 0 of writer 7.
    let wa = SegmentsAt::open(&location(&server, &url, a.path()), writer_options(Some(7))).unwrap();
    let wb = SegmentsAt::open(&location(&server, &url, b.path()), writer_options(Some(7))).unwrap();
    put(&wa, 0..30);
    put(&wb, 500..530);
    assert_eq!(wa.publish().unwrap().seq, Some(1));
    let err = wb.publish().unwrap_err();
    match &err {
        Error::Conflict { seq, path, .. } => {
            assert_eq!(*seq, 1);
            assert!(
                path.contains("segment") || path.contains("writer"),
                "{path}"
            );
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert!(err.to_string().contains("writer id"), "{err}");
    let reader = SegmentsAt::open(&location(&server, &url, r.path()), reader_options()).unwrap();
    assert_eq!(reader.remote().unwrap().seq(), 1);
    assert_eq!(reader.len(), 30);
    assert_records(&reader, 0..30);
}
