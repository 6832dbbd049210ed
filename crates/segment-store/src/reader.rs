//! Segments on disk: memory-mapped on demand (within the store's bound
//! on mappings), made whole first where they are fetched on demand, and
//! decoded once per mapping (the decoding is in `decode.rs`).

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use arrow_buffer::Buffer;
use memmap2::Mmap;

use crate::decode::{Decoded, decode};
use crate::maps::{Maps, Slot};
use crate::options::{Keeper, WholeSegment};
use crate::record::Structure;
use crate::{Error, Result};

/// One immutable segment file, mapped into memory while a read needs it
/// (see `maps.rs`).
pub struct Segment {
    /// Segment id (from the file name).
    pub id: u32,
    /// Path of the file.
    pub path: PathBuf,
    len: u64,
    maps: Arc<SegmentMaps>,
    slot: Arc<Slot<Mapped>>,
}

/// The bounded set of a store's segment mappings, and how a segment is
/// made whole before it is mapped (see [`WholeSegment`]).
pub struct SegmentMaps {
    maps: Arc<Maps<Mapped>>,
    whole: Option<WholeSegment>,
}

impl SegmentMaps {
    /// A set of at most `cap` mappings; `whole` runs before each mapping.
    pub fn new(cap: usize, whole: Option<WholeSegment>) -> Arc<SegmentMaps> {
        Arc::new(SegmentMaps {
            maps: Maps::new(cap),
            whole,
        })
    }
}

/// A segment's mapping and what was decoded over it.
pub struct Mapped {
    buffer: Buffer,
    decoded: OnceLock<std::result::Result<Arc<Decoded>, String>>,
}

impl Segment {
    /// Notes the file's length, and maps it now if `maps` has room: a
    /// handle then keeps reading what it opened even after a compaction
    /// unlinks the file. Otherwise the first read maps it.
    pub fn open(path: &Path, id: u32, maps: &Arc<SegmentMaps>) -> Result<Segment> {
        let len = std::fs::metadata(path)
            .map_err(Error::io("open segment", path))?
            .len();
        let seg = Segment {
            id,
            path: path.to_path_buf(),
            len,
            maps: maps.clone(),
            slot: Slot::new(),
        };
        // A segment that may not be whole locally is mapped only when a
        // read needs it: making it whole may fetch all of it.
        if maps.whole.is_none() && maps.maps.has_room() {
            seg.mapped()?;
        }
        Ok(seg)
    }

    /// The mapping, made now if the segment has none.
    fn mapped(&self) -> Result<Arc<Mapped>> {
        self.maps.maps.get_or_map(&self.slot, || {
            let (file, keeper) = match &self.maps.whole {
                Some(whole) => whole
                    .call(&self.path, self.len)
                    .map_err(|source| Error::Fetch {
                        path: self.path.clone(),
                        source,
                    })?
                    .map_or((None, None), |(f, k)| (Some(f), k)),
                None => (None, None),
            };
            map_file(&self.path, self.len, file, keeper)
        })
    }

    /// [`crate::format::content_hash`] of the whole file (reads all of it).
    pub fn content_hash(&self) -> Result<u64> {
        Ok(crate::format::content_hash(
            self.mapped()?.buffer.as_slice(),
        ))
    }

    /// File length in bytes.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// The decoded segment (decoded on the first call over a mapping, then
    /// kept with it).
    pub fn decoded(&self, hint: Option<Structure>) -> Result<Arc<Decoded>> {
        let mapped = self.mapped()?;
        mapped
            .decoded
            .get_or_init(|| {
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| decode(&mapped.buffer, hint)));
                match r {
                    Ok(Ok(d)) => Ok(Arc::new(d)),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err("the Arrow decoder panicked on this file".to_owned()),
                }
            })
            .clone()
            .map_err(|detail| Error::corrupt(&self.path, detail))
    }
}

/// A segment's mapping and what keeps its file whole (see
/// [`WholeSegment::keeping`]): one owner, dropped with the last slice.
struct MappedFile {
    _mmap: Mmap,
    _keeper: Option<Keeper>,
}

/// Maps the segment at `path`, which was `len` bytes when it was opened
/// (from `file`, when given: the whole copy standing for it, kept whole
/// by `keeper` as long as the mapping lives).
fn map_file(path: &Path, len: u64, file: Option<File>, keeper: Option<Keeper>) -> Result<Mapped> {
    let file = match file {
        Some(f) => f,
        None => File::open(path).map_err(Error::io("open segment", path))?,
    };
    let now = file
        .metadata()
        .map_err(Error::io("stat segment", path))?
        .len();
    if now != len {
        return Err(Error::corrupt(
            path,
            format!("{now} bytes, {len} when the store opened it: segments never change"),
        ));
    }
    let buffer = if len == 0 {
        Buffer::from_vec(Vec::<u8>::new())
    } else {
        // SAFETY: segment files are immutable once renamed into place:
        // this crate never writes, truncates or reuses a segment name
        // after the rename (compaction writes new ids and unlinks old
        // files, which leaves existing maps valid). A foreign process
        // that truncates a segment under a reader is outside the
        // supported protocol, as with every mmap-based reader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(Error::io("mmap segment", path))?;
        let ptr = NonNull::new(mmap.as_ptr().cast_mut())
            .ok_or_else(|| Error::corrupt(path, "mmap returned a null pointer"))?;
        let n = mmap.len();
        // Large page-cache folios may then be mapped whole: far fewer
        // page faults for random reads in a fresh process (a hint).
        #[cfg(target_os = "linux")]
        let _ = mmap.advise(memmap2::Advice::HugePage);
        let owner = Arc::new(MappedFile {
            _mmap: mmap,
            _keeper: keeper,
        });
        // SAFETY: `ptr` and `n` describe the live mapping, and the Arc
        // handed to the buffer owns the `Mmap` (and the keeper that keeps
        // a copy standing for the file whole), so the memory stays mapped
        // (and unmodified, see above) while any slice exists — also after
        // the store's set of mappings let go of it.
        unsafe { Buffer::from_custom_allocation(ptr, n, owner) }
    };
    Ok(Mapped {
        buffer,
        decoded: OnceLock::new(),
    })
}
