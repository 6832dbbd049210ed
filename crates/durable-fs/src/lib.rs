//! `durable-fs`: the crash-safe file-system steps every cachex store takes,
//! written once.
//!
//! A store commits a file in four steps: write it under a temporary name,
//! fsync it, rename it over its final name, fsync the directory so the
//! rename itself survives a power cut. A crash at any point leaves the old
//! file or the new one, never a mix, and at most a stale temporary file
//! that the next writer removes. This crate holds those steps as
//! primitives — not one slow do-everything call — so that each store keeps
//! its own hot path (chunked segment writes, early write-back of pages,
//! one directory fsync after a group of renames) and only the durable
//! steps are shared:
//!
//! - temporary names: [`temp_path`] (`<name>.tmp`, one writer at a time)
//!   and [`unique_temp_path`] (`<stem>.<host>.<pid>.<n>.tmp`, many writers
//!   in one scratch directory, on one machine or several sharing a file
//!   system); [`remove_temp_files`] and [`remove_dead_temp_files`] (only
//!   this host's files of dead processes) clean up after a crash;
//! - [`create_temp`], [`write_synced`], [`commit_temp`], [`rename`],
//!   [`rename_and_sync`], [`write_atomic`]: the commit path, in pieces and
//!   whole; [`write_atomic_shared`] and [`write_new_atomic`] (create
//!   unless it exists) for a directory many writers share;
//! - [`sync_dir`], [`sync_parent_dir`], [`remove_and_sync`]: directory
//!   fsyncs (a bare file name's directory is `.`);
//! - [`FileLock`]: the advisory `flock` (via `fs2`) of one writer —
//!   exclusive or shared, blocking or refused at once with
//!   [`Error::Locked`] — unlocked explicitly on drop;
//! - [`PerProcess`]: process-global state (a lock table, a runtime) that
//!   a forked child builds anew instead of inheriting it mid-use — a
//!   mutex another thread held at `fork()` is never taken in the child,
//!   and a [`FileLock`] a child inherited is only closed there, never
//!   unlocked (which would let go of the parent's);
//! - [`Pool`]: the one worker pool of the workspace — scoped threads over
//!   a slice, at most a given number at once, answers in the items' order,
//!   no item started after one fails, a worker's panic resumed on the
//!   caller;
//! - [`start_writeback`]: early write-back of a written range (advice;
//!   the commit's fsync stays the durability point);
//! - [`replace_unsynced`] and [`boot_id`]: for what may be lost in a power
//!   cut but must never be read wrong — a record of unsynced bytes, valid
//!   only in the boot that wrote them;
//! - [`read_capped`]: reads a metadata file that the format keeps small,
//!   refusing a corrupt or hostile one before a huge allocation.
//!
//! Every call returns this crate's [`Error`], which names the path and the
//! operation; stores map it into their own error enums.
//!
//! # On disk
//! ```text
//! <dir>/
//!   <name>              the committed file (old or new, never a mix)
//!   <name>.tmp          a write in flight; removed by the next writer
//!   <name>.lock         (or any lock file) flock of the writer; empty
//! <scratch>/
//!   <stem>.<host>.<pid>.<n>.tmp  a write in flight of process <pid> on <host>; removed
//!                                by <host> once <pid> is gone
//! ```
//!
//! # Example
//! ```
//! use durable_fs::{FileLock, read_capped, write_atomic};
//!
//! let dir = tempfile::tempdir()?;
//! let lock = FileLock::writer(&dir.path().join("writer.lock"))?;
//! // A second writer is refused at once.
//! assert!(FileLock::writer(&dir.path().join("writer.lock")).is_err());
//!
//! let meta = dir.path().join("metadata.json");
//! write_atomic(&meta, br#"{"rows": 3}"#)?;
//! write_atomic(&meta, br#"{"rows": 4}"#)?;
//! assert_eq!(read_capped(&meta, 1 << 20)?, br#"{"rows": 4}"#);
//! drop(lock);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod atomic;
mod error;
mod lock;
mod per_process;
mod pool;
mod temp;
mod writeback;

pub use atomic::{
    boot_id, commit_temp, create_temp, parent_dir, read_capped, remove_and_sync, rename,
    rename_and_sync, replace_unsynced, sync_dir, sync_parent_dir, write_atomic,
    write_atomic_shared, write_new_atomic, write_synced,
};
pub use error::{BoxError, Error, Result};
pub use lock::FileLock;
pub use per_process::PerProcess;
pub use pool::Pool;
pub use temp::{
    TMP_SUFFIX, host_name, host_pid_token, remove_dead_temp_files, remove_temp_files, temp_path,
    unique_temp_path,
};
pub use writeback::start_writeback;
