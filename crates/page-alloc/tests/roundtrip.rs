//! Write then read back: values, layout rules, determinism across thread
//! counts, oversized samples, batch buffers and epoch orders.

use std::path::Path;

use page_alloc::{
    BoxError, BufferPool, FieldValue, PageReader, PageWriter, ReadOptions, SampleOut, SampleSource,
    Schema, Slot, Value, WriterOptions, inspect, verify,
};
use proptest::prelude::*;
use tensor_core::DType;

/// Deterministic bytes of sample `i`, field `f`, `len` long.
fn payload(i: usize, f: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(31) ^ f.wrapping_mul(7) ^ j.wrapping_mul(13)) as u8)
        .collect()
}

/// A source of `sizes.len()` samples: (id int, score float, blob bytes, aux bytes).
struct Generated {
    sizes: Vec<(usize, usize)>,
}

impl SampleSource for Generated {
    fn len(&self) -> usize {
        self.sizes.len()
    }

    fn describe(&self, i: usize, slots: &mut [Slot]) -> Result<(), BoxError> {
        let (a, b) = self.sizes[i];
        slots[0] = Slot::Int(i as i64 * 3 - 5);
        slots[1] = Slot::Float(i as f64 / 4.0);
        slots[2] = Slot::Size(a as u64);
        slots[3] = Slot::Size(b as u64);
        Ok(())
    }

