//! Cache roots as Python gives them: a local path, or a URL (`s3://`,
//! `gs://`, `az://`, `file://`) with the local tier's keywords
//! (`tier_dir=`, `tier_budget=`, `storage_options=`), turned into a
//! [`Location`] by remote-cache's one road. Every class that takes a cache
//! path takes a [`Root`] and its [`TierArgs`] from here.
//!
//! `storage_options` may hold what an `object_store` client needs beside
//! the environment (an endpoint, `aws_allow_http`); it is kept for
//! reopening (a forked child, a pickled copy) and never shown: a root is
//! shown as its path, or its URL redacted ([`Root::shown`]).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use remote_cache::{CacheDir, Location, StoreKind, TierOptions, is_url, parse_bytes, redact_url};

use crate::errors;

/// The tier keywords every URL-taking class accepts. No `Debug`: the
/// options may hold secrets.
#[derive(Clone, Default)]
pub struct TierArgs {
    options: TierOptions,
    /// A writer's tier block (`PageWriter(tier_block_size=)`): the largest
    /// block its publish records a file's hashes in.
    block_size: Option<u64>,
}

impl TierArgs {
    /// The keywords as given: `tier_budget` an int of bytes or a size such
    /// as `"20G"`; `storage_options` a dict of str to str (bools and
    /// numbers are written as `object_store` reads them).
    pub fn new(
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TierArgs> {
        let budget = match tier_budget {
            None => None,
            Some(b) if b.is_none() => None,
            Some(b) if b.is_instance_of::<PyBool>() => {
                return Err(errors::invalid(
                    "tier_budget: give bytes or a size such as \"20G\"",
                ));
            }
            Some(b) => Some(match b.extract::<u64>() {
                Ok(n) => n,
                Err(_) => {
                    let text: String = b.extract().map_err(|_| {
                        errors::invalid(format!(
                            "tier_budget: give bytes or a size such as \"20G\", not {}",
                            b.get_type()
                        ))
                    })?;
                    parse_bytes(&text).ok_or_else(|| {
                        errors::invalid(format!(
                            "tier_budget {text:?} is not a size (e.g. 500M, 20G)"
                        ))
                    })?
                }
            }),
        };
        let mut pairs = std::collections::BTreeMap::new();
        if let Some(d) = storage_options {
            for (k, v) in d.iter() {
                let key: String = k.extract().map_err(|_| {
                    errors::invalid(format!(
                        "storage_options keys must be str, not {}",
                        k.get_type()
                    ))
                })?;
                // Only the key is named: the value may be a secret.
                let value = if v.is_instance_of::<PyBool>() {
                    if v.extract::<bool>()? {
                        "true"
                    } else {
                        "false"
                    }
                    .to_string()
                } else if v.is_instance_of::<PyString>() {
                    v.extract::<String>()?
                } else if let Ok(n) = v.extract::<i64>() {
                    n.to_string()
                } else if let Ok(x) = v.extract::<f64>() {
                    x.to_string()
                } else {
                    return Err(errors::invalid(format!(
                        "storage_options[{key:?}]: give a str, bool or number"
                    )));
                };
                pairs.insert(key, value);
            }
        }
        Ok(TierArgs {
            options: TierOptions {
                tier_dir,
                tier_budget: budget,
                storage_options: pairs,
                single_publisher: false,
            },
            block_size: None,
        })
    }

    /// These keywords with the tier's block set to `block_size` (`None`:
    /// the tier's default), the largest block a publish through it records
    /// a file's hashes in.
    pub fn with_block_size(mut self, block_size: Option<u64>) -> TierArgs {
        self.block_size = block_size;
        self
    }

    /// The settings for remote-cache.
    pub fn options(&self) -> &TierOptions {
        &self.options
    }

    /// Sets `tier_dir`, `tier_budget` and `storage_options` in `kwargs`
    /// (for pickling and for reopening through a constructor).
    pub fn to_kwargs(&self, kwargs: &Bound<'_, PyDict>) -> PyResult<()> {
        let py = kwargs.py();
        kwargs.set_item("tier_dir", &self.options.tier_dir)?;
        kwargs.set_item("tier_budget", self.options.tier_budget)?;
        if self.options.storage_options.is_empty() {
            kwargs.set_item("storage_options", py.None())?;
        } else {
            let d = PyDict::new(py);
            for (k, v) in &self.options.storage_options {
                d.set_item(k, v)?;
            }
            kwargs.set_item("storage_options", d)?;
        }
        Ok(())
    }
}

/// A cache root: a local path, or a URL read through the local tier. No
/// `Debug`: the URL and options may hold secrets (see [`Root::shown`]).
#[derive(Clone)]
pub struct Root {
    location: Location,
    tier: TierArgs,
    /// The root as given: a URL (with whatever it carries: it reopens the
    /// cache and is never shown), or `None` for a path.
    url: Option<String>,
}

impl Root {
    /// The root `root` (a `str` URL, or any path-like) with the tier
    /// keywords `tier`.
    pub fn new(root: &Bound<'_, PyAny>, tier: TierArgs) -> PyResult<Root> {
        if let Ok(s) = root.cast::<PyString>() {
            let s = s.to_str()?;
            if is_url(s) {
                return Root::url(s, tier);
            }
        }
        let path: PathBuf = root.extract().map_err(|_| {
            errors::invalid(format!(
                "a cache root is a path or a URL (s3://, gs://, az://, file://), not {}",
                root.get_type()
            ))
        })?;
        Ok(Root {
            location: Location::Local(path),
            tier,
            url: None,
        })
    }

