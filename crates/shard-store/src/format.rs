//! The on-disk format, written down once: loadit 0.0.8's directory layout.
//!
//! ```text
//! root/
//!   metadata.json              {"max_shard_length": int, "length": int,
//!                               "length_final": bool, "compression": str|null,
//!                               "version": 4, "info": any JSON}
//!   completed                  empty flag: the length is final and every shard is present
//!   shards/<start>.<end>.shard.pickle[.zstd]
//!                              a pickled Python list; element k is item start+k
//!   locks/writer_lock.lock     the root-wide lock (flock; loadit's `filelock` takes the same)
//!   locks/shard-<start>.lock   held while shard <start> is generated (shard-store only)
//!   scratch/                   temporary files, renamed into shards/ when durable
//!   quarantine/                corrupt shards moved aside (shard-store only; loadit ignores it)
//! ```
//!
//! Rules (loadit's, which we keep so that both tools share one root):
//! - Shard starts are multiples of `max_shard_length`; a shard holds at most
//!   `max_shard_length` items, and a shorter one is the last (it fixes the
//!   length). Empty shards are never written.
//! - Several shard files with the same start: the one with the largest end wins.
//! - `length` is a lower bound until `length_final` is true.
//! - `metadata.json` holds exactly these six keys (loadit builds a
//!   `NamedTuple` from it and refuses any other key). `version` is 4.
//! - Compression is `null` or `"zstd"` (then the shard name ends in `.zstd`
//!   and the file is one zstd frame around the pickle).
//!
//! Pickles are decoded without running anything: before decoding, every
//! opcode is checked by [`check_pickle`], which refuses class instances,
//! persistent ids, extension codes and every global except the few builtins
//! that plain data uses (`set`, `frozenset`, `bytearray`, `list`, and
//! `_codecs.encode` for bytes in protocol 2).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The loadit metadata version this crate reads and writes.
pub const FORMAT_VERSION: u64 = 4;
/// The metadata file name.
pub const METADATA_FILE: &str = "metadata.json";
/// The flag file written when the length is final and every shard exists.
pub const COMPLETED_FILE: &str = "completed";
/// The shard directory.
pub const SHARDS_DIR: &str = "shards";
/// The lock directory.
pub const LOCKS_DIR: &str = "locks";
/// The scratch directory for files being written.
pub const SCRATCH_DIR: &str = "scratch";
/// Where corrupt shards are moved.
pub const QUARANTINE_DIR: &str = "quarantine";
/// The root-wide lock file (shared with loadit).
pub const WRITER_LOCK_FILE: &str = "writer_lock.lock";
/// The suffix of an uncompressed shard file.
pub const SHARD_SUFFIX: &str = "shard.pickle";
/// Items pickled to estimate the item size for a byte-sized shard target.
pub const SIZE_ESTIMATE_ITEMS: usize = 128;
/// Largest shard file read into memory (guards against absurd files).
pub const MAX_SHARD_FILE_BYTES: u64 = 1 << 34;

/// Shard compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Plain pickle.
    #[default]
    None,
    /// One zstd frame around the pickle (loadit/fsspec name `"zstd"`).
    Zstd,
}

impl Compression {
    /// The name stored in `metadata.json` (`None` for no compression).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Zstd => Some("zstd"),
        }
    }

    /// Parses a stored name.
    pub fn from_name(name: Option<&str>) -> Option<Compression> {
        match name {
            None => Some(Compression::None),
            Some("zstd") => Some(Compression::Zstd),
            Some(_) => None,
        }
    }

    /// The shard file suffix, e.g. `shard.pickle.zstd`.
    pub fn suffix(self) -> String {
        match self.name() {
            None => SHARD_SUFFIX.to_string(),
            Some(n) => format!("{SHARD_SUFFIX}.{n}"),
        }
    }
}

/// The content of `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Items per full shard.
    pub max_shard_length: u64,
    /// Items known to exist (final when `length_final`).
    pub length: u64,
    /// Whether `length` is the true length.
    pub length_final: bool,
    /// `null` or `"zstd"`.
    pub compression: Option<String>,
    /// Always [`FORMAT_VERSION`].
    pub version: u64,
    /// Free user JSON.
    #[serde(default)]
    pub info: serde_json::Value,
}

