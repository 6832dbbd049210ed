//! Multi-writer caches: several processes write one directory at once,
//! each into its own segment ids and index log, with no lock between them;
//! readers merge every log, refresh cheaply, and survive a writer killed
//! at any moment.

use std::path::Path;
use std::time::Duration;
use tensor_core::Value;

use segment_store::format::{self, WRITER_STRIDE};
use segment_store::{Error, Options, SegmentStore};
use tensor_core::Tensor;
use test_support::crash::{child, child_args, report_commit, report_error};

/// Rows per batch; each batch is one flush, one segment.
const ROWS: usize = 16;

fn own_key(w: u32, b: usize, j: usize) -> String {
    format!("w{w}_b{b:04}_r{j}")
}

/// Keys every writer writes (different values): overlapping keys.
fn shared_key(b: usize, j: usize) -> String {
    format!("shared_b{b:04}_r{j}")
}

fn value(w: u32, b: usize, j: usize) -> Vec<f32> {
    vec![w as f32, b as f32, j as f32, 0.5]
}

fn record(w: u32, b: usize, j: usize) -> Value {
    Value::from(Tensor::from_vec([4], value(w, b, j)).expect("tensor"))
}

/// Batch `b` of writer `w`: its own rows, and on even batches the shared
/// rows of batch `b / 2` too.
fn batch(w: u32, b: usize) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = (0..ROWS)
        .map(|j| (own_key(w, b, j), record(w, b, j)))
        .collect();
    if b.is_multiple_of(2) {
        out.extend((0..ROWS).map(|j| (shared_key(b / 2, j), record(w, b / 2, j))));
    }
    out
}

fn writer(w: u32) -> Options {
    Options {
        flush_every: 1 << 20,
        lru_bytes: 0,
        writer_id: Some(w),
        ..Options::default()
    }
}

fn reader() -> Options {
    Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    }
}

fn single() -> Options {
    Options {
        flush_every: 1 << 20,
        lru_bytes: 0,
        ..Options::default()
    }
}

fn values_of(store: &SegmentStore, keys: &[String]) -> Vec<Option<Vec<f32>>> {
    let (recs, _) = store.get_batch(keys).expect("get_batch");
    recs.iter()
        .map(|r| {
            r.as_ref().map(|r| {
                r.as_tensor()
                    .expect("tensor record")
                    .view()
                    .as_slice::<f32>()
                    .expect("f32")
                    .to_vec()
            })
        })
        .collect()
}

/// The child: writer `w` (role `"w:batches"`) writes its batches, reporting
/// each once its flush returned.
fn write_stream(dir: &Path, role: &str) {
    let mut parts = role.split(':');
    let (Some(w), Some(n)) = (parts.next(), parts.next()) else {
        return report_error(&format!("bad role {role:?}"));
    };
    let (Ok(w), Ok(n)) = (w.parse::<u32>(), n.parse::<usize>()) else {
        return report_error(&format!("bad role {role:?}"));
    };
    let store = match SegmentStore::open(dir, writer(w)) {
        Ok(s) => s,
        Err(e) => return report_error(&e.to_string()),
    };
    // A reopened writer continues after what it committed before.
    let start = (0..n)
        .find(|&b| {
            let k = [own_key(w, b, 0)];
            matches!(store.get_batch(&k), Ok((_, m)) if !m.is_empty())
        })
        .unwrap_or(n);
    for b in start..n {
        match store.put_batch(&batch(w, b)).and_then(|()| store.flush()) {
            Ok(()) => report_commit(&format!("{w}:{b}")),
            Err(e) => return report_error(&e.to_string()),
        }
    }
}

#[test]
fn child_writer() {
    // Only does something when spawned by a parent test below.
    if let Some(args) = child_args() {
        write_stream(&args.dir, &args.role);
    }
}

