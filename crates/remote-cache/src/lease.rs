//! Leases and sweeps: the records through which publishers and gc keep
//! out of each other's way. The protocol, and why a commit never names an
//! object gc deleted, is written in `gc.rs`; here are the records.
//!
//! ```text
//! <url>/leases/<writer>-<n>.json   a publish in flight: every object its commit will name
//! <url>/sweeps/<writer>-<n>.json   a gc about to delete: every object it may delete
//!     {"version":1,"writer":…,"ttl_secs":…,"objects":["objects/<blake3>",…]}
//! ```
//!
//! A record lives `ttl_secs` (at most [`MAX_LEASE`]) after the store last
//! wrote it (its last-modified time, the server's clock, judged with a
//! second's slack for the listing's whole-second times). Lapse is judged
//! on the server's clock alone: a publisher reads "now" as its own lease's
//! last-modified time plus the time since (a monotonic clock), gc as the
//! last-modified time of a record it just wrote, so a process whose clock
//! is wrong neither takes a live record for lapsed nor waits forever.
//!
//! A publisher writes its lease before it uploads, reuses or checks any
//! object, then waits for every sweep that names one of those objects to
//! end ([`Lease::take`]); it writes the lease again when a quarter of its
//! life is gone (between uploads) and deletes it once its commit landed
//! or it gave up. A lease renewed after it may have lapsed is written
//! under a new name (gc may delete the old one), its sweeps awaited again,
//! and the objects checked again before the commit. A killed publisher's
//! lease lapses, and gc deletes lapsed leases. A staged writer ([`mod@crate::staged`]), whose commit
//! another process writes later, leaves its lease to lapse
//! ([`STAGED_LEASE`]).
//!
//! A gc writes a sweep naming at most [`SWEEP_OBJECTS`] objects before it
//! reads the leases and deletes any of them ([`Sweep`]), and sends a HEAD
//! or a delete under it only within [`SWEEP_FOR`] of its write: past that
//! (a slow store, a paused process) the sweep ends and the objects left
//! start over in a new sweep, with the leases read again, rather than a
//! delete that might land after a publisher judged the sweep lapsed. It
//! deletes the sweep once every delete it sent was answered. A sweep
//! lives twice the longest a delete may take to land after its write
//! (`SWEEP_FOR` and two requests' bounds, retries included); one whose
//! delete went unanswered, or whose gc was killed, is left to lapse, and
//! a later gc deletes it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use remote_tier::RemoteTier;
use serde::{Deserialize, Serialize};

use crate::commit::{MAX_RECORD, writer_name};
use crate::hooks::{self, Stage};
use crate::{Error, Result};

/// Where leases live, under the log's URL.
pub const LEASES: &str = "leases";
/// Where gc's sweeps live, under the log's URL.
pub const SWEEPS: &str = "sweeps";
/// The format version of lease and sweep records.
pub const LEASE_VERSION: u32 = 1;
/// How long a publish's or push's lease lives unless renewed: an hour
/// (it is renewed every quarter of it while the publish runs).
pub const PUBLISH_LEASE: Duration = Duration::from_secs(3600);
/// How long a staged writer's lease lives (never renewed: the committer
/// is another process): a day, the longest a staged job may take from a
/// writer's upload to its commit.
pub const STAGED_LEASE: Duration = Duration::from_secs(24 * 3600);
/// No lease or sweep lives longer than this, whatever its record says;
/// an unreadable one counts as live until then.
pub const MAX_LEASE: Duration = STAGED_LEASE;
/// The most objects one sweep names: what a publisher that reuses one of
/// them waits for is that many deletes at most.
pub const SWEEP_OBJECTS: usize = 256;
/// A gc sends a HEAD or a delete under a sweep only this long after it
/// began to write the sweep; past it, the objects left start a new sweep.
pub const SWEEP_FOR: Duration = Duration::from_secs(30);
/// How often a publisher that waits for a sweep looks again.
const SWEEP_POLL: Duration = Duration::from_millis(100);
/// Listings give last-modified times in whole seconds: an object may have
/// been written up to this much after the time shown.
pub(crate) const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// A lease or sweep record.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    writer: String,
    ttl_secs: u64,
    objects: Vec<String>,
}

