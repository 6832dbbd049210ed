//! W9's cache: W5's samples in one page file, published with a block list
//! of the tier block W9 reads in, and the layout the child checks and
//! plans by (each sample's checksum, length and run).

use std::io::Write;
use std::path::{Path, PathBuf};

use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions};
use remote_cache::{RemoteDir, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, TierConfig, build_store};

use super::err;
use crate::RunError;
use crate::w6::server::Server;
use crate::w6::w5::{checksum, sample_bytes};

/// The page file's name in the published directory.
pub(super) const PAGE_FILE: &str = "data.pages";

/// One server's W9 cache: where it is read from and its geometry.
pub(super) struct Cache {
    /// `s3://bucket/w9/data.pages`.
    pub(super) url: String,
    /// The page file's bytes (the dataset's size, D).
    pub(super) bytes: u64,
    /// The tier block its block list was recorded in (the reader's too).
    pub(super) block_size: u64,
    /// The byte ranges a reader keeps for its life (header and tables).
    pub(super) fixed: Vec<std::ops::Range<u64>>,
    /// The largest run (page) in bytes.
    pub(super) max_run: u64,
    /// `(checksum, length, run start, run end)` of every sample, as
    /// little-endian u64s.
    pub(super) layout: PathBuf,
}

/// Writes `n` of W5's samples of `seed` into pages of `page_size` in
/// `scratch`, publishes them to `bucket/w9` on `server` through a tier of
/// `block_size` blocks, and writes the layout beside.
pub(super) fn write(
    server: &Server,
    bucket: &str,
    scratch: &Path,
    n: usize,
    seed: u64,
    page_size: u64,
    block_size: u64,
) -> Result<Cache, RunError> {
    let (read_url, url, options) = server.urls(bucket, "w9");
    let local = scratch.join("local");
    std::fs::create_dir_all(&local).map_err(err)?;
    let path = local.join(PAGE_FILE);
    let schema = Schema::new().bytes("blob");
    let options_w = WriterOptions::default().page_size(page_size);
    let mut writer = PageWriter::create(&path, schema, options_w).map_err(err)?;
    let mut sums = Vec::with_capacity(n);
    for i in 0..n {
        let b = sample_bytes(seed, i);
        sums.push((checksum(&b), b.len() as u64));
        writer.append(&[Value::Bytes(&b)]).map_err(err)?;
    }
    writer.finalize().map_err(err)?;

    // The block list in `block_size` blocks: the reader's tier takes the
    // list's block size for the file.
    let (store, prefix) = build_store(&url, options).map_err(err)?;
    let mut config = TierConfig::new(scratch.join("publish-tier"), 1 << 40);
    config.block_size = block_size;
    let tier = RemoteTier::with_store(store, prefix, &url, config).map_err(err)?;
    let remote =
        RemoteDir::open(tier, &local, StoreFiles::for_kind(StoreKind::PageAlloc)).map_err(err)?;
    remote.publish().map_err(err)?;
    drop(remote);
    server.settle(bucket, "w9")?;

    let reader = PageReader::open(&path).map_err(err)?;
    let bytes = std::fs::metadata(&path).map_err(err)?.len();
    let mut head = vec![0u8; page_alloc::format::HEADER_FIXED_LEN];
    std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .map_err(|e| err(format!("{}: the header: {e}", path.display())))?;
    let fixed = page_alloc::format::open_ranges(&head, bytes).to_vec();
    let runs = reader.run_spans();
    let layout = scratch.join("layout.u64");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&layout).map_err(err)?);
    let mut max_run = 0;
    for (i, (sum, len)) in sums.iter().enumerate() {
        let k = runs.partition_point(|r| r.first_sample <= i as u64);
        let run = k
            .checked_sub(1)
            .and_then(|k| runs.get(k))
            .ok_or_else(|| err(format!("sample {i} lies in no run")))?;
        max_run = max_run.max(run.bytes.end - run.bytes.start);
        for v in [*sum, *len, run.bytes.start, run.bytes.end] {
            out.write_all(&v.to_le_bytes()).map_err(err)?;
        }
    }
    out.flush().map_err(err)?;
    let _ = std::fs::remove_dir_all(&local);
    let _ = std::fs::remove_dir_all(scratch.join("publish-tier"));
    Ok(Cache {
        url: format!("{read_url}/{PAGE_FILE}"),
        bytes,
        block_size,
        fixed,
        max_run,
        layout,
    })
}

/// The segment store's name in the bucket (beside the page file's).
pub(super) const SEGMENT_STORE: &str = "w9seg";

/// One server's W9 segment store: where it is read from and its size.
pub(super) struct Segments {
    /// `s3://bucket/w9seg`.
    pub(super) url: String,
    /// The segments' bytes (the dataset's size, D).
    pub(super) bytes: u64,
    /// The largest sample in bytes.
    pub(super) max_sample: u64,
    /// `(checksum, length)` of every sample, as little-endian u64s.
    pub(super) layout: PathBuf,
}

/// Writes the same `n` samples of `seed` as [`write`] into a segment store
/// (`sample_<i>` → `{"blob": bytes}`, `per_segment` to a segment) in
/// `scratch`, publishes it to `bucket/w9seg` on `server`, and writes the
/// layout beside.
pub(super) fn write_segments(
    server: &Server,
    bucket: &str,
    scratch: &Path,
    n: usize,
    seed: u64,
    per_segment: usize,
) -> Result<Segments, RunError> {
    let (read_url, url, options) = server.urls(bucket, SEGMENT_STORE);
    let local = scratch.join("local-segments");
    std::fs::create_dir_all(&local).map_err(err)?;
    let store_options = segment_store::Options {
        flush_every: per_segment,
        ..segment_store::Options::default()
    };
    let store = segment_store::SegmentStore::open(&local, store_options).map_err(err)?;
    let layout = scratch.join("segments-layout.u64");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&layout).map_err(err)?);
    let mut max_sample = 0;
    for start in (0..n).step_by(per_segment) {
        let mut batch = Vec::with_capacity(per_segment);
        for i in start..(start + per_segment).min(n) {
            let b = sample_bytes(seed, i);
            max_sample = max_sample.max(b.len() as u64);
            for v in [checksum(&b), b.len() as u64] {
                out.write_all(&v.to_le_bytes()).map_err(err)?;
            }
            let record = tensor_core::Value::dict([("blob", tensor_core::Value::blob(b))]);
            batch.push((format!("sample_{i}"), record));
        }
        store.put_batch(&batch).map_err(err)?;
    }
    store.flush().map_err(err)?;
    drop(store);
    out.flush().map_err(err)?;
    let bytes = std::fs::read_dir(local.join("segments"))
        .map_err(err)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "arrow"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();

    let (object_store, prefix) = build_store(&url, options).map_err(err)?;
    let config = TierConfig::new(scratch.join("publish-tier-segments"), 1 << 40);
    let tier = RemoteTier::with_store(object_store, prefix, &url, config).map_err(err)?;
    let remote = RemoteDir::open(tier, &local, StoreFiles::for_kind(StoreKind::SegmentStore))
        .map_err(err)?;
    remote.publish().map_err(err)?;
    drop(remote);
    server.settle(bucket, SEGMENT_STORE)?;
    let _ = std::fs::remove_dir_all(&local);
    let _ = std::fs::remove_dir_all(scratch.join("publish-tier-segments"));
    Ok(Segments {
        url: read_url,
        bytes,
        max_sample,
        layout,
    })
}
