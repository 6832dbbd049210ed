//! The pickle pre-checker: every opcode of a shard's pickle is walked
//! before anything decodes it, so that a shard holding Python objects, a
//! truncated or malformed stream, or one whose memo references would
//! explode is refused without running or allocating anything on its behalf.
//! [`plan_pickle`] also tells the streaming decoder (`stream.rs`) whether
//! it may take the stream, and how each MARK closes.

use std::path::Path;

use crate::error::{Error, Result};

/// Deepest nesting accepted (the decoder recurses once per level).
pub const MAX_PICKLE_DEPTH: u32 = 128;

/// Largest decoded size accepted, in value nodes (payload bytes count one
/// node per 16 bytes), as a multiple of the pickle's own length plus a
/// constant: memo references may repeat a value, but not explode it.
pub const MAX_EXPANSION: u64 = 64;

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

/// What the checker knows of one value on the pickle stack.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Nesting depth (0 for scalars).
    depth: u32,
    /// Decoded size in nodes (see [`MAX_EXPANSION`]).
    size: u64,
    /// Direct items, for lists.
    items: u64,
    /// Whether the value is a list.
    list: bool,
    /// Where a string's text lies in the stream (to name `STACK_GLOBAL` targets).
    text: Option<(usize, usize)>,
}

impl Slot {
    fn scalar(payload: usize) -> Slot {
        Slot {
            depth: 0,
            size: 1 + payload as u64 / 16,
            items: 0,
            list: false,
            text: None,
        }
    }

    fn text(start: usize, len: usize) -> Slot {
        let mut slot = Slot::scalar(len);
        slot.text = Some((start, start + len));
        slot
    }

    fn container(list: bool, parts: &[Slot]) -> Slot {
        let mut slot = Slot {
            depth: 1,
            size: 1,
            items: 0,
            list,
            text: None,
        };
        slot.absorb_all(parts);
        slot
    }

    fn absorb_all(&mut self, parts: &[Slot]) {
        for p in parts {
            self.depth = self.depth.max(p.depth.saturating_add(1));
            self.size = self.size.saturating_add(p.size);
        }
        self.items += parts.len() as u64;
    }
}

/// What [`plan_pickle`] learnt about a stream.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Items of the top-level list (`None`: the value is not a list).
    pub(crate) count: Option<u64>,
    /// Whether the stream only uses opcodes the streaming decoder handles
    /// (no memo reads, no postfix tuples, no globals, no protocol-0 containers).
    pub(crate) streamable: bool,
    /// For the k-th MARK of the stream (in stream order), the opcode that closes it.
    pub(crate) closers: Vec<u8>,
}

/// Walks every opcode of `data` without executing anything, simulating the
/// pickle stack with each value's depth and decoded size. Refuses pickled
/// Python objects (see [`format`](crate::format)) with
/// [`Error::UnsupportedPickle`], and truncated, malformed, too deeply nested
/// ([`MAX_PICKLE_DEPTH`]) or exploding ([`MAX_EXPANSION`]) streams with
/// [`Error::CorruptShard`]. Returns the number of items when the pickled
/// value is a list, `None` for any other value.
pub fn check_pickle(path: &Path, data: &[u8]) -> Result<Option<u64>> {
    plan_pickle(path, data).map(|p| p.count)
}