/// Checks a cache written by `writers` writers of batches `0..batches[w]`
/// (only `committed` ones guaranteed): every committed key once, with its
/// writer's value; shared keys hold one writer's value, the same one from
/// every handle; nothing else.
fn check_cache(dir: &Path, batches: &[usize], committed: &[(u32, usize)]) {
    let store = SegmentStore::open(dir, reader()).expect("open reader");
    let again = SegmentStore::open(dir, reader()).expect("open reader again");
    let mut total = 0;
    for (w, &n) in batches.iter().enumerate() {
        let w = w as u32;
        for b in 0..n {
            let keys: Vec<String> = (0..ROWS).map(|j| own_key(w, b, j)).collect();
            let got = values_of(&store, &keys);
            let present = got.iter().filter(|v| v.is_some()).count();
            assert!(
                present == 0 || present == ROWS,
                "writer {w} batch {b} torn: {present} of {ROWS}"
            );
            if committed.contains(&(w, b)) {
                assert_eq!(present, ROWS, "committed batch {b} of writer {w} lost");
            }
            for (j, v) in got.iter().enumerate() {
                if let Some(v) = v {
                    assert_eq!(v, &value(w, b, j), "writer {w} batch {b} row {j}");
                }
            }
            total += present;
        }
    }
    let max_shared = batches.iter().map(|&n| n.div_ceil(2)).max().unwrap_or(0);
    for s in 0..max_shared {
        let keys: Vec<String> = (0..ROWS).map(|j| shared_key(s, j)).collect();
        let got = values_of(&store, &keys);
        assert_eq!(got, values_of(&again, &keys), "shared batch {s} differs");
        let writers_with = |j: usize| {
            (0..batches.len() as u32)
                .filter(|&w| committed.contains(&(w, 2 * s)))
                .map(move |w| value(w, s, j))
                .collect::<Vec<_>>()
        };
        for (j, v) in got.iter().enumerate() {
            let committed_by = writers_with(j);
            match v {
                Some(v) => {
                    assert_eq!(&v[1..], &value(0, s, j)[1..], "shared {s} row {j}");
                    assert!((v[0] as usize) < batches.len(), "shared {s} row {j}: {v:?}");
                    total += 1;
                }
                None => assert!(committed_by.is_empty(), "shared {s} row {j} lost"),
            }
        }
    }
    assert_eq!(store.len(), total, "keys counted more than once, or extra");
    assert_eq!(again.len(), total);
}

fn run_writers(dir: &Path, test: &str, batches: &[usize]) -> Vec<(u32, usize)> {
    let handles: Vec<_> = batches
        .iter()
        .enumerate()
        .map(|(w, &n)| {
            let run = child(test, &format!("{w}:{n}"), dir, w as u64);
            std::thread::spawn(move || run.run())
        })
        .collect();
    let mut committed = Vec::new();
    for h in handles {
        let out = h.join().expect("writer thread");
        assert!(out.errors.is_empty(), "writer errors: {:?}", out.errors);
        committed.extend(out.committed.iter().map(|c| parse_commit(c)));
    }
    committed
}

fn parse_commit(c: &str) -> (u32, usize) {
    let (w, b) = c.split_once(':').expect("w:b");
    (w.parse().expect("writer"), b.parse().expect("batch"))
}

#[test]
fn processes_write_disjoint_and_overlapping_keys_at_once() {
    for writers in [2usize, 4, 8] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let batches: Vec<usize> = (0..writers).map(|w| 6 + w % 3).collect();
        let committed = run_writers(&dir, "child_writer", &batches);
        let want: usize = batches.iter().sum();
        assert_eq!(committed.len(), want);
        check_cache(&dir, &batches, &committed);
        // Every writer kept to its own files.
        for id in list_ids(&dir) {
            assert!((format::writer_of(id) as usize) < writers, "segment {id}");
        }
        for w in 0..writers as u32 {
            assert!(
                dir.join("writers")
                    .join(format::writer_log_name(w))
                    .is_file()
            );
        }
        assert!(!dir.join(format::INDEX_FILE).exists(), "shared log written");
        let store = SegmentStore::open(&dir, reader()).unwrap();
        assert!(store.problems().is_empty(), "{:?}", store.problems());
        assert!(store.verify().is_empty(), "{:?}", store.verify());
        assert!(segment_store::verify(&dir).is_empty());
        let ins = store.inspect();
        assert_eq!(ins.writers.len(), writers);
        for (w, info) in ins.writers.iter().enumerate() {
            assert_eq!(info.id, w as u32);
            assert_eq!(info.segments, Some(batches[w]));
            assert!(!info.active);
        }
        assert!(ins.to_string().contains("writer-0001.log"));
    }
}

fn list_ids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .filter_map(|e| format::parse_segment_name(e.unwrap().file_name().to_str()?))
        .collect()
}

