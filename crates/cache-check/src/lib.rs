#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

/// What kind of [`Problem`] was found. Shared by every store, so a tool
/// can act on the kind (e.g. ignore [`ProblemKind::Interrupted`]) without
/// reading the detail text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// A file the cache needs (or its index lists) is absent.
    Missing,
    /// A file is shorter than its header, index or manifest says.
    Truncated,
    /// A file's bytes differ from the checksum recorded for them.
    ChecksumMismatch,
    /// A file does not parse, or breaks a rule of its format (a bad
    /// offset, a wrong count, a value of the wrong type, ...).
    Structure,
    /// A file is out of date: older than the index that should list it,
    /// or built from other sources.
    Stale,
    /// A file carries a format version this build does not read.
    ForeignVersion,
    /// Data the index does not list yet (picked up on the next open).
    Unindexed,
    /// A leftover of an interrupted write: a temporary file or a torn
    /// tail, dropped on the next open and ignored by readers.
    Interrupted,
    /// The operating system refused to read a file.
    Io,
}

impl ProblemKind {
    /// The kind's name in messages and JSON (`checksum-mismatch`).
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Missing => "missing",
            ProblemKind::Truncated => "truncated",
            ProblemKind::ChecksumMismatch => "checksum-mismatch",
            ProblemKind::Structure => "structure",
            ProblemKind::Stale => "stale",
            ProblemKind::ForeignVersion => "foreign-version",
            ProblemKind::Unindexed => "unindexed",
            ProblemKind::Interrupted => "interrupted",
            ProblemKind::Io => "io",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Something wrong with one file of a cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Problem {
    /// The file concerned (the cache directory when no one file is).
    pub path: PathBuf,
    /// What kind of problem.
    pub kind: ProblemKind,
    /// What is wrong (and what was done about it), without the path.
    pub detail: String,
}

impl Problem {
    /// A problem with `path`.
    pub fn new(path: impl Into<PathBuf>, kind: ProblemKind, detail: impl Into<String>) -> Problem {
        Problem {
            path: path.into(),
            kind,
            detail: detail.into(),
        }
    }

    /// A problem from an error whose `Display` starts with `"<path>: "`:
    /// the prefix is dropped from the detail, so the path is printed once.
    pub fn from_error(
        path: impl Into<PathBuf>,
        kind: ProblemKind,
        error: &dyn fmt::Display,
    ) -> Problem {
        let path = path.into();
        let text = error.to_string();
        let prefix = format!("{}: ", path.display());
        let detail = text.strip_prefix(&prefix).unwrap_or(&text).to_owned();
        Problem { path, kind, detail }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.detail)
    }
}

/// A table of a [`Summary`]: named columns, one JSON value per cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The table's name (a JSON key).
    pub name: String,
    /// Column names.
    pub columns: Vec<String>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    /// The rows as JSON objects `{column: value}`.
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.rows
                .iter()
                .map(|row| {
                    Value::Object(
                        self.columns
                            .iter()
                            .cloned()
                            .zip(row.iter().cloned())
                            .collect(),
                    )
                })
                .collect(),
        )
    }
}

/// What a store's `inspect` (or a tool's `stats`) says about a cache:
/// its kind and path, ordered facts, and tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The kind of cache (`segment-store`, `beton`, ...).
    pub kind: String,
    /// The cache directory or file.
    pub path: PathBuf,
    /// Key/value facts, in the order they print.
    pub facts: Vec<(String, Value)>,
    /// Per-file or per-field tables, in the order they print.
    pub tables: Vec<Table>,
}

impl Summary {
    /// An empty summary of the cache of `kind` at `path`.
    pub fn new(kind: impl Into<String>, path: impl AsRef<Path>) -> Summary {
        Summary {
            kind: kind.into(),
            path: path.as_ref().to_path_buf(),
            facts: Vec::new(),
            tables: Vec::new(),
        }
    }

