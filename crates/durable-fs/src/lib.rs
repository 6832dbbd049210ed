#![doc = include_str!("../README.md")]
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
    TMP_SUFFIX, host_name, host_pid_token, parse_host_pid_token, remove_dead_temp_files,
    remove_temp_files, temp_path, unique_temp_path,
};
pub use writeback::start_writeback;
