//! Reading the snapshots of the older push layout: `cachex push` used to
//! publish a cache directory as a manifest under `manifests/`, beside
//! the commit log that the stores publish to. Push now publishes a commit
//! of that log (`remote_cache::push_dir`), and a bucket of the older
//! layout is converted into a commit by `cachex migrate`
//! (`remote_cache::migrate`); what is left here reads such a
//! bucket: its latest manifest, and a pull of it into a directory.
//!
//! A snapshot's files are stored under the BLAKE3 of their bytes (the
//! same `objects/<blake3>` a commit log names), and its manifest lists
//! each file's path, size and hash. Readers take the highest readable
//! manifest. A pull copies every file whole into its directory, and
//! checks each against its BLAKE3 before a byte of it is written there.
//!
//! ```text
//! <url>/objects/<blake3 hex>         one file's bytes
//! <url>/manifests/<seq, 20 digits>.json
//!     {"version":1,"seq":N,"writer":"<host-pid-time>","files":[{"path","size","blake3"}]}
//! ```

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::Expected;
use crate::tier::RemoteTier;
use crate::{Error, Result};

/// Where content-addressed files live under the URL.
pub const OBJECTS: &str = "objects";
/// Where manifests live under the URL.
pub const MANIFESTS: &str = "manifests";
/// The manifest format version.
pub const MANIFEST_VERSION: u32 = 1;
/// A manifest is never larger than this.
const MAX_MANIFEST: usize = 64 << 20;

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Its path relative to the cache directory, `/`-separated.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The BLAKE3 of its bytes, hex.
    pub blake3: String,
}

/// A published snapshot: the record of one push of the older layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// Its sequence number; the highest is the current snapshot.
    pub seq: u64,
    /// Who published it (host, process, time): makes every record unique.
    pub writer: String,
    /// The files, sorted by path.
    pub files: Vec<ManifestEntry>,
}