impl Metadata {
    /// Parses and validates `metadata.json` text read from `path`.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Metadata> {
        let bad = |reason: String| Error::BadMetadata {
            path: path.to_path_buf(),
            reason,
        };
        let m: Metadata = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        if m.version != FORMAT_VERSION {
            return Err(bad(format!(
                "version {} (this reader knows {FORMAT_VERSION})",
                m.version
            )));
        }
        if m.max_shard_length == 0 {
            return Err(bad("max_shard_length is 0".into()));
        }
        if Compression::from_name(m.compression.as_deref()).is_none() {
            return Err(bad(format!(
                "compression {:?} is not supported (only null or \"zstd\")",
                m.compression
            )));
        }
        Ok(m)
    }

    /// The compression, validated by [`Metadata::parse`].
    pub fn compression(&self) -> Compression {
        Compression::from_name(self.compression.as_deref()).unwrap_or_default()
    }

    /// The JSON text written to disk.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing this struct cannot fail: every field is plain JSON.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A parsed shard file name `<start>.<end>.<suffix>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardName {
    /// First item index.
    pub start: u64,
    /// One past the last item index.
    pub end: u64,
}

impl ShardName {
    /// The file name for `compression`.
    pub fn file_name(&self, compression: Compression) -> String {
        format!("{}.{}.{}", self.start, self.end, compression.suffix())
    }

    /// Number of items in the shard.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the shard is empty (never true for a parsed name).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Parses a file name; `None` when it is not a shard of `compression`.
    pub fn parse(name: &str, compression: Compression) -> Option<ShardName> {
        let rest = name.strip_suffix(&compression.suffix())?;
        let rest = rest.strip_suffix('.')?;
        let (start, end) = rest.split_once('.')?;
        let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(start) || !digits(end) {
            return None;
        }
        let start: u64 = start.parse().ok()?;
        let end: u64 = end.parse().ok()?;
        (start < end).then_some(ShardName { start, end })
    }
}

/// Encodes a shard: the pickled list, compressed when asked.
pub fn encode_shard<T: Serialize>(path: &Path, items: &[T], compression: Compression) -> Result<Vec<u8>> {
    let pickled = serde_pickle::to_vec(&items, serde_pickle::SerOptions::new()).map_err(|source| {
        Error::Encode {
            path: path.to_path_buf(),
            source,
        }
    })?;
    match compression {
        Compression::None => Ok(pickled),
        Compression::Zstd => zstd::bulk::compress(&pickled, 3)
            .map_err(|e| Error::io(path, "zstd compress", e)),
    }
}

/// Undoes the compression of a shard file's bytes.
pub fn decompress(path: &Path, bytes: Vec<u8>, compression: Compression) -> Result<Vec<u8>> {
    match compression {
        Compression::None => Ok(bytes),
        Compression::Zstd => {
            let mut out = Vec::new();
            // Streaming decode: the frame's declared size never drives an allocation.
            let mut dec = zstd::stream::read::Decoder::new(&bytes[..]).map_err(|e| Error::CorruptShard {
                path: path.to_path_buf(),
                reason: format!("zstd: {e}"),
            })?;
            std::io::copy(&mut dec, &mut out).map_err(|e| Error::CorruptShard {
                path: path.to_path_buf(),
                reason: format!("zstd: {e}"),
            })?;
            Ok(out)
        }
    }
}

/// Decodes the (decompressed) pickle of shard `name`, checking that it is
/// plain data and holds exactly `name.len()` items.
pub fn decode_shard<T: DeserializeOwned>(path: &Path, name: ShardName, pickle: &[u8]) -> Result<Vec<T>> {
    let count = check_pickle(path, pickle)?;
    if count != Some(name.len()) {
        return Err(Error::CorruptShard {
            path: path.to_path_buf(),
            reason: match count {
                Some(c) => format!("holds {c} items, its name says {}", name.len()),
                None => "the pickle is not a flat list of items".into(),
            },
        });
    }
    serde_pickle::from_slice(pickle, serde_pickle::DeOptions::new()).map_err(|source| match source {
        serde_pickle::Error::Io(_) | serde_pickle::Error::Eval(..) => Error::CorruptShard {
            path: path.to_path_buf(),
            reason: source.to_string(),
        },
        serde_pickle::Error::Syntax(_) => Error::ItemType {
            path: path.to_path_buf(),
            source,
        },
    })
}

// Pickle opcodes (CPython `pickletools`), by argument layout.
mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const APPEND: u8 = b'a';
    pub const APPENDS: u8 = b'e';
    pub const EMPTY_LIST: u8 = b']';
    pub const LIST: u8 = b'l';
    pub const GLOBAL: u8 = b'c';
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINUNICODE8: u8 = 0x8d;
    pub const UNICODE: u8 = b'V';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const GET: u8 = b'g';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const PUT: u8 = b'p';
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
}

/// Builtins that plain data pickles use and that decode without Python.
const ALLOWED_GLOBALS: &[(&str, &str)] = &[
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytearray"),
    ("builtins", "list"),
    ("__builtin__", "set"),
    ("__builtin__", "frozenset"),
    ("__builtin__", "bytearray"),
    ("__builtin__", "list"),
    ("_codecs", "encode"),
];