    /// Adds a fact (replacing one of the same key, in place).
    pub fn fact(mut self, key: impl Into<String>, value: impl Into<Value>) -> Summary {
        self.push_fact(key, value);
        self
    }

    /// Adds a fact in place (replacing one of the same key).
    pub fn push_fact(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.facts.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.facts.push((key, value)),
        }
    }

    /// Adds a table.
    pub fn table<C: Into<String>>(
        mut self,
        name: impl Into<String>,
        columns: impl IntoIterator<Item = C>,
        rows: Vec<Vec<Value>>,
    ) -> Summary {
        self.tables.push(Table {
            name: name.into(),
            columns: columns.into_iter().map(Into::into).collect(),
            rows,
        });
        self
    }

    /// The value of fact `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.facts.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// One JSON object: `kind`, `path`, every fact, and every table as an
    /// array of row objects under its name.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), Value::String(self.kind.clone()));
        m.insert(
            "path".into(),
            Value::String(self.path.display().to_string()),
        );
        for (k, v) in &self.facts {
            m.insert(k.clone(), v.clone());
        }
        for t in &self.tables {
            m.insert(t.name.clone(), t.to_json());
        }
        Value::Object(m)
    }
}

impl Serialize for Summary {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// A cell as printed in a table: strings bare, null as `-`, the rest as JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.3}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kind: {}", self.kind)?;
        write!(f, "path: {}", self.path.display())?;
        for (k, v) in &self.facts {
            write!(f, "\n{k}: {}", cell(v))?;
        }
        for t in &self.tables {
            write!(f, "\n{}: {}", t.name, t.rows.len())?;
            if t.rows.is_empty() {
                continue;
            }
            let cells: Vec<Vec<String>> = t
                .rows
                .iter()
                .map(|r| r.iter().map(cell).collect())
                .collect();
            let widths: Vec<usize> = t
                .columns
                .iter()
                .enumerate()
                .map(|(c, name)| {
                    cells
                        .iter()
                        .filter_map(|r| r.get(c).map(String::len))
                        .chain([name.len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |row: &[String]| {
                let mut l = String::from(" ");
                for (c, w) in row.iter().zip(&widths) {
                    l.push_str(&format!(" {c:<w$}"));
                }
                l.trim_end().to_owned()
            };
            write!(f, "\n{}", line(&t.columns))?;
            for row in &cells {
                write!(f, "\n{}", line(row))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn problem_prints_path_then_detail_and_serializes_its_kind() {
        let p = Problem::new("/c/seg.arrow", ProblemKind::ChecksumMismatch, "differs");
        assert_eq!(p.to_string(), "/c/seg.arrow: differs");
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!(j["kind"], "checksum-mismatch");
        assert_eq!(j["path"], "/c/seg.arrow");
    }

    #[test]
    fn from_error_drops_the_path_prefix_once() {
        let e = "/c/x.bin: 3 bytes short";
        let p = Problem::from_error("/c/x.bin", ProblemKind::Truncated, &e);
        assert_eq!(p.detail, "3 bytes short");
        let other = Problem::from_error("/c/y.bin", ProblemKind::Io, &e);
        assert_eq!(other.detail, e, "a foreign prefix stays");
    }

    #[test]
    fn summary_prints_facts_in_order_and_tables_aligned() {
        let s = Summary::new("page-alloc", "/f")
            .fact("samples", 3)
            .fact("ratio", 0.5)
            .fact("samples", 4)
            .table(
                "fields",
                ["name", "bytes"],
                vec![
                    vec![json!("label"), json!(8)],
                    vec![json!("jpeg_data"), Value::Null],
                ],
            );
        let text = s.to_string();
        assert_eq!(
            text,
            "kind: page-alloc\npath: /f\nsamples: 4\nratio: 0.500\nfields: 2\n  name      bytes\n  label     8\n  jpeg_data -"
        );
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["fields"][1], json!({"name": "jpeg_data", "bytes": null}));
        assert_eq!(j["samples"], 4);
        assert_eq!(s.get("ratio"), Some(&json!(0.5)));
    }
}
