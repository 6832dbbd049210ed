//! Records as `cachex get` prints them without `--json`: the JSON of
//! [`cache_facade::json`] as a table.

use cache_facade::json::BYTES_HEX;
use serde_json::{Map, Value};

/// Longest cell `cachex get` prints before cutting it short.
const MAX_CELL: usize = 96;

/// A value as `cachex get` prints it without `--json`: one `field: value`
/// line per field of an object (nested objects indented), tensors as
/// `dtype [shape] [first values ...]`, bytes as `N bytes: hex...`, and
/// long values cut at about 96 characters.
pub fn value_table(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !is_leaf(v) => lines(m, 0, &mut out),
        other => out.push_str(&cell(other)),
    }
    out
}

fn lines(m: &Map<String, Value>, depth: usize, out: &mut String) {
    let width = m.keys().map(String::len).max().unwrap_or(0);
    for (k, v) in m {
        if !out.is_empty() {
            out.push('\n');
        }
        let pad = "  ".repeat(depth);
        match v {
            Value::Object(inner) if !is_leaf(v) => {
                out.push_str(&format!("{pad}{k}:"));
                lines(inner, depth + 1, out);
            }
            other => out.push_str(&format!("{pad}{k:<width$}  {}", cell(other))),
        }
    }
}

/// Tensors and bytes print as one cell, not as nested fields.
fn is_leaf(v: &Value) -> bool {
    v.get(BYTES_HEX).is_some() || (v.get("dtype").is_some() && v.get("data").is_some())
}

fn cell(v: &Value) -> String {
    let text = if let Some(Value::String(hex)) = v.get(BYTES_HEX) {
        format!("{} bytes: {hex}", hex.len() / 2)
    } else if let (Some(dtype), Some(Value::Array(data))) = (v.get("dtype"), v.get("data")) {
        let dtype = dtype.as_str().unwrap_or("?");
        let shape = v.get("shape").map_or(String::new(), Value::to_string);
        let head: Vec<String> = data.iter().take(8).map(Value::to_string).collect();
        let more = if data.len() > 8 { ", ..." } else { "" };
        format!("{dtype} {shape} [{}{more}]", head.join(", "))
    } else {
        match v {
            Value::String(s) => s.clone(),
            Value::Null => "null".into(),
            other => other.to_string(),
        }
    };
    if text.chars().count() > MAX_CELL {
        let cut: String = text.chars().take(MAX_CELL).collect();
        format!("{cut}...")
    } else {
        text
    }
}
