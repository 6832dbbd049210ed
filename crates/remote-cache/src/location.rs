//! [`Location`]: where a cache lives — a local directory, or an object
//! store URL read through a local tier.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use remote_tier::{RemoteTier, TierConfig, redact_url};
use serde::{Deserialize, Serialize};

use crate::remote_dir::{PublishReport, RefreshReport, RemoteDir};
use crate::{Error, Result};
use crate::{StoreFiles, StoreKind};

/// The environment variable naming the local tier directory.
pub const TIER_DIR_ENV: &str = "CACHEX_TIER_DIR";
/// The environment variable giving the local tier's budget (bytes, or
/// with a `K`/`M`/`G`/`T` suffix, powers of 1024).
pub const TIER_BUDGET_ENV: &str = "CACHEX_TIER_BUDGET";
/// The local tier's budget when neither the caller nor the environment
/// gives one: 20 GiB.
pub const DEFAULT_TIER_BUDGET: u64 = 20 << 30;

/// Tier settings a caller gives — a Python keyword (`tier_dir=`,
/// `tier_budget=`, `storage_options=`), a facade config's `remote`
/// section, a `cachex` flag — spelled the same everywhere; what it leaves
/// unset comes from the environment (`CACHEX_TIER_DIR`,
/// `CACHEX_TIER_BUDGET`), read here and nowhere else. In a facade
/// config (`"remote": {...}`), every field optional:
///
/// ```json
/// {"tier_dir": "/scratch/tier", "tier_budget": 53687091200,
///  "storage_options": {"aws_endpoint": "http://127.0.0.1:9000"},
///  "single_publisher": false}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierOptions {
    /// The local tier directory (default: `CACHEX_TIER_DIR`, else
    /// `$XDG_CACHE_HOME/cachex/tier`, else `~/.cache/cachex/tier`),
    /// shared by every cache and process.
    #[serde(default)]
    pub tier_dir: Option<PathBuf>,
    /// The local tier's budget in bytes (default: `CACHEX_TIER_BUDGET`,
    /// else [`DEFAULT_TIER_BUDGET`]).
    #[serde(default)]
    pub tier_budget: Option<u64>,
    /// `object_store` options over the environment's (`aws_endpoint`,
    /// `aws_region`, `aws_allow_http`, ...). Credentials belong in the
    /// environment (`AWS_ACCESS_KEY_ID`, ...); options are never written
    /// to disk nor shown. A config file may call them `options`.
    #[serde(default, alias = "options")]
    pub storage_options: BTreeMap<String, String>,
    /// Only one writer ever publishes to the URL
    /// ([`TierConfig::single_publisher`]): publishing works on servers
    /// that ignore conditional puts.
    #[serde(default)]
    pub single_publisher: bool,
}

impl TierOptions {
    /// These settings over `base`: each one given here wins, the storage
    /// options of both are kept (these over `base`'s on a shared key).
    pub fn over(self, base: &TierOptions) -> TierOptions {
        let mut storage_options = base.storage_options.clone();
        storage_options.extend(self.storage_options);
        TierOptions {
            tier_dir: self.tier_dir.or_else(|| base.tier_dir.clone()),
            tier_budget: self.tier_budget.or(base.tier_budget),
            storage_options,
            single_publisher: self.single_publisher || base.single_publisher,
        }
    }

    /// The tier these settings describe for the cache root `root` (named
    /// in errors, redacted).
    pub fn tier_config(&self, root: &str) -> Result<TierConfig> {
        let dir = match &self.tier_dir {
            Some(d) => d.clone(),
            None => tier_dir_from_env(root)?,
        };
        let budget = match self.tier_budget {
            Some(b) => b,
            None => tier_budget_from_env(root)?,
        };
        let mut config = TierConfig::new(dir, budget);
        config.single_publisher = self.single_publisher;
        Ok(config)
    }
}