impl crate::record::SeqRecord for Manifest {
    const KIND: &'static str = "manifest";
    const VERSION: u32 = MANIFEST_VERSION;
    const MAX_BYTES: usize = MAX_MANIFEST;
    fn version(&self) -> u32 {
        self.version
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// What [`pull_dir`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullReport {
    /// The sequence number of the snapshot pulled.
    pub seq: u64,
    /// Files in the snapshot.
    pub files: u64,
    /// Files written into the directory (the others were already right).
    pub written: u64,
}

fn manifest_name(seq: u64) -> String {
    format!("{MANIFESTS}/{seq:020}.json")
}

/// The BLAKE3 and size of the file at `path`.
fn hash_file(path: &Path) -> Result<(blake3::Hash, u64)> {
    let file = std::fs::File::open(path).map_err(Error::io("open", path))?;
    let mut hasher = blake3::Hasher::new();
    let size = std::io::copy(&mut &file, &mut hasher).map_err(Error::io("read", path))?;
    Ok((hasher.finalize(), size))
}

/// Manifests passed over as unreadable before a read gives up.
const MAX_UNREADABLE: usize = 16;

/// The current manifest of the snapshot at `tier`'s URL, if any: the
/// highest-numbered one that reads and checks. An unreadable one above it
/// (a stray object under a well-formed name, a publish cut short) is
/// passed over, so one bad object never stops every pull.
pub fn latest_manifest(tier: &RemoteTier) -> Result<Option<Manifest>> {
    Ok(latest_readable(tier, &manifest_seqs(tier)?)?.map(|(m, _)| m))
}

/// The highest readable manifest among `seqs` (sorted ascending) and how
/// many numbers above it were passed over.
fn latest_readable(tier: &RemoteTier, seqs: &[u64]) -> Result<Option<(Manifest, usize)>> {
    let mut first_error = None;
    for (skipped, &seq) in seqs.iter().rev().enumerate() {
        match read_manifest(tier, seq) {
            Ok(m) => return Ok(Some((m, skipped))),
            // Listed, then removed, or never a manifest: the one below.
            Err(e @ (Error::Corrupt { .. } | Error::NotFound { .. })) => {
                if skipped + 1 >= MAX_UNREADABLE {
                    return Err(first_error.unwrap_or(e));
                }
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The sequence number a well-formed manifest name carries:
/// `manifests/` + exactly 20 decimal digits + `.json`, within `u64`.
fn parse_manifest_name(name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(MANIFESTS)?
        .strip_prefix('/')?
        .strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The sequence numbers of every well-formed manifest name, ascending.
fn manifest_seqs(tier: &RemoteTier) -> Result<Vec<u64>> {
    let mut seqs: Vec<u64> = tier
        .list(MANIFESTS)?
        .iter()
        .filter_map(|o| parse_manifest_name(&o.name))
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    Ok(seqs)
}

/// Reads and checks manifest `seq`.
pub fn read_manifest(tier: &RemoteTier, seq: u64) -> Result<Manifest> {
    let name = manifest_name(seq);
    let bytes = tier.read_remote_capped(&name, MAX_MANIFEST as u64)?;
    let corrupt = |problem: String| Error::Corrupt {
        url: tier.url().to_string(),
        name: name.clone(),
        problem,
    };
    let m: Manifest = crate::record::decode_record(&bytes, seq).map_err(corrupt)?;
    for f in &m.files {
        if blake3::Hash::from_hex(&f.blake3).is_err() {
            return Err(corrupt(format!(
                "{}: `{}` is not a BLAKE3 hash",
                f.path, f.blake3
            )));
        }
        if !crate::record::is_relative_inside(&f.path) {
            return Err(corrupt(format!(
                "`{}` is not a relative path inside the cache",
                f.path
            )));
        }
    }
    Ok(m)
}

/// Materialises the current snapshot at `tier`'s URL into `dest`: each
/// file fetched through the local tier (verified against its BLAKE3),
/// copied into place (temporary file, fsync, rename). Files already right
/// are kept, so a killed pull resumes; files `dest` has beyond the
/// snapshot are left alone. Returns `None` when nothing was published.
pub fn pull_dir(tier: &RemoteTier, dest: &Path) -> Result<Option<PullReport>> {
    pull_dir_with_progress(tier, dest, &mut |_, _| {})
}

/// [`pull_dir`], calling `progress(files done, files in all)` after each
/// file (for a progress bar).
pub fn pull_dir_with_progress(
    tier: &RemoteTier,
    dest: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Option<PullReport>> {
    let Some(manifest) = latest_manifest(tier)? else {
        return Ok(None);
    };
    let mut report = PullReport {
        seq: manifest.seq,
        files: manifest.files.len() as u64,
        written: 0,
    };
    let mut dirs = HashSet::new();
    for (done, entry) in manifest.files.iter().enumerate() {
        progress(done as u64, report.files);
        let target = dest.join(&entry.path);
        if target.is_file() && hash_file(&target)? == (parse_hash(&entry.blake3)?, entry.size) {
            continue;
        }
        let expected = Expected {
            size: Some(entry.size),
            blake3: Some(*parse_hash(&entry.blake3)?.as_bytes()),
        };
        let object = tier.fetch(&format!("{OBJECTS}/{}", entry.blake3), &expected)?;
        let parent = durable_fs::parent_dir(&target).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = durable_fs::unique_temp_path(&parent, &name);
        let out = durable_fs::create_temp(&tmp)?;
        let copied = object
            .file()
            .and_then(|f| copy_out(&f, object.path(), &out, &tmp, entry.size));
        if let Err(e) = copied.and_then(|()| Ok(durable_fs::commit_temp(out, &tmp, &target)?)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        dirs.insert(parent);
        report.written += 1;
    }
    for d in dirs {
        durable_fs::sync_dir(&d)?;
    }
    progress(report.files, report.files);
    Ok(Some(report))
}

fn parse_hash(hex: &str) -> Result<blake3::Hash> {
    blake3::Hash::from_hex(hex).map_err(|e| Error::Corrupt {
        url: String::new(),
        name: hex.to_string(),
        problem: format!("not a BLAKE3 hash: {e}"),
    })
}

/// Copies `size` bytes of `from` into `to`.
fn copy_out(
    from: &std::fs::File,
    from_path: &Path,
    to: &std::fs::File,
    to_path: &Path,
    size: u64,
) -> Result<()> {
    let mut buf = vec![0u8; 4 << 20];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        from.read_exact_at(&mut buf[..n], at)
            .map_err(Error::io("read", from_path))?;
        to.write_all_at(&buf[..n], at)
            .map_err(Error::io("write", to_path))?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_manifest_names_carry_a_number() {
        assert_eq!(parse_manifest_name(&manifest_name(7)), Some(7));
        assert_eq!(
            parse_manifest_name("manifests/18446744073709551615.json"),
            Some(u64::MAX)
        );
        for bad in [
            "manifests/99999999999999999999.json",
            "manifests/7.json",
            "manifests/0000000000000000000x.json",
            "manifests/+0000000000000000007.json",
            "manifests/00000000000000000007.json.tmp",
            "manifests/sub/00000000000000000007.json",
            "objects/00000000000000000007.json",
        ] {
            assert_eq!(parse_manifest_name(bad), None, "{bad}");
        }
    }
}