    fn fill(&self, i: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError> {
        for f in [2, 3] {
            let dst = out.field(f).ok_or("missing region")?;
            let len = dst.len();
            dst.copy_from_slice(&payload(i, f, len));
        }
        Ok(())
    }
}

fn schema() -> Schema {
    Schema::new()
        .int("id")
        .float("score")
        .bytes("blob")
        .bytes("aux")
}

fn write_generated(path: &Path, sizes: &[(usize, usize)], threads: usize, opts: WriterOptions) {
    let mut w = PageWriter::create(path, schema(), opts).unwrap();
    w.write_parallel(
        &Generated {
            sizes: sizes.to_vec(),
        },
        threads,
    )
    .unwrap();
    w.finalize().unwrap();
}

fn check_generated(path: &Path, sizes: &[(usize, usize)]) {
    let r = PageReader::open(path).unwrap();
    assert_eq!(r.len(), sizes.len());
    let align = r.alignment();
    let page = r.page_size();
    for (i, &(a, b)) in sizes.iter().enumerate() {
        let s = r.sample(i).unwrap();
        assert_eq!(s.int(0).unwrap(), i as i64 * 3 - 5);
        assert_eq!(s.float(1).unwrap(), i as f64 / 4.0);
        let blob = s.bytes(2).unwrap();
        let aux = s.bytes(3).unwrap();
        assert_eq!(blob, &payload(i, 2, a)[..]);
        assert_eq!(aux, &payload(i, 3, b)[..]);
        for part in [blob, aux] {
            if !part.is_empty() {
                let off = part.as_ptr() as usize - r.bytes().as_ptr() as usize;
                assert_eq!(off as u64 % align, 0, "sample {i} allocation misaligned");
            }
        }
        // A sample that fits in a page never straddles one: its first and
        // last byte are on the same page (page k starts at data_offset + k * page).
        let data_offset = u64::from_le_bytes(r.bytes()[40..48].try_into().unwrap()) as usize;
        let offset = |p: &[u8]| p.as_ptr() as usize - r.bytes().as_ptr() as usize - data_offset;
        let parts: Vec<&[u8]> = [blob, aux].into_iter().filter(|p| !p.is_empty()).collect();
        if let (Some(first), Some(last)) = (parts.first(), parts.last()) {
            let first_page = offset(first) / page as usize;
            let last_page = (offset(last) + last.len() - 1) / page as usize;
            let needed = (a + b).div_ceil(page as usize);
            if a + b + align as usize <= page as usize {
                assert_eq!(first_page, last_page, "sample {i} straddles pages");
            } else {
                assert!(last_page - first_page < needed + 1, "sample {i} spread out");
            }
        }
    }
    assert!(verify(path).is_empty(), "{:?}", verify(path));
}

#[test]
fn append_and_read_back_every_field_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.pages");
    let schema = Schema::new()
        .int("i")
        .float("x")
        .bytes("b")
        .array("a", DType::F32, [2, 3]);
    let mut w = PageWriter::create(&path, schema.clone(), WriterOptions::default()).unwrap();
    let arr: Vec<u8> = (0..6u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    for i in 0..10 {
        let b = payload(i, 0, i * 100);
        w.append(&[
            Value::Int(-(i as i64)),
            Value::Float(i as f64 + 0.5),
            Value::Bytes(&b),
            Value::Bytes(&arr),
        ])
        .unwrap();
    }
    assert_eq!(w.len(), 10);
    let summary = w.finalize().unwrap();
    assert_eq!(summary.num_samples, 10);
    assert_eq!(summary.num_runs, 1);
    let r = PageReader::open(&path).unwrap();
    assert_eq!(r.schema(), &schema);
    for i in 0..10 {
        let s = r.sample(i).unwrap();
        assert_eq!(s.get(0).unwrap(), FieldValue::Int(-(i as i64)));
        assert_eq!(s.get(1).unwrap(), FieldValue::Float(i as f64 + 0.5));
        assert_eq!(
            s.get(2).unwrap(),
            FieldValue::Bytes(&payload(i, 0, i * 100))
        );
        let t = s.array(3).unwrap();
        assert_eq!(
            t.as_slice::<f32>().unwrap(),
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(t.shape().dims(), &[2, 3]);
    }
    // Wrong accessors are typed errors.
    let s = r.sample(0).unwrap();
    assert!(s.bytes(0).is_err());
    assert!(s.int(2).is_err());
    assert!(s.get(9).is_err());
    assert!(r.sample(10).is_err());
    assert_eq!(r.field_index("b").unwrap(), 2);
    assert!(r.field_index("nope").is_err());
}

#[test]
fn empty_file_and_inline_only_schema() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pages");
    PageWriter::create(&empty, schema(), WriterOptions::default())
        .unwrap()
        .finalize()
        .unwrap();
    let r = PageReader::open(&empty).unwrap();
    assert!(r.is_empty());
    assert!(r.quasi_random_order(3, 2).is_empty());

    let inline = dir.path().join("inline.pages");
    let mut w =
        PageWriter::create(&inline, Schema::new().int("a"), WriterOptions::default()).unwrap();
    for i in 0..50 {
        w.append(&[Value::Int(i)]).unwrap();
    }
    w.finalize().unwrap();
    let r = PageReader::open(&inline).unwrap();
    assert_eq!(
        (0..50)
            .map(|i| r.sample(i).unwrap().int(0).unwrap())
            .sum::<i64>(),
        1225
    );
    assert!(verify(&inline).is_empty());
}

#[test]
fn oversized_samples_get_contiguous_page_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pages");
    let page = 4096usize;
    let sizes = vec![
        (10, 10),
        (3 * page + 5, 0),
        (100, 2 * page),
        (5, 5),
        (page, 0),
    ];
    write_generated(
        &path,
        &sizes,
        2,
        WriterOptions::default()
            .page_size(page as u64)
            .alignment(64),
    );
    check_generated(&path, &sizes);
    let summary = inspect(&path).unwrap();
    // 1 page, 4 pages, 3 pages, 1 page, 1 page (the exact-page sample opens its own).
    assert_eq!(summary.num_runs, 5);
    assert_eq!(summary.num_pages, 10);
    assert_eq!(summary.fields[2].max_bytes, 3 * page as u64 + 5);
    assert!(summary.to_string().contains("samples"));
}

#[test]
fn bytes_do_not_depend_on_thread_count_or_direct_io() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Vec<(usize, usize)> = (0..300)
        .map(|i| ((i * 37) % 3000, (i * 101) % 900))
        .collect();
    let opts = WriterOptions::default().page_size(16 << 10).alignment(512);
    let mut files = Vec::new();
    for threads in [1, 2, 3, 4] {
        let path = dir.path().join(format!("t{threads}.pages"));
        write_generated(&path, &sizes, threads, opts.clone());
        files.push(std::fs::read(&path).unwrap());
    }
    let direct = dir.path().join("direct.pages");
    write_generated(&direct, &sizes, 2, opts.clone().direct_io(true));
    files.push(std::fs::read(&direct).unwrap());
    // Appending one by one plans the same layout.
    let seq = dir.path().join("seq.pages");
    let mut w = PageWriter::create(&seq, schema(), opts).unwrap();
    for (i, &(a, b)) in sizes.iter().enumerate() {
        let (pa, pb) = (payload(i, 2, a), payload(i, 3, b));
        w.append(&[
            Value::Int(i as i64 * 3 - 5),
            Value::Float(i as f64 / 4.0),
            Value::Bytes(&pa),
            Value::Bytes(&pb),
        ])
        .unwrap();
    }
    w.finalize().unwrap();
    files.push(std::fs::read(&seq).unwrap());
    for f in &files[1..] {
        assert!(f == &files[0], "files differ");
    }
    check_generated(&direct, &sizes);
}

