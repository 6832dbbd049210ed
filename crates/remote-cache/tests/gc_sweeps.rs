//! gc against a publisher that sends again, or reuses, the very object gc
//! is deleting (objects are content-addressed: a file whose bytes an old,
//! unreferenced object holds names that object again): the commit lands
//! and every object it names is in the store, on `file://`, on S3 (moto)
//! and on Azure (Azurite).
//!
//! The publish runs inside the gc, between its last check of the object
//! (HEAD) and its delete, at the gc's `Deleting` stage
//! ([`remote_cache::hooks`]); the gc goes on when the publish has
//! committed or waits for the gc's sweep to end. Then a publishing loop
//! that keeps sending the same few objects runs beside a gc loop
//! (`CACHEX_GC_SOAK_ROUNDS` publishes; unless set, 200 on `file://` and
//! 40 on a test server): after each commit every object it names is
//! there.
//!
//! Objects are made older than the grace period as in `gc_in_flight.rs`:
//! a grace of zero and a pause, so that the listing's whole-second times
//! fall before it. On `file://` an object can also be made older than
//! the publisher's reuse window (its modification time set back), so
//! that the publisher sends it again rather than reuse it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use common::{Backend, Server, small_tier};
use remote_cache::hooks::{Stage, on_stage};
use remote_cache::{GcOptions, LogState, OBJECTS, PublishReport, RemoteDir, StoreFiles, gc};
use remote_tier::RemoteTier;

/// Every object older than the listing's slack is past it.
const NO_GRACE: GcOptions = GcOptions {
    keep: Duration::ZERO,
    grace: Duration::ZERO,
};

/// Where a test's log lives: a local directory or a test server.
enum Bucket {
    File(tempfile::TempDir),
    Server(Server),
}

impl Bucket {
    /// A bucket on `backend`'s test server; `None` when it does not run
    /// (outside CI, said on stderr).
    fn on(backend: Backend) -> Option<Bucket> {
        Server::find(backend).map(Bucket::Server)
    }

    fn local() -> Bucket {
        Bucket::File(tempfile::tempdir().unwrap())
    }

    /// A fresh log's URL.
    fn url(&self, tag: &str) -> String {
        match self {
            Bucket::File(dir) => {
                let d = dir.path().join(tag);
                std::fs::create_dir_all(&d).unwrap();
                format!("file://{}", d.display())
            }
            Bucket::Server(server) => server.new_url(tag, "log"),
        }
    }

    fn tier(&self, url: &str, dir: &Path) -> RemoteTier {
        let options: Vec<(&str, String)> = match self {
            Bucket::File(_) => Vec::new(),
            Bucket::Server(server) => server.options(),
        };
        RemoteTier::open_with_options(url, options, small_tier(dir, 1 << 30)).unwrap()
    }

    /// The local file of object `name` of the log at `url` (`file://` only).
    fn object_file(&self, url: &str, name: &str) -> Option<PathBuf> {
        match self {
            Bucket::File(_) => Some(PathBuf::from(url.trim_start_matches("file://")).join(name)),
            Bucket::Server(_) => None,
        }
    }
}

fn open_dir(bucket: &Bucket, url: &str, root: &Path) -> RemoteDir {
    RemoteDir::open(
        bucket.tier(url, &root.join("tier")),
        &root.join("work"),
        StoreFiles::PLAIN,
    )
    .unwrap()
}

/// Distinct bytes for `seed`, `len` long.
fn bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn object_of(content: &[u8]) -> String {
    format!("{OBJECTS}/{}", blake3::hash(content).to_hex())
}

/// Writes `content` as `name` in `dir` under a new inode (a file replaced,
/// as stores replace theirs).
fn replace(dir: &Path, name: &str, content: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Every object the log's state names is in the store.
fn assert_every_object_there(tier: &RemoteTier) -> LogState {
    let state = LogState::read(tier).unwrap();
    for (path, pieces) in &state.files {
        for p in pieces {
            if let Err(e) = tier.head(&p.object()) {
                panic!("commit {} names {} for {path}: {e}", state.seq, p.object());
            }
        }
    }
    state
}

/// How the publisher finds the object gc is about to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Written recently (within the reuse window): reused as it is.
    Recent,
    /// Written before the reuse window: sent again.
    Old,
}

