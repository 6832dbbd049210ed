//! Plan records: the upcoming uses of an object's blocks, as the readers
//! of a node registered them, so eviction can keep what is needed soonest
//! (Belady's rule) instead of what was used last.
//!
//! Each reader (a rank, a DataLoader worker) that knows its order of the
//! epoch registers it with [`RemoteFile::set_plan`](crate::RemoteFile::set_plan):
//! for every block it reads, the position (in its own batch clock) of its
//! first and last use this epoch and of its first use in the next one.
//! The reader then moves its progress forward with
//! [`PlanHandle::advance`] after each batch, and dropping the handle
//! removes the record. Eviction reads every live record ([`next_uses`]):
//! the node's next use of a block is the nearest over the records, each
//! at its own progress. A block no live record reads again is unplanned,
//! and is evicted by LRU as without plans.
//!
//! By job:
//! - [`record`]: a record's bytes (its encoder and its checked decoder);
//! - [`registry`]: the records' life on disk — registered, advanced,
//!   removed with their handle or, once their registrant is gone, by the
//!   next reader;
//! - [`next_uses`](mod@next_uses): the live records indexed by object and
//!   block, and the node's next use of each block.
//!
//! # On disk
//! ```text
//! <tier_dir>/plans/<host>-<pid>-<nanos>-<n>.plan   one registrant's record,
//!                     flocked (exclusive) by it for the record's life
//! <tier_dir>/plans/plan.<host>.<pid>.<n>.tmp        a record being written
//! ```

pub(crate) mod next_uses;
pub(crate) mod record;
pub(crate) mod registry;

pub(crate) use next_uses::next_uses;
pub use record::BlockUse;
pub use registry::PlanHandle;