/// A new record's name under `dir`: this writer's, numbered.
fn new_name(dir: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{dir}/{}-{}.json",
        writer_name(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The record `name` on `objects` (sorted, without duplicates), living
/// `ttl`, as stored bytes.
fn encode(tier: &RemoteTier, name: &str, ttl: Duration, objects: Vec<String>) -> Result<Vec<u8>> {
    let record = Record {
        version: LEASE_VERSION,
        writer: writer_name(),
        ttl_secs: ttl.as_secs(),
        objects,
    };
    let corrupt = |problem: String| Error::Corrupt {
        url: tier.url().to_string(),
        name: name.to_string(),
        problem,
    };
    let bytes = serde_json::to_vec(&record).map_err(|e| corrupt(e.to_string()))?;
    if bytes.len() > MAX_RECORD {
        return Err(corrupt(format!(
            "{} bytes, more than the {MAX_RECORD} gc reads: publish fewer files at once",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The server's clock when `name`, just written, was written: its
/// last-modified time (whole seconds on most stores, so at most the true
/// time: what is judged lapsed by it is lapsed).
fn written_at(tier: &RemoteTier, name: &str) -> Result<SystemTime> {
    Ok(tier.head(name)?.last_modified)
}

/// The server's clock now, at most: a probe record written, read back and
/// deleted (under `remote_tier::PROBE_DIR`, which gc leaves alone).
pub(crate) fn server_now(tier: &RemoteTier) -> Result<SystemTime> {
    let name = new_name(remote_tier::PROBE_DIR);
    tier.put_bytes(&name, b"clock".to_vec())?;
    let at = written_at(tier, &name);
    // Best effort: a probe left behind is a few bytes, written over by
    // nothing and read by nothing.
    let _ = tier.delete(&name);
    at
}

/// The records under one directory, as they stand at one time.
#[derive(Default)]
struct Records {
    /// The live ones, read.
    live: Vec<Record>,
    /// The names of the lapsed ones.
    lapsed: Vec<String>,
    /// Live ones that do not read, and why: each counts as live, naming
    /// anything, until [`MAX_LEASE`] after it was written.
    unreadable: Vec<(String, String)>,
}

impl Records {
    /// The records under `dir` at `tier`'s URL as they stand at `now`.
    fn read(tier: &RemoteTier, dir: &str, now: SystemTime) -> Result<Records> {
        let mut records = Records::default();
        for o in tier.list(dir)? {
            let lives = |ttl: Duration| o.last_modified + ttl.min(MAX_LEASE) + CLOCK_SLACK > now;
            if !lives(MAX_LEASE) {
                records.lapsed.push(o.name);
                continue;
            }
            let bytes = match tier.read_remote_capped(&o.name, MAX_RECORD as u64) {
                Ok(b) => b,
                // Deleted since the listing: its publish or sweep ended.
                Err(remote_tier::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let record = serde_json::from_slice(&bytes)
                .map_err(|e| e.to_string())
                .and_then(|r: Record| match r.version {
                    LEASE_VERSION => Ok(r),
                    v => Err(format!(
                        "record version {v}, this build reads {LEASE_VERSION}"
                    )),
                });
            match record {
                Ok(r) if lives(Duration::from_secs(r.ttl_secs)) => records.live.push(r),
                Ok(_) => records.lapsed.push(o.name),
                Err(problem) => records.unreadable.push((o.name, problem)),
            }
        }
        Ok(records)
    }

    /// [`Error::Corrupt`] for the first live record that does not read,
    /// its problem followed by `meanwhile` (what is held back while it may
    /// be live).
    fn refuse_unreadable(&self, tier: &RemoteTier, meanwhile: &str) -> Result<()> {
        match self.unreadable.first() {
            Some((name, problem)) => Err(Error::Corrupt {
                url: tier.url().to_string(),
                name: name.clone(),
                problem: format!("{problem} ({meanwhile})"),
            }),
            None => Ok(()),
        }
    }
}

/// A lease this process holds: deleted when dropped, unless
/// [`keep`](Lease::keep) leaves it to lapse.
#[derive(Debug)]
pub(crate) struct Lease<'t> {
    tier: &'t RemoteTier,
    name: String,
    bytes: Vec<u8>,
    /// What it names, sorted.
    objects: Vec<String>,
    ttl: Duration,
    /// When it was last written (from before the put): `None` before.
    written: Option<Instant>,
    /// The server's clock at the last write (its last-modified time), and
    /// when this process learned it: the publisher's "now" is the first
    /// plus the time since the second.
    server: Option<(SystemTime, Instant)>,
    release: bool,
}

impl<'t> Lease<'t> {
    /// Writes a lease on `objects` (names under `objects/`) that lives
    /// `ttl` unless renewed, then waits until no sweep that may have
    /// missed it can still delete one of them. From then until the lease
    /// is released, an object found in the store stays there.
    pub(crate) fn take(
        tier: &'t RemoteTier,
        ttl: Duration,
        objects: impl IntoIterator<Item = String>,
    ) -> Result<Lease<'t>> {
        let name = new_name(LEASES);
        let mut objects: Vec<String> = objects.into_iter().collect();
        objects.sort();
        objects.dedup();
        let bytes = encode(tier, &name, ttl, objects.clone())?;
        let mut lease = Lease {
            tier,
            name,
            bytes,
            objects,
            ttl,
            written: None,
            server: None,
            release: true,
        };
        lease.renew()?;
        Ok(lease)
    }

    /// Writes the lease again, so that it lives another `ttl`; one that
    /// may have lapsed meanwhile is written under a new name (a gc that
    /// judged it lapsed may delete the old one) and waits for the sweeps
    /// as [`take`](Lease::take) does. Whether it may have lapsed: then an
    /// object checked while it was held may be gone, and the publisher
    /// checks again.
    pub(crate) fn renew(&mut self) -> Result<bool> {
        let missed = self
            .written
            .is_none_or(|w| w.elapsed() + CLOCK_SLACK >= self.ttl);
        if missed && self.written.is_some() {
            let old = std::mem::replace(&mut self.name, new_name(LEASES));
            self.write()?;
            // Best effort: one not deleted lapses, and gc deletes it.
            let _ = self.tier.delete(&old);
        } else {
            self.write()?;
        }
        if missed {
            self.await_sweeps()?;
        }
        Ok(missed && self.written.is_some())
    }

    /// Renews the lease when a quarter of its life is gone; whether it may
    /// have lapsed (see [`renew`](Lease::renew)).
    pub(crate) fn renew_if_due(&mut self) -> Result<bool> {
        if self.written.is_none_or(|w| w.elapsed() >= self.ttl / 4) {
            return self.renew();
        }
        Ok(false)
    }

    /// Leaves the lease in the store, to lapse after its `ttl`: for
    /// uploads that another process commits.
    pub(crate) fn keep(mut self) {
        self.release = false;
    }

    fn write(&mut self) -> Result<()> {
        // Its life counts from before the put: the server's time is later.
        let now = Instant::now();
        self.tier.put_bytes(&self.name, self.bytes.clone())?;
        self.written = Some(now);
        self.server = Some((written_at(self.tier, &self.name)?, Instant::now()));
        Ok(())
    }

    /// The server's clock now, at most: the lease's last write by the
    /// server's clock, plus the time since by this process's.
    fn server_now(&self) -> SystemTime {
        match self.server {
            Some((at, learned)) => at + learned.elapsed(),
            None => SystemTime::UNIX_EPOCH,
        }
    }

    /// Waits until no live sweep names one of the lease's objects (each
    /// judged on the server's clock). A sweep written after the lease
    /// reads it, but one cannot tell which were: every live sweep that
    /// names one of the objects is waited for.
    fn await_sweeps(&mut self) -> Result<()> {
        let mut announced = false;
        loop {
            let sweeps = Records::read(self.tier, SWEEPS, self.server_now())?;
            sweeps.refuse_unreadable(self.tier, "nothing is published while it may be live")?;
            let names_ours = |r: &Record| {
                r.objects
                    .iter()
                    .any(|o| self.objects.binary_search(o).is_ok())
            };
            if !sweeps.live.iter().any(names_ours) {
                return Ok(());
            }
            if !announced {
                hooks::reached(self.tier, Stage::AwaitingSweep);
                announced = true;
            }
            std::thread::sleep(SWEEP_POLL);
            if self.written.is_none_or(|w| w.elapsed() >= self.ttl / 4) {
                self.write()?;
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.release && self.written.is_some() {
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

/// Reads every lease at `tier`'s URL, judged live or lapsed at `now`. A
/// live lease that does not read is [`Error::Corrupt`]: gc deletes
/// nothing rather than what it may protect (until [`MAX_LEASE`] after it
/// was written).
pub(crate) fn held(tier: &RemoteTier, now: SystemTime) -> Result<Held> {
    let leases = Records::read(tier, LEASES, now)?;
    leases.refuse_unreadable(tier, "gc deletes nothing while it may be live")?;
    Ok(Held {
        objects: leases.live.into_iter().flat_map(|r| r.objects).collect(),
        lapsed: leases.lapsed,
    })
}

/// The sweeps at `tier`'s URL that lapsed by `now` (for gc to delete; one
/// that does not read is deleted once [`MAX_LEASE`] is over).
pub(crate) fn lapsed_sweeps(tier: &RemoteTier, now: SystemTime) -> Result<Vec<String>> {
    Ok(Records::read(tier, SWEEPS, now)?.lapsed)
}

/// A gc's sweep in progress: its record names every object the gc may
/// delete until the sweep ends. Deleted when dropped, unless a delete it
/// sent went unanswered (then it lapses).
#[derive(Debug)]
pub(crate) struct Sweep<'t> {
    tier: &'t RemoteTier,
    name: String,
    /// When it was written (from before the put).
    written: Instant,
    /// The server's clock when it was written (its last-modified time).
    server_time: SystemTime,
    /// A delete was sent and not answered: it may land later still.
    unanswered: bool,
    ended: bool,
}

impl<'t> Sweep<'t> {
    /// Writes a sweep naming `objects` (at most [`SWEEP_OBJECTS`]). The
    /// leases gc reads after this are those of publishes that will wait
    /// for the sweep if their lease was written too late to be read.
    pub(crate) fn start(
        tier: &'t RemoteTier,
        objects: impl IntoIterator<Item = String>,
    ) -> Result<Sweep<'t>> {
        let name = new_name(SWEEPS);
        // A delete is sent within SWEEP_FOR of the start of a write of the
        // record (or within a call's bound, the write's own) and answered
        // or given up on within another: the record lives twice that.
        let call = tier.config().retry.call_timeout();
        let lands_within = SWEEP_FOR.saturating_add(call.saturating_mul(2));
        let ttl = lands_within.saturating_mul(2);
        if ttl > MAX_LEASE {
            return Err(Error::BadLocation {
                root: tier.url().to_string(),
                problem: format!(
                    "a request may take {call:?} with its retries (the tier's retry policy): gc \
                     cannot bound when its deletes land (at most {:?})",
                    (MAX_LEASE / 2 - SWEEP_FOR) / 2
                ),
            });
        }
        let mut objects: Vec<String> = objects.into_iter().collect();
        objects.sort();
        objects.dedup();
        let bytes = encode(tier, &name, ttl, objects)?;
        let written = Instant::now();
        tier.put_bytes(&name, bytes)?;
        let mut sweep = Sweep {
            tier,
            name,
            written,
            server_time: SystemTime::UNIX_EPOCH,
            unanswered: false,
            ended: false,
        };
        sweep.server_time = written_at(tier, &sweep.name)?;
        Ok(sweep)
    }

    /// Whether a HEAD or delete may still be sent under the sweep: within
    /// [`SWEEP_FOR`] of its write, so that a delete lands while every
    /// publisher still sees the sweep live. Past it, the caller ends the
    /// sweep and starts the objects left in a new one.
    pub(crate) fn fresh(&self) -> bool {
        self.written.elapsed() < SWEEP_FOR
    }

    /// The server's clock when the sweep was written: leases read after
    /// it are judged lapsed or live at this time (earlier than the read:
    /// a lease judged lapsed is).
    pub(crate) fn server_time(&self) -> SystemTime {
        self.server_time
    }

    /// Deletes `object` (one the sweep names). The caller checked
    /// [`fresh`](Sweep::fresh) just before.
    pub(crate) fn delete(&mut self, object: &str) -> Result<()> {
        self.unanswered = true;
        self.tier.delete(object)?;
        self.unanswered = false;
        Ok(())
    }

    /// Ends the sweep: its record is deleted, and the publishes that wait
    /// for it go on.
    pub(crate) fn end(mut self) -> Result<()> {
        self.ended = true;
        self.tier.delete(&self.name)?;
        Ok(())
    }
}

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        if !self.ended && !self.unanswered {
            // Best effort: one not deleted lapses.
            let _ = self.tier.delete(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remote_tier::TierConfig;

    fn file_tier() -> (tempfile::TempDir, tempfile::TempDir, RemoteTier) {
        let (bucket, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let url = format!("file://{}", bucket.path().display());
        let tier = RemoteTier::open(&url, TierConfig::new(cache.path(), 1 << 30)).unwrap();
        (bucket, cache, tier)
    }

    #[test]
    fn a_lease_holds_its_objects_until_dropped_and_a_bad_one_stops_gc() {
        let (_bucket, _cache, tier) = file_tier();
        let objects = ["objects/aa".to_string(), "objects/bb".to_string()];
        let lease = Lease::take(&tier, PUBLISH_LEASE, objects.clone()).unwrap();
        let now = held(&tier, SystemTime::now()).unwrap();
        assert_eq!(now.objects, objects.iter().cloned().collect());
        assert!(now.lapsed.is_empty());
        drop(lease);
        assert!(tier.list(LEASES).unwrap().is_empty());

        // Left to lapse: still held now, lapsed once its life is over.
        Lease::take(&tier, Duration::from_secs(60), objects.clone())
            .unwrap()
            .keep();
        let later = SystemTime::now() + Duration::from_secs(3600);
        let held_later = held(&tier, later).unwrap();
        assert!(held_later.objects.is_empty());
        assert_eq!(held_later.lapsed.len(), 1);

        tier.put_bytes(&format!("{LEASES}/bad.json"), &b"{not json"[..])
            .unwrap();
        let err = held(&tier, SystemTime::now()).unwrap_err();
        assert!(err.to_string().contains("leases/bad.json"), "{err}");
    }

    #[test]
    fn a_lease_waits_for_a_sweep_of_its_objects_and_no_other() {
        let (_bucket, _cache, tier) = file_tier();
        let sweep = Sweep::start(&tier, ["objects/aa".to_string()]).unwrap();
        // Another object: no wait.
        drop(Lease::take(&tier, PUBLISH_LEASE, ["objects/bb".to_string()]).unwrap());
        let ended = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(SWEEP_POLL * 3);
                ended.store(1, Ordering::SeqCst);
                sweep.end().unwrap();
            });
            let lease = Lease::take(&tier, PUBLISH_LEASE, ["objects/aa".to_string()]).unwrap();
            assert_eq!(
                ended.load(Ordering::SeqCst),
                1,
                "taken before the sweep ended"
            );
            drop(lease);
        });
        assert!(tier.list(SWEEPS).unwrap().is_empty());

        // A sweep that does not read stops the publish, naming it.
        tier.put_bytes(&format!("{SWEEPS}/bad.json"), &b"{not json"[..])
            .unwrap();
        let err = Lease::take(&tier, PUBLISH_LEASE, ["objects/aa".to_string()]).unwrap_err();
        assert!(err.to_string().contains("sweeps/bad.json"), "{err}");
    }

    #[test]
    fn gc_finds_the_sweeps_that_lapsed() {
        let (_bucket, _cache, tier) = file_tier();
        let record = br#"{"version":1,"writer":"w","ttl_secs":60,"objects":["objects/aa"]}"#;
        tier.put_bytes(&format!("{SWEEPS}/left.json"), &record[..])
            .unwrap();
        tier.put_bytes(&format!("{SWEEPS}/bad.json"), &b"{not json"[..])
            .unwrap();
        let now = SystemTime::now();
        assert!(lapsed_sweeps(&tier, now).unwrap().is_empty());
        assert_eq!(
            lapsed_sweeps(&tier, now + Duration::from_secs(3600)).unwrap(),
            [format!("{SWEEPS}/left.json")]
        );
        assert_eq!(
            lapsed_sweeps(&tier, now + MAX_LEASE + Duration::from_secs(2)).unwrap(),
            [format!("{SWEEPS}/bad.json"), format!("{SWEEPS}/left.json")]
        );
    }
}
