//! Files published in two steps, for a job whose writers run on many
//! machines and must become visible together (a Ray write job): each
//! writer uploads its files as content-addressed objects with
//! [`upload_files`] — no commit, so no reader sees them — and hands the
//! pieces it gets back to one committer, which publishes them all with
//! [`commit_files`] as *one* commit of the log, claimed like any other
//! (conditionally, the next number).
//!
//! Each writer's upload holds a lease on its objects
//! ([`STAGED_LEASE`], a day, left to lapse),
//! so that a gc between the uploads and the commit keeps them however
//! long the job runs; the committer holds one of its own from its check
//! that every object is there until its commit landed. A writer that
//! fails, or whose output the committer never names, leaves only objects
//! that no commit refers to: `cachex gc` deletes them once the lease
//! lapsed and the grace period is over. A committer that reads the log's state
//! ([`LogState::read`](crate::LogState::read)) to decide what it writes
//! (which names are free, what a file holds) commits against that state
//! only: when another writer took the number meanwhile, [`commit_files`]
//! says so and the committer decides again against the newer state.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use remote_tier::RemoteTier;

use crate::commit::{COMMIT_VERSION, Commit, MAX_RECORD, Piece, check_commit, commit_name, encode};
use crate::files::StoreFiles;
use crate::hooks::{self, Stage};
use crate::lease::{Lease, PUBLISH_LEASE, STAGED_LEASE};
use crate::remote_dir::STORE_BLOCK_HASHES;
use crate::upload;
use crate::workdir::hash_open;
use crate::{Error, Location, Result};

/// The block hashes in a store's own block size that one writer's
/// [`upload_files`] lists by default: a sixteenth of what one publish
/// lists (64 MiB of segments in 4 KiB blocks), so that the pieces of many
/// writers still make a commit record every reader accepts. Past it,
/// files get hashes in the tier's (larger) block size.
pub const WRITER_BLOCK_HASHES: u64 = STORE_BLOCK_HASHES / 16;

/// The object store of a remote location (without opening a working
/// directory). A local path is [`Error::BadLocation`].
pub fn open_tier(location: &Location) -> Result<RemoteTier> {
    match location {
        Location::Local(path) => Err(Error::BadLocation {
            root: path.display().to_string(),
            problem: "a local path has no commit log: staged files are published to a URL".into(),
        }),
        Location::Remote(spec) => Ok(RemoteTier::open_with_options(
            &spec.url,
            spec.options.clone(),
            spec.tier.clone(),
        )?),
    }
}

/// Uploads each `(path in the cache, local file)` of `files` as the
/// object of its BLAKE3 (unless the store has it, written recently) and
/// returns the pieces that name them, whole files that replace what the
/// cache held under that path — the same pieces, with the same block
/// hashes for files readers read by blocks, that a publish of the store
/// kind `store` would list. At most `block_hashes` of them are in the
/// store's own block size ([`WRITER_BLOCK_HASHES`] is a sound default).
/// Nothing is committed; a lease keeps the objects from gc for
/// [`STAGED_LEASE`]. A file whose bytes
/// changed after they were hashed is refused
/// ([`remote_tier::Error::SourceChanged`]) and nothing of it is stored.
pub fn upload_files(
    tier: &RemoteTier,
    store: StoreFiles,
    files: &[(String, &Path)],
    block_hashes: u64,
) -> Result<Vec<Piece>> {
    let mut pieces = Vec::with_capacity(files.len());
    let mut hashes_left = block_hashes;
    for (rel, path) in files {
        if !crate::commit::is_cache_path(rel) || (store.private)(rel) {
            return Err(Error::BadLocation {
                root: path.display().to_string(),
                problem: format!("`{rel}` is not a file a cache publishes"),
            });
        }
        let file = File::open(path).map_err(Error::io("open", path))?;
        let size = file.metadata().map_err(Error::io("stat", path))?.len();
        // As a publish decides it (journal's `changes`).
        let block_size = store.block_list_size(rel, size, tier.config(), &mut hashes_left);
        let (blake3, blocks) = hash_open(&file, path, 0, size, block_size)?;
        pieces.push(Piece {
            path: rel.clone(),
            offset: 0,
            size,
            blake3,
            replace: true,
            blocks: blocks.map(|b| b.to_list()),
        });
    }
    hooks::reached(tier, Stage::Hashed);
    // The committer is another process, maybe hours later: the lease is
    // left to lapse ([`STAGED_LEASE`]), and gc keeps the objects until then.
    let mut lease = Lease::take(tier, STAGED_LEASE, pieces.iter().map(Piece::object))?;
    for (piece, (_, path)) in pieces.iter().zip(files) {
        // A lease that may have lapsed is checked again below anyway.
        let _ = lease.renew_if_due()?;
        let file = File::open(path).map_err(Error::io("open", path))?;
        upload::put_piece(tier, piece, &file, path)?;
    }
    hooks::reached(tier, Stage::Uploaded);
    // Checked again while the lease may have lapsed during the check.
    let _ = lease.renew_if_due()?;
    loop {
        for (piece, (_, path)) in pieces.iter().zip(files) {
            let file = File::open(path).map_err(Error::io("open", path))?;
            upload::ensure_present(tier, piece, &file, path)?;
        }
        if !lease.renew_if_due()? {
            break;
        }
    }
    lease.keep();
    Ok(pieces)
}

