//! W5 of `BENCHMARKS.md`: filled in by issue 6 (page-alloc).

use crate::{Ctx, RunError};

/// Runs W5.
pub fn run(_ctx: &Ctx) -> Result<(), RunError> {
    Err(RunError::store(
        "w5",
        "W5 is not built yet (issue 6 (page-alloc))",
    ))
}