#[test]
fn one_writer_killed_at_random_moments_loses_only_uncommitted_work() {
    let cycles = test_support::crash::cycles(6);
    let mut kills = 0;
    for cycle in 0..cycles {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let batches = [30usize, 30, 30];
        let victim = (cycle % 3) as u32;
        // A seeded moment between 20 and 140 ms into the run.
        let kill_ms = 20 + (cycle as u64 * 7919) % 120;
        let handles: Vec<_> = batches
            .iter()
            .enumerate()
            .map(|(w, &n)| {
                let mut run = child("child_writer", &format!("{w}:{n}"), &dir, w as u64);
                if w as u32 == victim {
                    run = run.kill_after(Duration::from_millis(kill_ms));
                }
                std::thread::spawn(move || run.run())
            })
            .collect();
        let mut committed = Vec::new();
        for h in handles {
            let out = h.join().expect("writer thread");
            assert!(out.errors.is_empty(), "writer errors: {:?}", out.errors);
            kills += usize::from(out.killed);
            committed.extend(out.committed.iter().map(|c| parse_commit(c)));
        }
        check_cache(&dir, &batches, &committed);
        // The killed writer comes back under its id, recovers its own
        // leftovers and finishes; nothing is lost or doubled.
        let out = child("child_writer", &format!("{victim}:30"), &dir, 0).run();
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        committed.extend(out.committed.iter().map(|c| parse_commit(c)));
        let all: Vec<(u32, usize)> = (0..3u32)
            .flat_map(|w| (0..30).map(move |b| (w, b)))
            .collect();
        check_cache(&dir, &batches, &all);
    }
    // The loop tested something: some writer died mid-run.
    assert!(kills > 0, "no writer was killed in {cycles} cycles");
}

#[test]
fn refresh_reads_only_what_others_appended() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let w0 = SegmentStore::open(&dir, writer(0)).unwrap();
    let w1 = SegmentStore::open(&dir, writer(1)).unwrap();
    let r = SegmentStore::open(&dir, reader()).unwrap();
    assert_eq!(r.refresh().unwrap(), 0);
    w0.put_batch(&batch(0, 1)).unwrap();
    w0.flush().unwrap();
    w1.put_batch(&batch(1, 0)).unwrap();
    w1.flush().unwrap();
    let k0 = [own_key(0, 1, 3)];
    let k1 = [own_key(1, 0, 3), shared_key(0, 2)];
    assert_eq!(values_of(&r, &k0), vec![None]);
    assert_eq!(r.refresh().unwrap(), 2);
    assert_eq!(values_of(&r, &k0), vec![Some(value(0, 1, 3))]);
    assert_eq!(
        values_of(&r, &k1),
        vec![Some(value(1, 0, 3)), Some(value(1, 0, 2))]
    );
    assert_eq!(r.refresh().unwrap(), 0);
    // A writer sees the others' records after its own refresh.
    assert_eq!(values_of(&w0, &k1)[0], None);
    assert_eq!(w0.refresh().unwrap(), 1);
    assert_eq!(values_of(&w0, &k1)[0], Some(value(1, 0, 3)));
    // Writer 0 now overwrites a shared key: its segment id is later than
    // writer 1's, so every handle agrees it wins.
    w0.put_batch(&batch(0, 0)).unwrap();
    w0.flush().unwrap();
    r.refresh().unwrap();
    w1.refresh().unwrap();
    let fresh = SegmentStore::open(&dir, reader()).unwrap();
    let k = [shared_key(0, 2)];
    assert_eq!(values_of(&r, &k), vec![Some(value(0, 0, 2))]);
    assert_eq!(values_of(&w1, &k), values_of(&fresh, &k));
    assert_eq!(values_of(&w0, &k), values_of(&fresh, &k));
    assert_eq!(r.len(), fresh.len());
    assert_eq!(w1.len(), fresh.len());
    // A torn tail (a group being appended) is left for a later refresh.
    let log = dir.join("writers").join(format::writer_log_name(1));
    let before = std::fs::metadata(&log).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, b"CXG1\x01\x10").unwrap();
    assert_eq!(r.refresh().unwrap(), 0);
    assert!(r.problems().is_empty(), "{:?}", r.problems());
    f.set_len(before).unwrap();
}