/// Where a cache lives.
#[derive(Debug, Clone)]
pub enum Location {
    /// A local directory, opened as the stores always do.
    Local(PathBuf),
    /// An object store URL, materialised in a local working directory.
    Remote(Box<RemoteSpec>),
}

/// An object store URL and how to read it locally.
#[derive(Debug, Clone)]
pub struct RemoteSpec {
    /// `s3://bucket/prefix`, `gs://…`, `az://…`, `file:///…`, `memory:///`.
    pub url: String,
    /// `object_store` options over the environment's (`aws_endpoint`,
    /// `aws_allow_http`, …). Credentials belong in the environment.
    pub options: Vec<(String, String)>,
    /// The local tier (shared by every cache and process on the machine).
    pub tier: TierConfig,
    /// The working directory the store opens: one per cache and process
    /// at a time. Default: the first of the URL's working directories on
    /// the tier that no other handle holds ([`open_in_work_dir`]).
    pub work_dir: Option<PathBuf>,
}

impl Location {
    /// A cache root as a user writes it: a URL (`scheme://…`) is remote,
    /// read through the local tier that `CACHEX_TIER_DIR` and
    /// `CACHEX_TIER_BUDGET` describe (default: `~/.cache/cachex/tier`,
    /// 20 GiB); anything else is a local path.
    pub fn parse(root: &str) -> Result<Location> {
        Location::parse_with(root, &TierOptions::default())
    }

    /// As [`parse`](Location::parse), with the caller's tier settings
    /// over the environment's.
    pub fn parse_with(root: &str, options: &TierOptions) -> Result<Location> {
        if !is_url(root) {
            return Ok(Location::Local(PathBuf::from(root)));
        }
        let tier = options.tier_config(root)?;
        Ok(Location::remote(root, tier).with_options(options.storage_options.clone()))
    }

    /// A remote location with the local tier `tier`.
    pub fn remote(url: &str, tier: TierConfig) -> Location {
        Location::Remote(Box::new(RemoteSpec {
            url: url.to_string(),
            options: Vec::new(),
            tier,
            work_dir: None,
        }))
    }