    /// The root at URL `url`.
    pub fn url(url: &str, tier: TierArgs) -> PyResult<Root> {
        Root::parse_url(url, tier).map_err(errors::to_py)
    }

    fn parse_url(url: &str, tier: TierArgs) -> remote_cache::Result<Root> {
        let mut location = Location::parse_with(url, tier.options())?;
        if let (Location::Remote(spec), Some(block_size)) = (&mut location, tier.block_size) {
            spec.tier.block_size = block_size;
        }
        Ok(Root {
            location,
            tier,
            url: Some(url.to_string()),
        })
    }

    /// Where the cache lives, for remote-cache.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The tier keywords it was given.
    pub fn tier(&self) -> &TierArgs {
        &self.tier
    }

    /// The URL redacted (`None` for a path): what `url` properties show.
    pub fn shown_url(&self) -> Option<String> {
        self.url.as_deref().map(redact_url)
    }

    /// The root as it may be shown (reprs, errors): its path, or its URL
    /// without credentials or query.
    pub fn shown(&self) -> String {
        self.location.shown()
    }

    /// The root as given, for pickling: a URL as `str`, a path as `Path`.
    pub fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match (&self.url, &self.location) {
            (Some(u), _) => Ok(PyString::new(py, u).into_any()),
            (None, Location::Local(p)) => p.into_pyobject(py).map(Bound::into_any),
            (None, Location::Remote(_)) => Ok(py.None().into_bound(py)),
        }
    }

    /// The root `<url>/<rel>` of a cache laid out under this URL root
    /// (`rel` `/`-separated), with the same tier keywords.
    pub fn url_under(&self, rel: &str) -> PyResult<Root> {
        match &self.url {
            Some(url) => {
                let base = url.split(['?', '#']).next().unwrap_or(url);
                Root::url(
                    &format!("{}/{rel}", base.trim_end_matches('/')),
                    self.tier.clone(),
                )
            }
            None => Err(errors::invalid(format!("{}: not a URL", self.shown()))),
        }
    }

    /// The local file this root names: the path itself, or for a URL
    /// naming a file under a prefix, the file in a working directory over
    /// the local tier that the prefix opened in for a store of `kind`
    /// (returned too: it holds the directory, and publishes what is
    /// written there).
    pub fn open_file(
        &self,
        kind: impl Into<Option<StoreKind>>,
    ) -> remote_cache::Result<(PathBuf, Option<CacheDir>)> {
        match (self.split_file()?, &self.location) {
            (Some((dir, file)), _) => {
                let opened = dir.location().open_dir(kind)?;
                Ok((opened.path().join(file), Some(opened)))
            }
            (None, Location::Local(path)) => Ok((path.clone(), None)),
            (None, Location::Remote(_)) => Err(remote_cache::Error::BadLocation {
                root: self.shown(),
                problem: "name a file under a prefix".into(),
            }),
        }
    }

    /// The directory of the file this root names and the file's name: a
    /// path's parent folder, or a URL's prefix (see
    /// [`split_file`](Self::split_file)).
    pub fn file_location(&self) -> remote_cache::Result<(Location, String)> {
        if let Some((dir, file)) = self.split_file()? {
            return Ok((dir.location().clone(), file));
        }
        let bad = |problem: &str| remote_cache::Error::BadLocation {
            root: self.shown(),
            problem: problem.into(),
        };
        let Location::Local(path) = &self.location else {
            return Err(bad("name a file under a prefix"));
        };
        match (path.parent(), path.file_name().map(|n| n.to_str())) {
            (Some(parent), Some(Some(name))) => {
                Ok((Location::Local(parent.to_path_buf()), name.to_owned()))
            }
            (_, Some(None)) => Err(bad("the file's name is not UTF-8")),
            _ => Err(bad("name a file, not a folder's root")),
        }
    }

    /// A URL naming one file (`s3://bucket/prefix/data.pages`) split into
    /// the root of its directory and the file's name; `None` for a path.
    pub fn split_file(&self) -> remote_cache::Result<Option<(Root, String)>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let trimmed = url.split(['?', '#']).next().unwrap_or(url);
        match trimmed.rsplit_once('/') {
            Some((dir, file)) if !file.is_empty() && !dir.ends_with('/') => Ok(Some((
                Root::parse_url(dir, self.tier.clone())?,
                file.to_string(),
            ))),
            _ => Err(remote_cache::Error::BadLocation {
                root: redact_url(url),
                problem: "name a file under a prefix (s3://bucket/prefix/data.pages)".into(),
            }),
        }
    }
}
