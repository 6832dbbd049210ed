//! Leases: a publish in flight, made visible to gc.
//!
//! A publisher uploads its pieces before the commit that names them; a
//! multi-hour push or a long Ray job uploads objects that are older than
//! gc's grace period by the time its commit lands. So before it uploads
//! (or reuses) any object, a publisher writes a lease naming every object
//! its commit will name, and keeps it until the commit landed:
//!
//! ```text
//! <url>/leases/<writer>-<n>.json   {"version":1,"writer":…,"ttl_secs":…,"objects":["objects/<blake3>",…]}
//! ```
//!
//! A lease lives `ttl_secs` after the store last wrote it (its
//! last-modified time, the server's clock, judged as gc judges its grace
//! period). A publisher writes it again when a quarter of that is gone
//! (between uploads) and deletes it once its commit landed or it gave up;
//! a killed publisher's lease lapses, and gc deletes lapsed leases. A
//! staged writer ([`mod@crate::staged`]), whose commit another process
//! writes later, leaves its lease to lapse ([`STAGED_LEASE`]).
//!
//! gc reads the leases, then the commits published meanwhile, before it
//! deletes anything, and again at least every [`GC_RECHECK`] while it
//! deletes; every object a live lease names is kept. The order matters: a
//! publisher deletes its lease only after its commit landed, so a lease
//! gc missed because it was already gone belongs to a commit gc then
//! reads.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use remote_tier::RemoteTier;
use serde::{Deserialize, Serialize};

use crate::commit::{MAX_RECORD, writer_name};
use crate::{Error, Result};

/// Where leases live, under the log's URL.
pub const LEASES: &str = "leases";
/// The lease record's format version.
pub const LEASE_VERSION: u32 = 1;
/// How long a publish's or push's lease lives unless renewed: an hour
/// (it is renewed every quarter of it while the publish runs).
pub const PUBLISH_LEASE: Duration = Duration::from_secs(3600);
/// How long a staged writer's lease lives (never renewed: the committer
/// is another process): a day, the longest a staged job may take from a
/// writer's upload to its commit.
pub const STAGED_LEASE: Duration = Duration::from_secs(24 * 3600);
/// No lease lives longer than this, whatever its record says; an
/// unreadable lease counts as live until then.
pub const MAX_LEASE: Duration = STAGED_LEASE;
/// While it deletes, gc reads the leases and the commits published
/// meanwhile again whenever it last read them longer ago than this.
pub const GC_RECHECK: Duration = Duration::from_secs(1);

/// A lease record.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    writer: String,
    ttl_secs: u64,
    objects: Vec<String>,
}

/// A lease this process holds: deleted when dropped, unless
/// [`keep`](Lease::keep) leaves it to lapse.
#[derive(Debug)]
pub(crate) struct Lease<'t> {
    tier: &'t RemoteTier,
    name: String,
    bytes: Vec<u8>,
    ttl: Duration,
    written: Instant,
    release: bool,
}

impl<'t> Lease<'t> {
    /// Writes a lease on `objects` (names under `objects/`) that lives
    /// `ttl` unless renewed.
    pub(crate) fn take(
        tier: &'t RemoteTier,
        ttl: Duration,
        objects: impl IntoIterator<Item = String>,
    ) -> Result<Lease<'t>> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{LEASES}/{}-{}.json",
            writer_name(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut objects: Vec<String> = objects.into_iter().collect();
        objects.sort();
        objects.dedup();
        let record = Record {
            version: LEASE_VERSION,
            writer: writer_name(),
            ttl_secs: ttl.as_secs(),
            objects,
        };
        let corrupt = |problem: String| Error::Corrupt {
            url: tier.url().to_string(),
            name: name.clone(),
            problem,
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| corrupt(e.to_string()))?;
        if bytes.len() > MAX_RECORD {
            return Err(corrupt(format!(
                "{} bytes, more than the {MAX_RECORD} gc reads: publish fewer files at once",
                bytes.len()
            )));
        }
        let mut lease = Lease {
            tier,
            name,
            bytes,
            ttl,
            written: Instant::now(),
            release: true,
        };
        lease.renew()?;
        Ok(lease)
    }