#[test]
fn the_same_writer_twice_and_mixed_modes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let w3 = SegmentStore::open(&dir, writer(3)).unwrap();
    let err = SegmentStore::open(&dir, writer(3)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("writer-0003.lock"), "{err}");
    // Other ids are welcome; a single writer is not while they write.
    let w4 = SegmentStore::open(&dir, writer(4)).unwrap();
    let ins = w4.inspect();
    assert_eq!(
        ins.writers.iter().map(|w| w.active).collect::<Vec<_>>(),
        [true, true]
    );
    let err = SegmentStore::open(&dir, single()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    let err = SegmentStore::open(&dir, writer(format::MAX_WRITER_ID + 1)).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    drop((w3, w4));
    let s = SegmentStore::open(&dir, single()).unwrap();
    let err = SegmentStore::open(&dir, writer(5)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(s);
    SegmentStore::open(&dir, writer(5)).unwrap();
}

#[test]
fn compaction_of_a_multi_writer_cache_keeps_every_key_and_writers_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    // A single-writer cache first: it opens unchanged and joins in.
    {
        let s = SegmentStore::open(&dir, single()).unwrap();
        s.put_batch(&batch(7, 0)).unwrap();
        s.flush().unwrap();
    }
    let batches = [4usize, 5, 3, 0, 0, 0, 0, 2];
    {
        let ws: Vec<SegmentStore> = (0..3)
            .map(|w| SegmentStore::open(&dir, writer(w)).unwrap())
            .collect();
        for (w, s) in ws.iter().enumerate() {
            for b in 0..batches[w] {
                s.put_batch(&batch(w as u32, b)).unwrap();
                s.flush().unwrap();
            }
        }
        let err = ws[0].compact().unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    }
    let before = SegmentStore::open(&dir, reader()).unwrap();
    let mut committed: Vec<(u32, usize)> = (0..3u32)
        .flat_map(|w| (0..batches[w as usize]).map(move |b| (w, b)))
        .collect();
    committed.push((7, 0));
    let check = |store: &SegmentStore| {
        let mut keys = Vec::new();
        for &(w, b) in &committed {
            keys.extend(batch(w, b).into_iter().map(|(k, _)| k));
        }
        keys.sort();
        keys.dedup();
        assert_eq!(store.len(), keys.len());
        let got = values_of(store, &keys);
        assert!(got.iter().all(Option::is_some));
        got
    };
    let want = check(&before);
    let s = SegmentStore::open(&dir, single()).unwrap();
    let report = s.compact().unwrap();
    assert!(report.dropped_rows > 0, "{report:?}");
    assert_eq!(check(&s), want);
    drop(s);
    let logs = std::fs::read_dir(dir.join("writers"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert_eq!(logs, 0, "writer logs left after compaction");
    // A handle opened before sees the compacted cache after a refresh.
    before.refresh().unwrap();
    assert_eq!(check(&before), want);
    let fresh = SegmentStore::open(&dir, reader()).unwrap();
    assert!(fresh.problems().is_empty(), "{:?}", fresh.problems());
    assert_eq!(check(&fresh), want);
    // Writers go on after compaction, with ids above the compacted ones.
    let w7 = SegmentStore::open(&dir, writer(7)).unwrap();
    w7.put_batch(&batch(7, 1)).unwrap();
    w7.flush().unwrap();
    drop(w7);
    let max_compacted = list_ids(&dir).into_iter().max().unwrap();
    assert_eq!(format::writer_of(max_compacted), 7);
    assert!(max_compacted >= WRITER_STRIDE);
    let fresh = SegmentStore::open(&dir, reader()).unwrap();
    assert_eq!(fresh.len(), before.len() + ROWS);
    let k = [own_key(7, 1, 5)];
    assert_eq!(values_of(&fresh, &k), vec![Some(value(7, 1, 5))]);
}

#[test]
fn a_writer_adopts_its_own_unlogged_segment_and_readers_ignore_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    for w in [1u32, 2] {
        let s = SegmentStore::open(&dir, writer(w)).unwrap();
        s.put_batch(&batch(w, 0)).unwrap();
        s.flush().unwrap();
    }
    // Writer 2 crashed between its segment's rename and its log append:
    // cut its log back to the header.
    let log = dir.join("writers").join(format::writer_log_name(2));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(format::INDEX_HEADER_LEN as u64)
        .unwrap();
    let k = [own_key(1, 0, 0), own_key(2, 0, 0)];
    let r = SegmentStore::open(&dir, reader()).unwrap();
    assert_eq!(values_of(&r, &k), vec![Some(value(1, 0, 0)), None]);
    assert!(
        r.problems()
            .iter()
            .any(|p| p.path.ends_with(format::segment_name(2))),
        "{:?}",
        r.problems()
    );
    // Writer 1 does not adopt writer 2's segment; writer 2 does.
    drop(SegmentStore::open(&dir, writer(1)).unwrap());
    let r = SegmentStore::open(&dir, reader()).unwrap();
    assert_eq!(values_of(&r, &k)[1], None);
    drop(SegmentStore::open(&dir, writer(2)).unwrap());
    let r = SegmentStore::open(&dir, reader()).unwrap();
    assert_eq!(
        values_of(&r, &k),
        vec![Some(value(1, 0, 0)), Some(value(2, 0, 0))]
    );
    assert!(r.problems().is_empty(), "{:?}", r.problems());
}

#[test]
fn a_torchcachex_cache_needs_a_single_writer_before_several() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = test_support::copy_fixture("torchcachex/tensor_f32", tmp.path());
    let err = SegmentStore::open(&dir, writer(1)).unwrap_err();
    assert!(err.to_string().contains("single writer"), "{err}");
    drop(SegmentStore::open(&dir, single()).unwrap());
    let w1 = SegmentStore::open(&dir, writer(1)).unwrap();
    let n = w1.len();
    w1.put_batch(&batch(1, 1)).unwrap();
    w1.flush().unwrap();
    assert_eq!(w1.len(), n + ROWS);
}
