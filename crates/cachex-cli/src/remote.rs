//! `cachex push LOCAL URL` and `cachex pull URL LOCAL`: a cache directory
//! published to object storage as one commit of its commit log (the log
//! the stores opened on a URL publish to), and the log materialised back
//! (through `remote-cache`; credentials and endpoints from the usual
//! environment variables of `object_store`: `AWS_*`, `GOOGLE_*`,
//! `AZURE_*`). And `inspect`, `verify`, `get`, `stats` on a URL: the
//! commit log published there is materialised locally first.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use remote_cache::{CacheDir, Location, TierOptions};
use remote_cache::{pull_dir, push_dir};
use remote_tier::RemoteTier;

use crate::error::{CliError, EXIT_SOUND, Result};

/// A temporary local tier for a command run without `--tier-dir`.
fn tier_dir(dir: Option<PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => Ok((d, None)),
        None => {
            let tmp = tempfile::tempdir().map_err(CliError::io(
                "create temporary directory",
                std::env::temp_dir(),
            ))?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

fn open(url: &str, dir: &Path, budget_mib: u64) -> Result<RemoteTier> {
    open_tier(url, dir, budget_mib.saturating_mul(1 << 20))?
        .ok_or_else(|| CliError::Usage(format!("{url}: not a URL")))
}

/// The commit log at `url` through the local tier at `tier_dir` of
/// `tier_budget` bytes, by remote-cache's one road (the storage options
/// of the environment); `None` when `url` is a local path.
pub(crate) fn open_tier(
    url: &str,
    tier_dir: &Path,
    tier_budget: u64,
) -> Result<Option<RemoteTier>> {
    let options = TierOptions {
        tier_dir: Some(tier_dir.to_path_buf()),
        tier_budget: Some(tier_budget),
        ..TierOptions::default()
    };
    let location = Location::parse_with(url, &options).map_err(remote_cache_error)?;
    let Location::Remote(spec) = location else {
        return Ok(None);
    };
    RemoteTier::open_with_options(&spec.url, spec.options.clone(), spec.tier.clone())
        .map(Some)
        .map_err(remote_error)
}

/// A URL the store cannot open is a usage error; the rest are problems.
pub(crate) fn remote_error(e: remote_tier::Error) -> CliError {
    match e {
        remote_tier::Error::BadUrl { .. } | remote_tier::Error::BadOption { .. } => {
            CliError::Usage(e.to_string())
        }
        e => CliError::store(e),
    }
}

fn bar(what: &str, progress: bool) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template(&format!("{what} [{{bar:40}}] {{pos}}/{{len}} files"))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// Publishes the cache directory `local` at `url` as the next commit of
/// its commit log.
pub(crate) fn push(local: &Path, url: &str, progress: bool) -> Result<(u8, String)> {
    if !local.exists() {
        return Err(CliError::NoSuchPath(local.to_path_buf()));
    }
    if !local.is_dir() {
        return Err(CliError::Usage(format!(
            "{}: push publishes a cache directory",
            local.display()
        )));
    }
    let (dir, _tmp) = tier_dir(None)?;
    let tier = open(url, &dir, 64)?;
    let bar = bar("push", progress);
    let report = push_dir(&tier, local, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .map_err(remote_cache_error)?;
    bar.finish_and_clear();
    let text = match report.seq {
        Some(seq) => format!(
            "pushed {} to {} as commit {seq}: {} files, {} new or changed, {} removed, {} uploaded \
             ({} bytes), the rest already there",
            local.display(),
            tier.url(),
            report.files,
            report.changed,
            report.removed,
            report.uploaded,
            report.bytes_uploaded
        ),
        None => format!(
            "{} already holds {} as it is ({} files): nothing pushed",
            tier.url(),
            local.display(),
            report.files
        ),
    };
    Ok((EXIT_SOUND, text))
}

/// Materialises the commit log at `url` into `local`.
pub(crate) fn pull(
    url: &str,
    local: &Path,
    tier: Option<PathBuf>,
    budget_mib: u64,
) -> Result<(u8, String)> {
    let (dir, _tmp) = tier_dir(tier)?;
    let tier = open(url, &dir, budget_mib)?;
    let report = pull_dir(&tier, local).map_err(remote_cache_error)?;
    if report.seq == 0 {
        return Err(CliError::NotFound {
            path: PathBuf::from(tier.url()),
            what: "nothing published here (no commits/)".into(),
        });
    }
    Ok((
        EXIT_SOUND,
        format!(
            "pulled commit {} of {} into {}: {} commits and {} checkpoints applied, {} files \
             written, {} removed",
            report.seq,
            tier.url(),
            local.display(),
            report.commits,
            report.checkpoints,
            report.fetched,
            report.removed
        ),
    ))
}

/// A cache published at a URL, materialised in a local directory for a
/// read-only command; the directory lives as long as this.
pub(crate) struct Materialised {
    /// The local copy the adapters read.
    pub(crate) path: PathBuf,
    _opened: CacheDir,
}

/// Materialises the cache at `url`: its commit log (written by the stores
/// opened on a URL) applied in a working directory of this command's own
/// — another command, or a training process, may hold the first one —
/// on the local tier remote-cache's road picks (`CACHEX_TIER_DIR`, kept,
/// so a second command fetches only what is new).
pub(crate) fn materialise(url: &str) -> Result<Materialised> {
    let location = Location::parse(url).map_err(remote_cache_error)?;
    if !matches!(location, Location::Remote(_)) {
        return Err(CliError::Usage(format!("{url}: not a URL")));
    }
    let opened = location.open_dir(None).map_err(remote_cache_error)?;
    match opened.remote() {
        Some(r) if r.seq() > 0 => Ok(Materialised {
            path: opened.path().to_path_buf(),
            _opened: opened,
        }),
        Some(r) => Err(CliError::NotFound {
            path: PathBuf::from(r.tier().url()),
            what: "nothing published here (no commits/)".into(),
        }),
        None => Err(CliError::Usage(format!("{url}: not a URL"))),
    }
}

/// A location remote-cache cannot parse or open: a usage error when the
/// URL itself is wrong, a store problem otherwise.
pub(crate) fn remote_cache_error(e: remote_cache::Error) -> CliError {
    match e {
        remote_cache::Error::BadLocation { .. } => CliError::Usage(e.to_string()),
        remote_cache::Error::Tier(t) => remote_error(t),
        e => CliError::store(e),
    }
}