/// [`check_pickle`], also returning what the streaming decoder needs.
pub(crate) fn plan_pickle(path: &Path, data: &[u8]) -> Result<Plan> {
    let corrupt = |reason: String| Error::CorruptShard {
        path: path.to_path_buf(),
        reason,
    };
    let unsupported = |offset: usize, what: String| Error::UnsupportedPickle {
        path: path.to_path_buf(),
        offset,
        what,
    };
    let max_size = (data.len() as u64)
        .saturating_mul(MAX_EXPANSION)
        .saturating_add(1 << 16);
    let mut pos = 0usize;
    let mut stack: Vec<Slot> = Vec::new();
    // (stack height at the MARK, ordinal of the MARK in the stream)
    let mut marks: Vec<(usize, usize)> = Vec::new();
    let mut closers: Vec<u8> = Vec::new();
    let mut streamable = true;
    let mut memo: std::collections::HashMap<u64, Slot> = Default::default();

    let take = |pos: &mut usize, n: usize| -> Result<(usize, usize)> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "truncated pickle: {n} argument bytes wanted at byte {pos}"
                ))
            })?;
        let span = (*pos, end);
        *pos = end;
        Ok(span)
    };
    let le = |(a, b): (usize, usize)| -> u64 {
        data[a..b]
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | x as u64)
    };
    let line = |pos: &mut usize| -> Result<&[u8]> {
        let rest = &data[*pos..];
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| corrupt(format!("truncated pickle: unterminated line at byte {pos}")))?;
        *pos += nl + 1;
        Ok(&rest[..nl])
    };
    let len_arg = |pos: &mut usize, width: usize, at: usize| -> Result<usize> {
        let n = le(take(pos, width)?);
        usize::try_from(n).map_err(|_| corrupt(format!("length {n} overflows at byte {at}")))
    };
    let name_of = |t: Option<(usize, usize)>| -> Option<String> {
        t.filter(|(a, b)| b - a <= 256)
            .map(|(a, b)| String::from_utf8_lossy(&data[a..b]).into_owned())
    };

    loop {
        let at = pos;
        let code = *data.get(pos).ok_or_else(|| {
            corrupt(format!(
                "truncated pickle: no STOP opcode in {} bytes",
                data.len()
            ))
        })?;
        pos += 1;
        let underflow = || corrupt(format!("stack underflow at byte {at} (opcode {code:#04x})"));
        // Closes the last MARK: returns the stack height it was set at.
        let mut pop_mark = |stack: &Vec<Slot>, marks: &mut Vec<(usize, usize)>| -> Result<usize> {
            let (m, ordinal) = marks
                .pop()
                .ok_or_else(|| corrupt(format!("no MARK for opcode {code:#04x} at byte {at}")))?;
            if m > stack.len() {
                return Err(underflow());
            }
            closers[ordinal] = code;
            Ok(m)
        };
        let mut pushed: Option<Slot> = None;
        match code {
            b'.' => {
                if stack.len() != 1 || !marks.is_empty() {
                    return Err(corrupt(format!(
                        "STOP at byte {at} with {} values on the stack",
                        stack.len()
                    )));
                }
                let top = &stack[0];
                return Ok(Plan {
                    count: top.list.then_some(top.items),
                    streamable,
                    closers,
                });
            }
            0x80 => {
                let v = data[take(&mut pos, 1)?.0];
                if v > 5 {
                    return Err(corrupt(format!("pickle protocol {v} is not known")));
                }
            }
            0x95 => {
                take(&mut pos, 8)?;
            }
            b'(' => {
                marks.push((stack.len(), closers.len()));
                closers.push(0);
            }
            b'0' => {
                streamable = false;
                if marks.last().map(|m| m.0) == Some(stack.len()) {
                    marks.pop();
                } else {
                    stack.pop().ok_or_else(underflow)?;
                }
            }
            b'1' => {
                streamable = false;
                let m = pop_mark(&stack, &mut marks)?;
                stack.truncate(m);
            }
            b'2' => {
                streamable = false;
                pushed = Some(*stack.last().ok_or_else(underflow)?);
            }
            // Scalars without payload.
            b'N' | 0x88 | 0x89 => pushed = Some(Slot::scalar(0)),
            b'K' => {
                take(&mut pos, 1)?;
                pushed = Some(Slot::scalar(0));
            }
            b'M' => {
                take(&mut pos, 2)?;
                pushed = Some(Slot::scalar(0));
            }
            b'J' => {
                take(&mut pos, 4)?;
                pushed = Some(Slot::scalar(0));
            }
            b'G' => {
                take(&mut pos, 8)?;
                pushed = Some(Slot::scalar(0));
            }
            b'F' | b'I' | b'L' | b'S' => {
                streamable = false;
                pushed = Some(Slot::scalar(line(&mut pos)?.len()));
            }
            b'V' => {
                streamable = false;
                let start = pos;
                let l = line(&mut pos)?.len();
                pushed = Some(Slot::text(start, l));
            }
            // Length-prefixed payloads.
            0x8a | b'U' | b'C' => {
                streamable &= code != b'U';
                let n = len_arg(&mut pos, 1, at)?;
                take(&mut pos, n)?;
                pushed = Some(Slot::scalar(n));
            }
            0x8b | b'T' | b'B' => {
                streamable &= code == b'B';
                let n = len_arg(&mut pos, 4, at)?;
                take(&mut pos, n)?;
                pushed = Some(Slot::scalar(n));
            }
            0x8e | 0x96 => {
                streamable &= code == 0x8e;
                let n = len_arg(&mut pos, 8, at)?;
                take(&mut pos, n)?;
                pushed = Some(Slot::scalar(n));
            }
            0x8c | b'X' | 0x8d => {
                let width = match code {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                };
                let n = len_arg(&mut pos, width, at)?;
                let (start, _) = take(&mut pos, n)?;
                pushed = Some(Slot::text(start, n));
            }
            // Containers.
            b']' => pushed = Some(Slot::container(true, &[])),
            b'}' | b')' | 0x8f => pushed = Some(Slot::container(false, &[])),
            b'l' | b'd' | b't' | 0x91 => {
                streamable &= matches!(code, b't' | 0x91);
                let m = pop_mark(&stack, &mut marks)?;
                let slot = Slot::container(code == b'l', &stack[m..]);
                stack.truncate(m);
                pushed = Some(slot);
            }
            0x85..=0x87 => {
                streamable = false;
                let n = (code - 0x84) as usize;
                let from = stack.len().checked_sub(n).ok_or_else(underflow)?;
                if marks.last().is_some_and(|&(m, _)| m > from) {
                    return Err(underflow());
                }
                let slot = Slot::container(false, &stack[from..]);
                stack.truncate(from);
                pushed = Some(slot);
            }
            b'a' | b's' => {
                streamable = false;
                let n = if code == b'a' { 1 } else { 2 };
                let from = stack.len().checked_sub(n).ok_or_else(underflow)?;
                if from == 0 || marks.last().is_some_and(|&(m, _)| m > from - 1) {
                    return Err(underflow());
                }
                let (below, parts) = stack.split_at_mut(from);
                let target = &mut below[from - 1];
                target.absorb_all(parts);
                if code == b's' {
                    target.items -= 1;
                }
                let t = *target;
                stack.truncate(from);
                check_slot(&t, max_size, &corrupt, at)?;
            }
            b'e' | b'u' | 0x90 => {
                let m = pop_mark(&stack, &mut marks)?;
                if m == 0 {
                    return Err(underflow());
                }
                let (below, parts) = stack.split_at_mut(m);
                let target = &mut below[m - 1];
                target.absorb_all(parts);
                if code == b'u' {
                    target.items -= parts.len() as u64 / 2;
                }
                let t = *target;
                stack.truncate(m);
                check_slot(&t, max_size, &corrupt, at)?;
            }
            // Memo.
            0x94 => {
                let top = *stack.last().ok_or_else(underflow)?;
                memo.insert(memo.len() as u64, top);
            }
            b'q' | b'r' | b'p' => {
                let k = match code {
                    b'q' => le(take(&mut pos, 1)?),
                    b'r' => le(take(&mut pos, 4)?),
                    _ => {
                        streamable = false;
                        parse_decimal(line(&mut pos)?)
                            .ok_or_else(|| corrupt(format!("bad PUT at byte {at}")))?
                    }
                };
                let top = *stack.last().ok_or_else(underflow)?;
                memo.insert(k, top);
            }
            b'h' | b'j' | b'g' => {
                streamable = false;
                let k = match code {
                    b'h' => le(take(&mut pos, 1)?),
                    b'j' => le(take(&mut pos, 4)?),
                    _ => parse_decimal(line(&mut pos)?)
                        .ok_or_else(|| corrupt(format!("bad GET at byte {at}")))?,
                };
                let v = memo.get(&k).ok_or_else(|| {
                    corrupt(format!("memo {k} read before it was written at byte {at}"))
                })?;
                pushed = Some(*v);
            }
            // Globals: only the allow-listed builtins.
            b'c' => {
                streamable = false;
                let module = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                let name = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                if !ALLOWED_GLOBALS
                    .iter()
                    .any(|(m, n)| *m == module && *n == name)
                {
                    return Err(unsupported(
                        at,
                        format!("global {module}.{name} (a Python object)"),
                    ));
                }
                pushed = Some(Slot::scalar(0));
            }
            0x93 => {
                streamable = false;
                let name = name_of(stack.pop().ok_or_else(underflow)?.text);
                let module = name_of(stack.pop().ok_or_else(underflow)?.text);
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
                pushed = Some(Slot::scalar(0));
            }
            b'R' => {
                streamable = false;
                let args = stack.pop().ok_or_else(underflow)?;
                stack.pop().ok_or_else(underflow)?;
                let mut v = Slot::container(false, &[args]);
                v.items = 0;
                pushed = Some(v);
            }
            b'i' => {
                let m = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                let n = String::from_utf8_lossy(line(&mut pos)?).into_owned();
                return Err(unsupported(
                    at,
                    format!("instance of {m}.{n} (a Python object)"),
                ));
            }
            b'o' | 0x81 | 0x92 | b'b' => {
                return Err(unsupported(at, "a Python class instance".into()));
            }
            b'P' | b'Q' => return Err(unsupported(at, "a persistent id".into())),
            0x82..=0x84 => return Err(unsupported(at, "an extension-registry code".into())),
            0x97 | 0x98 => return Err(unsupported(at, "an out-of-band buffer".into())),
            other => {
                return Err(corrupt(format!(
                    "unknown pickle opcode {other:#04x} at byte {at}"
                )));
            }
        }
        if let Some(slot) = pushed {
            check_slot(&slot, max_size, &corrupt, at)?;
            stack.push(slot);
        }
    }
}

fn check_slot(
    slot: &Slot,
    max_size: u64,
    corrupt: &dyn Fn(String) -> Error,
    at: usize,
) -> Result<()> {
    if slot.depth > MAX_PICKLE_DEPTH {
        return Err(corrupt(format!(
            "nesting deeper than {MAX_PICKLE_DEPTH} at byte {at}"
        )));
    }
    if slot.size > max_size {
        return Err(corrupt(format!(
            "a value decodes to more than {max_size} nodes at byte {at} (memo references explode)"
        )));
    }
    Ok(())
}

fn parse_decimal(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.trim().parse().ok()
}