/// The bytes of file `path` made of `pieces` (as a [`LogState`](crate::LogState) lists
/// them: the first at offset 0, each next one where the previous ends),
/// fetched from their objects into memory, each checked against its
/// BLAKE3 — for a reader that takes a whole small file of a commit it
/// decided by (a committer's schema, a read task's segment), without a
/// working directory.
pub fn read_file(tier: &RemoteTier, path: &str, pieces: &[Piece]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for p in pieces {
        check_next(tier, path, p, out.len() as u64)?;
        let bytes = tier.read_remote_capped(&p.object(), p.size)?;
        if bytes.len() as u64 != p.size || blake3::hash(&bytes).to_hex().as_str() != p.blake3 {
            return Err(Error::Corrupt {
                url: tier.url().to_string(),
                name: p.object(),
                problem: format!("does not hold the {} bytes {path} names", p.size),
            });
        }
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

/// As [`read_file`], into the local file `dest` (created or truncated)
/// rather than memory: each object is fetched whole through the local
/// tier (blocks in parallel, checked against its BLAKE3) and copied, so
/// a large file costs disk, not memory. Returns the bytes written.
pub fn fetch_file(tier: &RemoteTier, path: &str, pieces: &[Piece], dest: &Path) -> Result<u64> {
    let mut out = File::create(dest).map_err(Error::io("create", dest))?;
    let mut written = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for p in pieces {
        check_next(tier, path, p, written)?;
        let hash = blake3::Hash::from_hex(&p.blake3).map_err(|e| Error::Corrupt {
            url: tier.url().to_string(),
            name: path.to_string(),
            problem: format!("`{}` is not a BLAKE3 hash: {e}", p.blake3),
        })?;
        let expected = remote_tier::Expected {
            size: Some(p.size),
            blake3: Some(*hash.as_bytes()),
        };
        let object = tier.fetch(&p.object(), &expected)?;
        let mut at = 0u64;
        while at < p.size {
            let n = (p.size - at).min(buf.len() as u64) as usize;
            object
                .file()?
                .read_exact_at(&mut buf[..n], at)
                .map_err(Error::io("read", object.path()))?;
            out.write_all(&buf[..n]).map_err(Error::io("write", dest))?;
            at += n as u64;
        }
        written += p.size;
    }
    out.flush().map_err(Error::io("write", dest))?;
    Ok(written)
}

/// Checks that piece `p` continues file `path` where it so far ends (`at`).
fn check_next(tier: &RemoteTier, path: &str, p: &Piece, at: u64) -> Result<()> {
    if p.path != path || p.offset != at {
        return Err(Error::Corrupt {
            url: tier.url().to_string(),
            name: path.to_string(),
            problem: format!(
                "a piece of {} at byte {}, where {path} so far ends at {at}",
                p.path, p.offset
            ),
        });
    }
    Ok(())
}

/// Publishes `pieces` (from [`upload_files`], in the order readers apply
/// them) and `removed` as commit `after + 1`, the one after the state the
/// caller decided them against. Every piece's object must be in the store
/// (a writer's upload that gc removed, or that never finished, is
/// [`Error::Corrupt`] naming it, and nothing is committed). Returns
/// `None` when another writer took the number: read the state again,
/// decide again and call again.
pub fn commit_files(
    tier: &RemoteTier,
    after: u64,
    pieces: Vec<Piece>,
    removed: Vec<String>,
) -> Result<Option<u64>> {
    let seq = crate::commit::next_seq(tier.url(), after)?;
    let name = commit_name(seq);
    let log = crate::log_id::ensure_log_id(tier, crate::log_id::read_log_id(tier)?)?;
    let commit = Commit {
        version: COMMIT_VERSION,
        seq,
        writer: crate::commit::writer_name(),
        pieces,
        removed,
        log,
    };
    let corrupt = |problem: String| Error::Corrupt {
        url: tier.url().to_string(),
        name: name.clone(),
        problem,
    };
    check_commit(&commit).map_err(corrupt)?;
    // Held from the check that every object is there until the commit
    // landed: a gc meanwhile keeps them.
    let _lease = Lease::take(tier, PUBLISH_LEASE, commit.pieces.iter().map(Piece::object))?;
    for p in &commit.pieces {
        match tier.head(&p.object()) {
            Ok(info) if info.size == p.size => {}
            Ok(info) => {
                return Err(corrupt(format!(
                    "{}: its object {} holds {} bytes, not {}",
                    p.path,
                    p.object(),
                    info.size,
                    p.size
                )));
            }
            Err(remote_tier::Error::NotFound { .. }) => {
                return Err(corrupt(format!(
                    "{}: its object {} is not in the store (never uploaded, or removed by gc)",
                    p.path,
                    p.object()
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let bytes = encode(tier, &name, &commit)?;
    if bytes.len() > MAX_RECORD {
        return Err(corrupt(format!(
            "{} bytes, more than the {MAX_RECORD} a reader accepts: commit fewer files at once",
            bytes.len()
        )));
    }
    match tier.commit(&name, bytes) {
        Ok(()) => Ok(Some(seq)),
        Err(remote_tier::Error::CommitTaken { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LogState, StoreKind};
    use remote_tier::TierConfig;

    fn tier(bucket: &Path, cache: &Path) -> RemoteTier {
        let url = format!("file://{}", bucket.display());
        open_tier(&Location::remote(&url, TierConfig::new(cache, 1 << 30))).unwrap()
    }

    #[test]
    fn uploads_are_invisible_until_one_commit_names_them() {
        let (bucket, cache, src) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let tier = tier(bucket.path(), cache.path());
        let (a, b) = (src.path().join("a"), src.path().join("b"));
        std::fs::write(&a, b"alpha").unwrap();
        std::fs::write(&b, vec![7u8; 10_000]).unwrap();
        let segments = StoreFiles::for_kind(StoreKind::SegmentStore);
        let first = upload_files(
            &tier,
            segments,
            &[("schema.json".into(), a.as_path())],
            WRITER_BLOCK_HASHES,
        )
        .unwrap();
        let second = upload_files(
            &tier,
            segments,
            &[("segments/segment_000001.arrow".into(), b.as_path())],
            WRITER_BLOCK_HASHES,
        )
        .unwrap();
        // A segment is read by 4 KiB blocks: its piece lists their hashes.
        assert!(second[0].blocks.is_some() && first[0].blocks.is_none());
        assert_eq!(LogState::read(&tier).unwrap().seq, 0);

        let pieces: Vec<Piece> = first.into_iter().chain(second).collect();
        assert_eq!(
            commit_files(&tier, 0, pieces.clone(), vec![]).unwrap(),
            Some(1)
        );
        let state = LogState::read(&tier).unwrap();
        assert_eq!(state.seq, 1);
        assert_eq!(state.files.len(), 2);
        assert_eq!(
            read_file(&tier, "schema.json", &state.files["schema.json"]).unwrap(),
            b"alpha"
        );
        let segment = "segments/segment_000001.arrow";
        assert_eq!(
            read_file(&tier, segment, &state.files[segment]).unwrap(),
            vec![7u8; 10_000]
        );
        assert!(read_file(&tier, "schema.json", &state.files[segment]).is_err());
        let copy = src.path().join("copy");
        assert_eq!(
            fetch_file(&tier, segment, &state.files[segment], &copy).unwrap(),
            10_000
        );
        assert_eq!(std::fs::read(&copy).unwrap(), vec![7u8; 10_000]);
        // Decided against a stale state: the number is taken.
        assert_eq!(commit_files(&tier, 0, pieces, vec![]).unwrap(), None);
    }

    #[test]
    fn a_piece_whose_object_is_missing_is_never_committed() {
        let (bucket, cache, src) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let tier = tier(bucket.path(), cache.path());
        let a = src.path().join("a");
        std::fs::write(&a, b"alpha").unwrap();
        let mut pieces = upload_files(
            &tier,
            StoreFiles::PLAIN,
            &[("a".into(), a.as_path())],
            WRITER_BLOCK_HASHES,
        )
        .unwrap();
        pieces[0].blake3 = blake3::hash(b"other").to_hex().to_string();
        let err = commit_files(&tier, 0, pieces, vec![]).unwrap_err();
        assert!(err.to_string().contains("not in the store"), "{err}");
        assert_eq!(LogState::read(&tier).unwrap().seq, 0);
        let bad = upload_files(
            &tier,
            StoreFiles::PLAIN,
            &[("../x".into(), a.as_path())],
            WRITER_BLOCK_HASHES,
        );
        assert!(bad.is_err());
    }
}
