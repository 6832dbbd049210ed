//! How a publisher puts its pieces in the store (publish, push, staged
//! uploads alike): each piece's bytes are read from the open file and
//! hashed as they are sent, and stored only when they hash to the
//! object's name, so an object never holds bytes other than its name says
//! and a file changed after it was hashed is refused
//! ([`remote_tier::Error::SourceChanged`], naming it); an object already
//! in the store is reused only when the store wrote it recently
//! ([`REUSE_WITHIN`]); and before the commit each piece is checked to be
//! in the store, and sent again if it is not.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use remote_tier::RemoteTier;

use crate::commit::Piece;
use crate::{Error, Result};

/// A publisher reuses an object already in the store only when the store
/// wrote it this recently; an older one is uploaded again, which renews
/// it, so that a gc of an earlier version running meanwhile (with at
/// least its default grace period, [`crate::gc::DEFAULT_GRACE`]) never
/// takes it for garbage. A gc of this version never deletes an object a
/// publisher found under its lease, whatever its age (`gc.rs`).
pub const REUSE_WITHIN: Duration = Duration::from_secs(30 * 60);

/// Whether the store wrote an object at `when` recently enough to be
/// reused without uploading it again ([`REUSE_WITHIN`]). A time ahead of
/// this machine's clock counts as recent.
pub(crate) fn is_recent(when: SystemTime) -> bool {
    SystemTime::now()
        .duration_since(when)
        .map_or(true, |age| age < REUSE_WITHIN)
}

/// Uploads `piece` (bytes `offset..offset + size` of `file`, at `path`)
/// unless the store has its object, written recently; returns whether it
/// sent it.
pub(crate) fn put_piece(
    tier: &RemoteTier,
    piece: &Piece,
    file: &File,
    path: &Path,
) -> Result<bool> {
    let object = piece.object();
    match tier.head(&object) {
        Ok(info) if info.size == piece.size && is_recent(info.last_modified) => return Ok(false),
        Ok(_) | Err(remote_tier::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    send(tier, piece, file, path)?;
    Ok(true)
}

/// Makes sure `piece`'s object is in the store just before the commit
/// that names it: one gc took (or an upload that never landed) is sent
/// again. Returns whether it was.
pub(crate) fn ensure_present(
    tier: &RemoteTier,
    piece: &Piece,
    file: &File,
    path: &Path,
) -> Result<bool> {
    match tier.head(&piece.object()) {
        Ok(info) if info.size == piece.size => Ok(false),
        Ok(_) | Err(remote_tier::Error::NotFound { .. }) => {
            send(tier, piece, file, path)?;
            Ok(true)
        }
        Err(e) => Err(e.into()),
    }
}

/// Sends `piece`'s bytes, checked against its BLAKE3 as they are read.
fn send(tier: &RemoteTier, piece: &Piece, file: &File, path: &Path) -> Result<()> {
    let hash = blake3::Hash::from_hex(&piece.blake3).map_err(|e| Error::Corrupt {
        url: tier.url().to_string(),
        name: piece.path.clone(),
        problem: format!("`{}` is not a BLAKE3 hash: {e}", piece.blake3),
    })?;
    tier.put_file_checked(
        &piece.object(),
        file,
        path,
        (piece.offset, piece.size),
        hash.as_bytes(),
    )?;
    Ok(())
}