/// What the publish run inside the gc tells the test.
enum Event {
    /// The publish waits for the gc's sweep to end.
    Waiting,
    /// The publish ended.
    Published(remote_cache::Result<PublishReport>),
}

/// Runs `publisher`'s publish on a thread of its own at the first
/// `Deleting` stage of a gc of `url`, and holds the gc there until the
/// publish committed or waits for the gc. Returns the publish's events.
fn publish_at_the_first_delete(url: &str, publisher: RemoteDir) -> Receiver<Event> {
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let (to_gc, at_gc) = std::sync::mpsc::channel::<()>();
    let armed = AtomicBool::new(true);
    let publisher = Mutex::new(Some(publisher));
    let events: Mutex<Sender<Event>> = Mutex::new(tx);
    let at_gc = Mutex::new(at_gc);
    let to_gc = Mutex::new(to_gc);
    on_stage(url, move |stage| match stage {
        Stage::Deleting if armed.swap(false, Ordering::SeqCst) => {
            let publisher = publisher.lock().unwrap().take().unwrap();
            let events = events.lock().unwrap().clone();
            let to_gc = to_gc.lock().unwrap().clone();
            std::thread::spawn(move || {
                let published = publisher.publish();
                let _ = to_gc.send(());
                let _ = events.send(Event::Published(published));
            });
            let at_gc = at_gc.lock().unwrap();
            at_gc
                .recv_timeout(Duration::from_secs(120))
                .expect("the publish inside the gc committed or waited for it");
        }
        Stage::AwaitingSweep => {
            let _ = events.lock().unwrap().send(Event::Waiting);
            let _ = to_gc.lock().unwrap().send(());
        }
        _ => {}
    });
    rx
}

/// The publish's outcome from its `events`: whether it waited for a
/// sweep, and its report once it ended.
fn published(events: &Receiver<Event>) -> (bool, PublishReport) {
    let mut waited = false;
    loop {
        match events.recv_timeout(Duration::from_secs(120)).unwrap() {
            Event::Waiting => waited = true,
            Event::Published(p) => return (waited, p.unwrap()),
        }
    }
}

