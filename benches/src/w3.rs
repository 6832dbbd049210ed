//! W3 of `BENCHMARKS.md`: filled in by issue 5 (shard-store).

use crate::{Ctx, RunError};

/// Runs W3.
pub fn run(_ctx: &Ctx) -> Result<(), RunError> {
    Err(RunError::store(
        "w3",
        "W3 is not built yet (issue 5 (shard-store))",
    ))
}