    /// This location with `object_store` options added (remote only).
    pub fn with_options<I, K, V>(mut self, options: I) -> Location
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        if let Location::Remote(spec) = &mut self {
            spec.options
                .extend(options.into_iter().map(|(k, v)| (k.into(), v.into())));
        }
        self
    }

    /// This location with its working directory set (remote only).
    pub fn with_work_dir(mut self, dir: impl Into<PathBuf>) -> Location {
        if let Location::Remote(spec) = &mut self {
            spec.work_dir = Some(dir.into());
        }
        self
    }

    /// Whether the cache is remote.
    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Remote(_))
    }

    /// The location as it may be shown: a path, or the URL redacted
    /// ([`redact_url`]).
    pub fn shown(&self) -> String {
        match self {
            Location::Local(dir) => dir.display().to_string(),
            Location::Remote(spec) => redact_url(&spec.url),
        }
    }

    /// Opens the location for a store of `kind`: the local directory
    /// itself, or a working directory of this handle's own with every
    /// published commit applied. `None`: a cache whose kind is not known
    /// before it is opened ([`StoreFiles::for_kind`]).
    pub fn open_dir(&self, kind: impl Into<Option<StoreKind>>) -> Result<CacheDir> {
        self.open(StoreFiles::for_kind(kind))
    }

    /// Opens the cache at `rel` (a `/`-separated path) under this root for
    /// a store of `kind`: `<dir>/<rel>`, or, for a URL, the commit log at
    /// `<url>/<rel>` in `<work>/<rel>`, where `<work>` is a working
    /// directory of the root's own ([`CacheDir::root`]) — for a caller
    /// that lays out several caches under one root (the facade).
    pub fn open_dir_under(
        &self,
        rel: &str,
        kind: impl Into<Option<StoreKind>>,
    ) -> Result<CacheDir> {
        let files = StoreFiles::for_kind(kind);
        match self {
            Location::Local(dir) => Ok(CacheDir {
                root: dir.clone(),
                dir: dir.join(rel),
                remote: None,
            }),
            Location::Remote(spec) => {
                let rel = rel.trim_matches('/');
                if rel.split('/').any(|c| c == ".." || c == ".") {
                    return Err(Error::BadLocation {
                        root: redact_url(&spec.url),
                        problem: format!("{rel:?} leaves the root"),
                    });
                }
                let url = format!("{}/{rel}", spec.url.trim_end_matches('/'));
                let tier =
                    RemoteTier::open_with_options(&url, spec.options.clone(), spec.tier.clone())?;
                let open = |work: &Path| {
                    let dir = work.join(rel);
                    RemoteDir::open(tier.clone(), &dir, files).map(|r| (dir, r))
                };
                let (root, (dir, remote)) = match &spec.work_dir {
                    Some(w) => (w.clone(), open(w)?),
                    None => open_in_work_dir(&spec.tier.tier_dir, &spec.url, open)?,
                };
                Ok(CacheDir {
                    root,
                    dir,
                    remote: Some(remote),
                })
            }
        }
    }

    /// Opens the location for a store: the local directory itself, or the
    /// working directory with every published commit applied.
    pub(crate) fn open(&self, files: StoreFiles) -> Result<CacheDir> {
        let opened = self.open_unapplied(files)?;
        if let Some(r) = &opened.remote {
            r.refresh_at_open()?;
        }
        Ok(opened)
    }

    /// As [`open`](Location::open), but the working directory holds only
    /// the commits applied there before ([`RemoteDir::open_unapplied`]).
    pub(crate) fn open_unapplied(&self, files: StoreFiles) -> Result<CacheDir> {
        match self {
            Location::Local(dir) => Ok(CacheDir {
                root: dir.clone(),
                dir: dir.clone(),
                remote: None,
            }),
            Location::Remote(spec) => {
                let tier = RemoteTier::open_with_options(
                    &spec.url,
                    spec.options.clone(),
                    spec.tier.clone(),
                )?;
                let (work, remote) = match &spec.work_dir {
                    Some(d) => (d.clone(), RemoteDir::open_unapplied(tier, d, files)?),
                    None => {
                        let url = tier.url().to_string();
                        open_in_work_dir(&spec.tier.tier_dir, &url, |work| {
                            RemoteDir::open_unapplied(tier.clone(), work, files)
                        })?
                    }
                };
                Ok(CacheDir {
                    root: work.clone(),
                    dir: work,
                    remote: Some(remote),
                })
            }
        }
    }
}

/// An opened location: the directory a store opens, and, when remote,
/// the commit log behind it, which [`publish`](CacheDir::publish) and
/// [`refresh`](CacheDir::refresh) keep in step. The working directory is
/// this handle's while it lives.
#[derive(Debug)]
pub struct CacheDir {
    pub(crate) root: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) remote: Option<RemoteDir>,
}

impl CacheDir {
    /// The directory the store opens.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The root it lies under ([`Location::open_dir_under`]); the
    /// directory itself otherwise.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether a commit log is behind the directory.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The commit log behind a remote cache.
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Publishes what the store wrote in the directory since the last
    /// publish, as one commit (nothing for a local cache). The store
    /// must have made it durable first (its flush or close).
    pub fn publish(&self) -> Result<PublishReport> {
        match &self.remote {
            Some(r) => r.publish(),
            None => Ok(PublishReport::default()),
        }
    }

    /// Applies the commits published since (whole commits only; nothing
    /// for a local cache).
    pub fn refresh(&self) -> Result<RefreshReport> {
        match &self.remote {
            Some(r) => r.refresh(),
            None => Ok(RefreshReport::default()),
        }
    }
}

/// Whether `root` is a URL (`scheme://…`), not a path.
pub fn is_url(root: &str) -> bool {
    match root.split_once("://") {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
        }
        None => false,
    }
}