/// A publisher commits a file whose bytes an old, unreferenced object
/// holds, between gc's check of that object and its delete: the commit's
/// objects are all there afterwards, and a fresh reader reads every file.
fn publish_inside_the_delete(bucket: &Bucket, found: Found) {
    let url = bucket.url(&format!("resend-{found:?}").to_lowercase());
    let (w, p, g, r) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (x, y) = (bytes(1, 100 << 10), bytes(2, 90 << 10));
    let writer = open_dir(bucket, &url, w.path());
    replace(writer.dir(), "a", &x);
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    // `a` replaced: `x`'s object is referenced by no commit after 2.
    replace(writer.dir(), "a", &y);
    assert_eq!(writer.publish().unwrap().seq, Some(2));
    let garbage = object_of(&x);
    if found == Found::Old {
        let file = bucket
            .object_file(&url, &garbage)
            .expect("a file:// bucket");
        let old = SystemTime::now() - Duration::from_secs(2 * 3600);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    // Commit 2 older than the window (keep 0), `x` older than the grace.
    std::thread::sleep(Duration::from_millis(2500));

    let publisher = open_dir(bucket, &url, p.path());
    replace(publisher.dir(), "b", &x);
    let gc_tier = bucket.tier(&url, g.path());
    let events = publish_at_the_first_delete(gc_tier.url(), publisher);
    let report = gc(&gc_tier, NO_GRACE).unwrap();
    println!("{found:?}: gc with a publish inside its delete: {report:?}");
    let (waited, published) = published(&events);
    println!("{found:?}: the publish (waited for the sweep: {waited}): {published:?}");
    assert_eq!(published.seq, Some(3), "{published:?}");
    let state = assert_every_object_there(&gc_tier);
    assert_eq!(report.deleted_objects, 1, "{report:?}");
    // Sent again after the delete (reused or sent before it, it was lost).
    assert!(
        waited,
        "the publish looked for its object before the sweep ended"
    );
    assert_eq!(published.uploaded, 1, "{published:?}");
    assert_eq!(state.files["b"][0].object(), garbage);
    assert!(gc_tier.list("leases").unwrap().is_empty());
    assert!(gc_tier.list("sweeps").unwrap().is_empty());

    let reader = open_dir(bucket, &url, r.path());
    assert_eq!(std::fs::read(reader.dir().join("a")).unwrap(), y);
    assert_eq!(std::fs::read(reader.dir().join("b")).unwrap(), x);
}

/// A gc that pauses past [`SWEEP_FOR`](remote_cache::SWEEP_FOR) between
/// its check of an object and its delete (a slow store, a stopped
/// process) sends no delete under that sweep: it ends it and starts the
/// objects left over in a new sweep, reading the leases again, so a
/// publisher that took a lease on the object meanwhile keeps it. (Within
/// the sweep's life the publisher waits either way; past it, a delete
/// sent under the old sweep could land after the publisher judged the
/// sweep lapsed.) Takes `SWEEP_FOR` and a few seconds.
#[test]
fn a_gc_paused_past_its_sweep_starts_over_and_reads_the_leases_again() {
    let bucket = Bucket::local();
    let url = bucket.url("paused");
    let (w, p, g) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (x, y) = (bytes(7, 80 << 10), bytes(8, 70 << 10));
    let writer = open_dir(&bucket, &url, w.path());
    replace(writer.dir(), "a", &x);
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    replace(writer.dir(), "a", &y);
    assert_eq!(writer.publish().unwrap().seq, Some(2));
    std::thread::sleep(Duration::from_millis(2500));

    let publisher = open_dir(&bucket, &url, p.path());
    replace(publisher.dir(), "b", &x);
    let gc_tier = bucket.tier(&url, g.path());
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let armed = AtomicBool::new(true);
    let publisher = Mutex::new(Some(publisher));
    let events = Mutex::new(tx);
    on_stage(gc_tier.url(), move |stage| match stage {
        Stage::Deleting if armed.swap(false, Ordering::SeqCst) => {
            let publisher = publisher.lock().unwrap().take().unwrap();
            let events = events.lock().unwrap().clone();
            std::thread::spawn(move || {
                let _ = events.send(Event::Published(publisher.publish()));
            });
            // The pause: the sweep, written just before the check, is
            // past SWEEP_FOR when the gc goes on.
            std::thread::sleep(remote_cache::SWEEP_FOR + Duration::from_secs(1));
        }
        Stage::AwaitingSweep => {
            let _ = events.lock().unwrap().send(Event::Waiting);
        }
        _ => {}
    });
    let report = gc(&gc_tier, NO_GRACE).unwrap();
    println!("gc paused past its sweep: {report:?}");
    let (waited, published) = published(&rx);
    assert!(waited, "the publish looked for its object during the sweep");
    assert_eq!(report.restarted_sweeps, 1, "{report:?}");
    // The new sweep read the publisher's lease (or, had the publish
    // committed between the sweeps, its commit): the object stayed, reused.
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    assert_eq!(published.seq, Some(3), "{published:?}");
    assert_eq!(published.uploaded, 0, "{published:?}");
    let state = assert_every_object_there(&gc_tier);
    assert_eq!(state.files["b"][0].object(), object_of(&x));
    assert!(gc_tier.list("sweeps").unwrap().is_empty());
}

#[test]
fn a_publish_that_sends_again_an_object_gc_is_deleting_keeps_it() {
    publish_inside_the_delete(&Bucket::local(), Found::Old);
}

#[test]
fn a_publish_that_reuses_an_object_gc_is_deleting_keeps_it() {
    publish_inside_the_delete(&Bucket::local(), Found::Recent);
}

fn a_publish_that_reuses_an_object_gc_is_deleting_keeps_it_on(backend: Backend) {
    let Some(bucket) = Bucket::on(backend) else {
        return;
    };
    publish_inside_the_delete(&bucket, Found::Recent);
}

/// Publishes, each replacing every file with bytes of a small pool, so
/// that every round names objects an earlier one made garbage:
/// `CACHEX_GC_SOAK_ROUNDS`, else `default`.
fn soak_rounds(default: u64) -> u64 {
    match std::env::var("CACHEX_GC_SOAK_ROUNDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("CACHEX_GC_SOAK_ROUNDS={v}: not a count")),
        Err(_) => default,
    }
}

/// Files each round replaces, and the contents they are drawn from.
const FILES: usize = 4;
const POOL: u32 = 64;
/// The shortest round: a content drawn again comes back after 16 rounds
/// on average, and often after more than the second that makes it older
/// than a grace of zero.
const ROUND: Duration = Duration::from_millis(25);

/// A publisher that keeps naming the same few objects again, beside a gc
/// loop with no window and no grace: after each commit, every object it
/// names is in the store; at the end a fresh reader reads every file.
fn soak(bucket: &Bucket, rounds: u64) {
    let url = bucket.url("soak");
    let (w, g, r) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let writer = open_dir(bucket, &url, w.path());
    let check = writer.tier().clone();
    let gc_tier = bucket.tier(&url, g.path());
    let pool: Vec<Vec<u8>> = (0..POOL)
        .map(|i| bytes(100 + i, 4096 + i as usize))
        .collect();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut last = [0usize; FILES];
    let (mut uploaded, mut reused) = (0, 0);
    let gcs = std::thread::scope(|s| {
        let gcs = s.spawn(|| {
            let (mut runs, mut deleted) = (0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                deleted += gc(&gc_tier, NO_GRACE).unwrap().deleted_objects;
                runs += 1;
            }
            (runs, deleted)
        });
        let mut draw = 7u64;
        for round in 0..rounds {
            let round_started = Instant::now();
            for (f, chosen) in last.iter_mut().enumerate() {
                draw = draw.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let next = (draw >> 33) as usize % POOL as usize;
                // A file whose bytes stay the same publishes nothing.
                *chosen = if next == *chosen {
                    (next + 1) % pool.len()
                } else {
                    next
                };
                replace(writer.dir(), &format!("f{f}"), &pool[*chosen]);
            }
            let published = writer.publish().unwrap();
            assert_eq!(
                published.pieces, FILES as u64,
                "round {round}: {published:?}"
            );
            uploaded += published.uploaded;
            reused += published.pieces - published.uploaded;
            for (f, chosen) in last.iter().enumerate() {
                let object = object_of(&pool[*chosen]);
                if let Err(e) = check.head(&object) {
                    stop.store(true, Ordering::SeqCst);
                    panic!(
                        "round {round}: commit {:?} names {object} for f{f}: {e}",
                        published.seq
                    );
                }
            }
            std::thread::sleep(ROUND.saturating_sub(round_started.elapsed()));
        }
        stop.store(true, Ordering::SeqCst);
        gcs.join().unwrap()
    });
    println!(
        "{rounds} rounds in {:.1?}: {uploaded} pieces sent, {reused} reused; \
         {} gc runs deleted {} objects",
        started.elapsed(),
        gcs.0,
        gcs.1
    );
    assert!(
        gcs.0 > 0 && gcs.1 > 0,
        "the gc loop deleted garbage: {gcs:?}"
    );
    assert_every_object_there(&gc_tier);
    assert!(gc_tier.list("leases").unwrap().is_empty());
    assert!(gc_tier.list("sweeps").unwrap().is_empty());
    let reader = open_dir(bucket, &url, r.path());
    for (f, chosen) in last.iter().enumerate() {
        assert_eq!(
            std::fs::read(reader.dir().join(format!("f{f}"))).unwrap(),
            pool[*chosen],
            "f{f}"
        );
    }
}

#[test]
fn gc_beside_a_publisher_that_sends_the_same_objects_again() {
    soak(&Bucket::local(), soak_rounds(200));
}

fn gc_beside_a_publisher_that_sends_the_same_objects_again_on(backend: Backend) {
    let Some(bucket) = Bucket::on(backend) else {
        return;
    };
    soak(&bucket, soak_rounds(40));
}

test_support::on_backends!(
    [s3 = S3, azure = Azure]
    a_publish_that_reuses_an_object_gc_is_deleting_keeps_it_on,
    gc_beside_a_publisher_that_sends_the_same_objects_again_on,
);