    /// Writes the lease again, so that it lives another `ttl`.
    pub(crate) fn renew(&mut self) -> Result<()> {
        // Its life counts from before the put: the server's time is later.
        let now = Instant::now();
        self.tier.put_bytes(&self.name, self.bytes.clone())?;
        self.written = now;
        Ok(())
    }

    /// Renews the lease when a quarter of its life is gone.
    pub(crate) fn renew_if_due(&mut self) -> Result<()> {
        if self.written.elapsed() >= self.ttl / 4 {
            self.renew()?;
        }
        Ok(())
    }

    /// Leaves the lease in the store, to lapse after its `ttl`: for
    /// uploads that another process commits.
    pub(crate) fn keep(mut self) {
        self.release = false;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.release {
            // Best effort: one not deleted lapses, and gc deletes it.
            let _ = self.tier.delete(&self.name);
        }
    }
}

/// What the leases in the store hold, as gc reads them.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Every object a live lease names.
    pub(crate) objects: HashSet<String>,
    /// The leases that lapsed (for gc to delete).
    pub(crate) lapsed: Vec<String>,
}

/// Reads every lease at `tier`'s URL, judged live or lapsed at `now`
/// (with `slack` for the listing's whole-second times). A live lease that
/// does not read is [`Error::Corrupt`]: gc deletes nothing rather than
/// what it may protect (until [`MAX_LEASE`] after it was written).
pub(crate) fn held(tier: &RemoteTier, now: SystemTime, slack: Duration) -> Result<Held> {
    let mut held = Held::default();
    for o in tier.list(LEASES)? {
        let lives = |ttl: Duration| o.last_modified + ttl.min(MAX_LEASE) + slack > now;
        if !lives(MAX_LEASE) {
            held.lapsed.push(o.name);
            continue;
        }
        let bytes = match tier.read_remote_capped(&o.name, MAX_RECORD as u64) {
            Ok(b) => b,
            // Released since the listing: its commit landed before.
            Err(remote_tier::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|r: Record| match r.version {
                LEASE_VERSION => Ok(r),
                v => Err(format!(
                    "lease version {v}, this build reads {LEASE_VERSION}"
                )),
            })
            .map_err(|problem| Error::Corrupt {
                url: tier.url().to_string(),
                name: o.name.clone(),
                problem: format!("{problem} (gc deletes nothing while it may be live)"),
            })?;
        if lives(Duration::from_secs(record.ttl_secs)) {
            held.objects.extend(record.objects);
        } else {
            held.lapsed.push(o.name);
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use remote_tier::TierConfig;

    #[test]
    fn a_lease_holds_its_objects_until_dropped_and_a_bad_one_stops_gc() {
        let (bucket, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let url = format!("file://{}", bucket.path().display());
        let tier = RemoteTier::open(&url, TierConfig::new(cache.path(), 1 << 30)).unwrap();
        let objects = ["objects/aa".to_string(), "objects/bb".to_string()];
        let lease = Lease::take(&tier, PUBLISH_LEASE, objects.clone()).unwrap();
        let now = held(&tier, SystemTime::now(), Duration::from_secs(1)).unwrap();
        assert_eq!(now.objects, objects.iter().cloned().collect());
        assert!(now.lapsed.is_empty());
        drop(lease);
        assert!(tier.list(LEASES).unwrap().is_empty());

        // Left to lapse: still held now, lapsed once its life is over.
        Lease::take(&tier, Duration::from_secs(60), objects.clone())
            .unwrap()
            .keep();
        let later = SystemTime::now() + Duration::from_secs(3600);
        let held_later = held(&tier, later, Duration::from_secs(1)).unwrap();
        assert!(held_later.objects.is_empty());
        assert_eq!(held_later.lapsed.len(), 1);

        tier.put_bytes(&format!("{LEASES}/bad.json"), &b"{not json"[..])
            .unwrap();
        let err = held(&tier, SystemTime::now(), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("leases/bad.json"), "{err}");
    }
}