/// `<tier dir>/work/<first 16 hex of BLAKE3(url)>`: the first working
/// directory of `url` on the tier ([`work_dir`] 0).
pub fn default_work_dir(tier_dir: &Path, url: &str) -> PathBuf {
    work_dir(tier_dir, url, 0)
}

/// The most working directories one URL has on one local tier: as many
/// processes (or handles) may hold it open at once.
pub const MAX_WORK_DIRS: u32 = 256;

/// Working directory `n` of `url` on the tier at `tier_dir`:
/// `<tier dir>/work/<first 16 hex of BLAKE3(url)>` for 0, with `.<n>`
/// appended for the others.
pub fn work_dir(tier_dir: &Path, url: &str, n: u32) -> PathBuf {
    let hash = blake3::hash(url.trim_end_matches('/').as_bytes()).to_hex();
    let name = match n {
        0 => hash.as_str()[..16].to_string(),
        n => format!("{}.{n}", &hash.as_str()[..16]),
    };
    tier_dir.join("work").join(name)
}

/// Runs `open` on the working directories of `url` on the tier at
/// `tier_dir` in turn until one is not [`Error::Busy`]: each process (or
/// handle) that opens one URL on one tier gets a working directory of its
/// own, all of them reading the tier's one copy of each fetched object.
/// A directory is held by its handle's lock, which the system lets go
/// when its process dies: the next opener takes that directory over,
/// with the commits already applied there, so working directories never
/// outnumber the handles once open at the same time. Returns the
/// directory taken and what `open` made of it.
pub fn open_in_work_dir<T>(
    tier_dir: &Path,
    url: &str,
    mut open: impl FnMut(&Path) -> Result<T>,
) -> Result<(PathBuf, T)> {
    for n in 0..MAX_WORK_DIRS {
        let dir = work_dir(tier_dir, url, n);
        match open(&dir) {
            Err(Error::Busy { .. }) => continue,
            opened => return opened.map(|t| (dir, t)),
        }
    }
    Err(Error::Busy {
        path: work_dir(tier_dir, url, MAX_WORK_DIRS - 1),
    })
}

fn tier_dir_from_env(root: &str) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(TIER_DIR_ENV) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("cachex").join("tier"));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("cachex").join("tier")),
        None => Err(Error::BadLocation {
            root: shown(root),
            problem: format!("no local tier: set {TIER_DIR_ENV}"),
        }),
    }
}

fn tier_budget_from_env(root: &str) -> Result<u64> {
    match std::env::var(TIER_BUDGET_ENV) {
        Ok(v) => parse_bytes(&v).ok_or_else(|| Error::BadLocation {
            root: shown(root),
            problem: format!("{TIER_BUDGET_ENV}={v:?} is not a size (e.g. 500M, 20G)"),
        }),
        Err(_) => Ok(DEFAULT_TIER_BUDGET),
    }
}

/// `123`, `500M`, `20G`, `1.5T` (powers of 1024) as bytes.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], s[i..].trim_end_matches(['b', 'B', 'i'])),
        None => (s, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    let n: f64 = num.trim().parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let bytes = n * (1u64 << shift) as f64;
    (bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// A root as it may be shown: a URL redacted, a path as written.
fn shown(root: &str) -> String {
    if is_url(root) {
        redact_url(root)
    } else {
        root.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_and_sizes() {
        assert!(is_url("s3://bucket/p") && is_url("memory:///") && is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/x") && !is_url("relative/dir") && !is_url("://x"));
        assert_eq!(parse_bytes("500M"), Some(500 << 20));
        assert_eq!(parse_bytes("20GiB"), Some(20 << 30));
        assert_eq!(parse_bytes("1234"), Some(1234));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(shown("s3://key:secret@bucket/p?sig=1"), "s3://bucket/p");
        let a = default_work_dir(Path::new("/t"), "s3://b/p");
        assert_eq!(a, default_work_dir(Path::new("/t"), "s3://b/p/"));
        assert_ne!(a, default_work_dir(Path::new("/t"), "s3://b/q"));
    }
}
