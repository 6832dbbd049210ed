//! W2 of `BENCHMARKS.md`: filled in by issue 4 (segment-store).

use crate::{Ctx, RunError};

/// Runs W2.
pub fn run(_ctx: &Ctx) -> Result<(), RunError> {
    Err(RunError::store(
        "w2",
        "W2 is not built yet (issue 4 (segment-store))",
    ))
}
