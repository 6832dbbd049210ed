//! `cachex gc URL [--keep DURATION] [--grace DURATION]` and `cachex du
//! URL`: a commit log's garbage collected, and what a bucket holds (see
//! `remote_cache::gc`).

use std::time::Duration;

use remote_cache::{GcOptions, du, gc};
use remote_tier::RemoteTier;
use serde_json::json;

use crate::error::{CliError, EXIT_SOUND, Result};
use crate::remote::{open_tier, remote_cache_error};

/// `30s`, `15m`, `1h`, `7d`, `2w` (a plain number is seconds) as a
/// duration.
pub(crate) fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        "w" => 7 * 24 * 3600,
        _ => return Err(format!("{text:?}: not a duration (30s, 15m, 1h, 7d, 2w)")),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: not a duration (30s, 15m, 1h, 7d, 2w)"))?;
    n.checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: too long"))
}

/// The commit log at `url`, read through a temporary local tier (gc
/// fetches only the pieces of files it folds).
fn open(url: &str) -> Result<(RemoteTier, tempfile::TempDir)> {
    let tmp = tempfile::tempdir().map_err(CliError::io(
        "create temporary directory",
        std::env::temp_dir(),
    ))?;
    let tier = open_tier(url, tmp.path(), 1 << 30)?.ok_or_else(|| {
        CliError::Usage(format!(
            "{url}: not a URL (gc and du work on caches in object storage)"
        ))
    })?;
    Ok((tier, tmp))
}

/// Runs `cachex gc`.
pub(crate) fn run_gc(
    url: &str,
    keep: Duration,
    grace: Duration,
    json: bool,
) -> Result<(u8, String)> {
    let (tier, _tmp) = open(url)?;
    let r = gc(&tier, GcOptions { keep, grace }).map_err(remote_cache_error)?;
    let text = if json {
        json!({
            "url": tier.url(),
            "seq": r.seq,
            "checkpoint": r.checkpoint,
            "folded": r.folded,
            "live_objects": r.live_objects,
            "live_bytes": r.live_bytes,
            "deleted_objects": r.deleted_objects,
            "deleted_bytes": r.deleted_bytes,
            "young_objects": r.young_objects,
            "deleted_checkpoints": r.deleted_checkpoints,
            "leased_objects": r.leased_objects,
            "deleted_leases": r.deleted_leases,
            "deleted_sweeps": r.deleted_sweeps,
            "restarted_sweeps": r.restarted_sweeps,
        })
        .to_string()
    } else {
        let checkpoint = match r.checkpoint {
            Some(c) => format!("checkpoint {c} written ({} files folded)", r.folded),
            None => "no new checkpoint".to_string(),
        };
        format!(
            "gc {}: {} commits, {checkpoint}; deleted {} objects ({} bytes) and {} older \
             checkpoints; kept {} live objects ({} bytes), {} unreferenced ones younger than \
             the grace period and {} that publishes in flight hold; deleted {} lapsed leases \
             and {} lapsed sweeps",
            tier.url(),
            r.seq,
            r.deleted_objects,
            r.deleted_bytes,
            r.deleted_checkpoints,
            r.live_objects,
            r.live_bytes,
            r.young_objects,
            r.leased_objects,
            r.deleted_leases,
            r.deleted_sweeps
        )
    };
    Ok((EXIT_SOUND, text))
}

/// Runs `cachex du`.
pub(crate) fn run_du(url: &str, keep: Duration, json: bool) -> Result<(u8, String)> {
    let (tier, _tmp) = open(url)?;
    let u = du(&tier, keep).map_err(remote_cache_error)?;
    let text = if json {
        json!({
            "url": tier.url(),
            "seq": u.seq,
            "checkpoint": u.checkpoint,
            "window_start": u.window_start,
            "files": u.files,
            "file_bytes": u.file_bytes,
            "live_objects": u.live_objects,
            "live_bytes": u.live_bytes,
            "garbage_objects": u.garbage_objects,
            "garbage_bytes": u.garbage_bytes,
            "commits": u.commits,
            "commit_bytes": u.commit_bytes,
            "checkpoints": u.checkpoints,
            "checkpoint_bytes": u.checkpoint_bytes,
            "total_bytes": u.total_bytes(),
        })
        .to_string()
    } else {
        let checkpoint = u
            .checkpoint
            .map_or_else(|| "none".to_string(), |c| c.to_string());
        [
            format!("url              {}", tier.url()),
            format!("last commit      {}", u.seq),
            format!("files            {} ({} bytes)", u.files, u.file_bytes),
            format!(
                "live             {} objects, {} bytes",
                u.live_objects, u.live_bytes
            ),
            format!(
                "garbage          {} objects, {} bytes",
                u.garbage_objects, u.garbage_bytes
            ),
            format!("commits          {} ({} bytes)", u.commits, u.commit_bytes),
            format!(
                "checkpoints      {} ({} bytes), newest {checkpoint}",
                u.checkpoints, u.checkpoint_bytes
            ),
            format!("window starts at commit {}", u.window_start),
            format!("total            {} bytes", u.total_bytes()),
        ]
        .join("\n")
    };
    Ok((EXIT_SOUND, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_units() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("7 days").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999w").is_err());
    }
}