/// Walks every opcode of `data` without executing anything. Refuses
/// pickled Python objects (see the module docs) with
/// [`Error::UnsupportedPickle`] and truncated or malformed streams with
/// [`Error::CorruptShard`]. Returns the number of items of the top-level
/// list when the stream is a list built by `EMPTY_LIST`/`LIST` followed by
/// `APPEND(S)` at depth 0 (how Python and serde-pickle write lists), or
/// `None` for any other top-level shape.
pub fn check_pickle(path: &Path, data: &[u8]) -> Result<Option<u64>> {
    let corrupt = |reason: String| Error::CorruptShard {
        path: path.to_path_buf(),
        reason,
    };
    let unsupported = |offset: usize, what: String| Error::UnsupportedPickle {
        path: path.to_path_buf(),
        offset,
        what,
    };
    let mut pos = 0usize;
    // Depth in MARKs, items pushed at each mark depth (for top-level counting).
    let mut marks: Vec<u64> = Vec::new();
    let mut top_count: Option<u64> = None;
    let mut top_stack: u64 = 0; // values on the stack outside any MARK
    // The last two string values pushed, to name STACK_GLOBAL targets.
    let mut recent: [Option<String>; 2] = [None, None];
    let mut memo: Vec<Option<String>> = Vec::new();
    let mut memo_map: std::collections::HashMap<u64, Option<String>> = Default::default();
    let mut last_pushed_str: Option<String>;

    let take = |pos: &mut usize, n: usize| -> Result<&[u8]> {
        let end = pos.checked_add(n).filter(|&e| e <= data.len()).ok_or_else(|| {
            corrupt(format!("truncated pickle: {n} argument bytes wanted at byte {pos}"))
        })?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    };
    let le = |b: &[u8]| -> u64 { b.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64) };
    let line = |pos: &mut usize| -> Result<&[u8]> {
        let rest = &data[*pos..];
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| corrupt(format!("truncated pickle: unterminated line at byte {pos}")))?;
        *pos += nl + 1;
        Ok(&rest[..nl])
    };

    loop {
        let at = pos;
        let code = *data
            .get(pos)
            .ok_or_else(|| corrupt(format!("truncated pickle: no STOP opcode ({} bytes)", data.len())))?;
        pos += 1;
        last_pushed_str = None;
        // `pushes`: how many values the opcode leaves on the stack, net,
        // for the top-level count; lists are tracked separately.
        let mut pushes: i64 = 1;
        match code {
            op::STOP => {
                return Ok(if top_stack == 1 && marks.is_empty() { top_count } else { None });
            }
            op::PROTO => {
                let v = take(&mut pos, 1)?[0];
                if v > 5 {
                    return Err(corrupt(format!("pickle protocol {v} is not known")));
                }
                pushes = 0;
            }
            op::FRAME => {
                take(&mut pos, 8)?;
                pushes = 0;
            }
            op::MARK => {
                marks.push(0);
                pushes = 0;
            }
            op::EMPTY_LIST => {
                if marks.is_empty() && top_stack == 0 {
                    top_count = Some(0);
                }
            }
            op::LIST => {
                let n = marks.pop().ok_or_else(|| corrupt(format!("LIST without MARK at byte {at}")))?;
                if marks.is_empty() && top_stack == 0 {
                    top_count = Some(n);
                }
            }
            op::APPEND => {
                // pops one value into the list below it
                pushes = -1;
                if marks.is_empty() && top_stack == 2 {
                    top_count = top_count.map(|c| c + 1);
                }
            }
            op::APPENDS => {
                let n = marks.pop().ok_or_else(|| corrupt(format!("APPENDS without MARK at byte {at}")))?;
                pushes = 0;
                if marks.is_empty() && top_stack == 1 {
                    top_count = top_count.map(|c| c + n);
                }
            }
            // Pops to MARK, pushes one value.
            b'd' | b't' | 0x91 => {
                marks.pop().ok_or_else(|| corrupt(format!("opcode {code:#04x} without MARK at byte {at}")))?;
            }
            // Pops to MARK, pushes nothing (updates the container below).
            b'u' | 0x90 | b'1' => {
                marks.pop().ok_or_else(|| corrupt(format!("opcode {code:#04x} without MARK at byte {at}")))?;
                pushes = 0;
            }
            // No argument; stack effect approximated (only matters at top level).
            b'N' | 0x88 | 0x89 | b'}' | b')' | 0x8f | b'2' => {}
            b'0' => pushes = -1,
            b's' => pushes = -2,
            0x85 => pushes = 0,
            0x86 => pushes = -1,
            0x87 => pushes = -2,
            // Fixed-size arguments.
            b'K' => {
                take(&mut pos, 1)?;
            }
            b'M' => {
                take(&mut pos, 2)?;
            }
            b'J' => {
                take(&mut pos, 4)?;
            }
            b'G' => {
                take(&mut pos, 8)?;
            }
            // Length-prefixed payloads.
            0x8a | b'U' | b'C' => {
                let n = take(&mut pos, 1)?[0] as usize;
                take(&mut pos, n)?;
            }
            op::SHORT_BINUNICODE => {
                let n = take(&mut pos, 1)?[0] as usize;
                last_pushed_str = Some(String::from_utf8_lossy(take(&mut pos, n)?).into_owned());
            }
            0x8b | b'T' | b'B' => {
                let n = le(take(&mut pos, 4)?) as usize;
                take(&mut pos, n)?;
            }
            op::BINUNICODE => {
                let n = le(take(&mut pos, 4)?) as usize;
                last_pushed_str = Some(String::from_utf8_lossy(take(&mut pos, n)?).into_owned());
            }
            0x8e | 0x96 => {
                let n = usize::try_from(le(take(&mut pos, 8)?))
                    .map_err(|_| corrupt(format!("length overflows at byte {at}")))?;
                take(&mut pos, n)?;
            }
            op::BINUNICODE8 => {
                let n = usize::try_from(le(take(&mut pos, 8)?))
                    .map_err(|_| corrupt(format!("length overflows at byte {at}")))?;
                last_pushed_str = Some(String::from_utf8_lossy(take(&mut pos, n)?).into_owned());
            }
            // Newline-terminated text arguments.
            b'F' | b'I' | b'L' | b'S' => {
                line(&mut pos)?;
            }
            op::UNICODE => {
                last_pushed_str = Some(String::from_utf8_lossy(line(&mut pos)?).into_owned());
            }
            // Memo.
            op::MEMOIZE => {
                memo.push(recent[1].clone());
                pushes = 0;
            }
            op::BINPUT => {
                let k = take(&mut pos, 1)?[0] as u64;
                memo_map.insert(k, recent[1].clone());
                pushes = 0;
            }
            op::LONG_BINPUT => {
                let k = le(take(&mut pos, 4)?);
                memo_map.insert(k, recent[1].clone());
                pushes = 0;
            }
            op::PUT => {
                let k = parse_decimal(line(&mut pos)?);
                if let Some(k) = k {
                    memo_map.insert(k, recent[1].clone());
                }
                pushes = 0;
            }
            op::BINGET | op::LONG_BINGET | op::GET => {
                let k = match code {
                    op::BINGET => Some(take(&mut pos, 1)?[0] as u64),
                    op::LONG_BINGET => Some(le(take(&mut pos, 4)?)),
                    _ => parse_decimal(line(&mut pos)?),
                };
                last_pushed_str = k.and_then(|k| {
                    memo_map
                        .get(&k)
                        .cloned()
                        .or_else(|| usize::try_from(k).ok().and_then(|i| memo.get(i).cloned()))
                        .flatten()
                });
            }
            // Globals: only the allow-listed builtins.
            op::GLOBAL => {
                let module = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                let name = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                if !ALLOWED_GLOBALS.iter().any(|(m, n)| *m == module && *n == name) {
                    return Err(unsupported(at, format!("global {module}.{name} (a Python object)")));
                }
            }
            op::STACK_GLOBAL => {
                let (module, name) = (recent[0].clone(), recent[1].clone());
                let allowed = matches!((&module, &name), (Some(m), Some(n))
                    if ALLOWED_GLOBALS.iter().any(|(am, an)| am == m && an == n));
                if !allowed {
                    return Err(unsupported(
                        at,
                        format!(
                            "global {}.{} (a Python object)",
                            module.as_deref().unwrap_or("?"),
                            name.as_deref().unwrap_or("?")
                        ),
                    ));
                }
                pushes = -1;
            }
            b'R' => pushes = -1,
            b'i' => {
                let m = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                let n = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                return Err(unsupported(at, format!("instance of {m}.{n} (a Python object)")));
            }
            b'o' | 0x81 | 0x92 | b'b' => {
                return Err(unsupported(at, "a Python class instance".into()));
            }
            b'P' | b'Q' => return Err(unsupported(at, "a persistent id".into())),
            0x82..=0x84 => return Err(unsupported(at, "an extension-registry code".into())),
            0x97 | 0x98 => return Err(unsupported(at, "an out-of-band buffer".into())),
            other => return Err(corrupt(format!("unknown pickle opcode {other:#04x} at byte {at}"))),
        }
        if pushes != 0 || last_pushed_str.is_some() {
            recent[0] = recent[1].take();
            recent[1] = last_pushed_str.take();
        }
        if let Some(depth) = marks.last_mut() {
            *depth = (*depth as i64 + pushes).max(0) as u64;
        } else {
            top_stack = (top_stack as i64 + pushes).max(0) as u64;
        }
    }
}

fn parse_decimal(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.trim().parse().ok()
}