#[test]
fn buffer_pool_fills_batches_without_growing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.pages");
    let sizes: Vec<(usize, usize)> = (0..64).map(|i| (i * 11, 64 - i)).collect();
    write_generated(&path, &sizes, 2, WriterOptions::default().page_size(8192));
    let r = PageReader::open(&path).unwrap();
    let mut pool = BufferPool::new(&r, 8).unwrap();
    let caps = pool.field_data(2).unwrap().as_ptr();
    for batch in r.quasi_random_order(9, 3).chunks(8) {
        r.prefetch(batch).unwrap();
        r.fill_batch(batch, &mut pool).unwrap();
        assert_eq!(pool.len(), batch.len());
        for (k, &i) in batch.iter().enumerate() {
            assert_eq!(pool.ints(0).unwrap()[k], i as i64 * 3 - 5);
            assert_eq!(pool.floats(1).unwrap()[k], i as f64 / 4.0);
            assert_eq!(pool.bytes(2, k).unwrap(), &payload(i, 2, sizes[i].0)[..]);
            assert_eq!(pool.bytes(3, k).unwrap(), &payload(i, 3, sizes[i].1)[..]);
        }
        // The data buffer was never reallocated.
        assert_eq!(pool.field_data(2).unwrap().as_ptr(), caps);
    }
    let too_many: Vec<usize> = (0..9).collect();
    assert!(r.fill_batch(&too_many, &mut pool).is_err());
    assert!(pool.ints(2).is_none());
}

#[test]
fn quasi_random_order_is_a_permutation_grouped_by_page_windows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.pages");
    let sizes: Vec<(usize, usize)> = (0..500).map(|i| (200 + i % 50, 0)).collect();
    write_generated(
        &path,
        &sizes,
        1,
        WriterOptions::default().page_size(4096).alignment(8),
    );
    let r = PageReader::open_with(
        &path,
        &ReadOptions {
            populate: true,
            verify_pages: true,
        },
    )
    .unwrap();
    let order = r.quasi_random_order(42, 2);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..500).collect::<Vec<_>>());
    assert_ne!(order, (0..500).collect::<Vec<_>>());
    assert_eq!(order, r.quasi_random_order(42, 2));
    assert_ne!(order, r.quasi_random_order(43, 2));
}

#[test]
fn quasi_random_shares_are_disjoint_whole_pages_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.pages");
    let sizes: Vec<(usize, usize)> = (0..500).map(|i| (200 + i % 50, 0)).collect();
    write_generated(
        &path,
        &sizes,
        1,
        WriterOptions::default().page_size(4096).alignment(8),
    );
    let r = PageReader::open(&path).unwrap();
    assert_eq!(
        r.quasi_random_share(7, 2, 0, 1).unwrap(),
        r.quasi_random_order(7, 2)
    );
    // The page a sample's blob lies on.
    let base = r.bytes().as_ptr() as usize;
    let page_of = |i: usize| {
        let blob = r.sample(i).unwrap().bytes(2).unwrap();
        (blob.as_ptr() as usize - base) as u64 / r.page_size()
    };
    let shares: Vec<Vec<usize>> = (0..3)
        .map(|k| r.quasi_random_share(7, 2, k, 3).unwrap())
        .collect();
    let mut all: Vec<usize> = shares.concat();
    all.sort_unstable();
    assert_eq!(all, (0..500).collect::<Vec<_>>());
    for (k, a) in shares.iter().enumerate() {
        for b in &shares[k + 1..] {
            let pages_b: std::collections::HashSet<u64> = b.iter().map(|&i| page_of(i)).collect();
            assert!(a.iter().all(|&i| !pages_b.contains(&page_of(i))));
        }
    }
    let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
    let per_page = 500 / r.num_runs() + 1;
    assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 2 * per_page);
    assert_eq!(shares[1], r.quasi_random_share(7, 2, 1, 3).unwrap());
    assert!(r.quasi_random_share(7, 2, 3, 3).is_err());
    assert!(r.quasi_random_share(7, 2, 0, 0).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn roundtrip_any_sizes_threads_alignment(
        sizes in prop::collection::vec((0usize..3 * 4096, 0usize..2000), 0..40),
        threads in 1usize..=4,
        align_log in 3u32..=12,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pages");
        let opts = WriterOptions::default().page_size(4096).alignment(1 << align_log);
        write_generated(&path, &sizes, threads, opts);
        check_generated(&path, &sizes);
    }
}

#[test]
fn direct_io_writes_the_same_bytes_on_tmpfs() {
    // Older kernels' tmpfs refuses O_DIRECT (the writer then falls back to
    // buffered writes), newer ones accept it: the file is the same.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let sizes: Vec<(usize, usize)> = (0..50).map(|i| (i * 97, 13)).collect();
    let opts = WriterOptions::default().page_size(8192);
    let direct = dir.path().join("direct.pages");
    let mut w = PageWriter::create(&direct, schema(), opts.clone().direct_io(true)).unwrap();
    w.write_parallel(
        &Generated {
            sizes: sizes.clone(),
        },
        2,
    )
    .unwrap();
    assert_eq!(w.finalize().unwrap().num_samples, 50);
    let buffered = dir.path().join("buffered.pages");
    write_generated(&buffered, &sizes, 1, opts);
    assert_eq!(
        std::fs::read(&direct).unwrap(),
        std::fs::read(&buffered).unwrap()
    );
    check_generated(&direct, &sizes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn beton_roundtrip_any_sizes(
        sizes in prop::collection::vec((0usize..300_000, -1000i64..1000), 0..30),
    ) {
        use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.beton");
        let fields = [
            BetonField::new("n", BetonType::Int),
            BetonField::new("b", BetonType::Bytes),
            BetonField::new("j", BetonType::Json),
        ];
        let blobs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, (n, _))| payload(i, 0, *n)).collect();
        let texts: Vec<String> = sizes.iter().map(|(_, v)| format!("[{v}, \"x\"]")).collect();
        let samples: Vec<Vec<BetonValue>> = sizes
            .iter()
            .enumerate()
            .map(|(i, (_, v))| vec![BetonValue::Int(*v), BetonValue::Bytes(&blobs[i]), BetonValue::Json(&texts[i])])
            .collect();
        beton::write_with_page_size(&path, &fields, &samples, 2 << 20).unwrap();
        let file = beton::read(&path).unwrap();
        prop_assert_eq!(file.len(), samples.len());
        for (i, want) in samples.iter().enumerate() {
            prop_assert_eq!(&file.sample(i).unwrap(), want);
        }
        // One writer packs samples into pages in order: pages never go
        // back, start at 0, and no page holds more than a page of bytes.
        let pages = file.sample_pages();
        prop_assert_eq!(pages.len(), samples.len());
        let pages: Vec<u64> = pages.into_iter().map(|p| p.expect("JSON is always stored")).collect();
        prop_assert!(pages.first().is_none_or(|&p| p == 0));
        prop_assert!(pages.windows(2).all(|w| w[0] <= w[1] && w[1] <= w[0] + 1));
        let mut used = std::collections::HashMap::new();
        for (i, &p) in pages.iter().enumerate() {
            *used.entry(p).or_insert(0usize) += blobs[i].len() + texts[i].len() + 1;
        }
        prop_assert!(used.values().all(|&b| b <= 2 << 20));
    }
}

#[test]
fn beton_without_stored_fields_has_no_pages() {
    use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inline.beton");
    let fields = [BetonField::new("n", BetonType::Int)];
    let samples: Vec<Vec<BetonValue>> = (0..5).map(|i| vec![BetonValue::Int(i)]).collect();
    beton::write(&path, &fields, &samples).unwrap();
    assert_eq!(beton::read(&path).unwrap().sample_pages(), vec![None; 5]);
}
