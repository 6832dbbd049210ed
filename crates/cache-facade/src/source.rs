//! What a build-from-source backend (memmap-array, page-alloc, shard-store)
//! builds its cache from.

use std::sync::Arc;

use durable_fs::BoxError;
use tensor_core::Value;

type ItemsFn = dyn Fn() -> Box<dyn Iterator<Item = Value> + Send> + Send + Sync;
type ProduceFn = dyn Fn(&str) -> Result<Value, BoxError> + Send + Sync;

/// The values a cache is built from. Cheap to clone.
///
/// - [`Source::items`]: a deterministic iterator factory; value `i` is
///   index `i` (and id `"i"`). shard-store calls it again whenever items
///   must be regenerated, so it must yield the same values every time.
/// - [`Source::keyed`]: ids and a function computing the value of one id.
///   A resumed memmap-array build calls it only for the ids not yet
///   written, so an interrupted build never recomputes committed rows.
#[derive(Clone)]
pub struct Source {
    pub(crate) kind: SourceKind,
}

#[derive(Clone)]
pub(crate) enum SourceKind {
    Items(Arc<ItemsFn>),
    Keyed {
        ids: Arc<[String]>,
        produce: Arc<ProduceFn>,
    },
}

impl Source {
    /// Values of a deterministic iterator, addressed by position.
    pub fn items<F, I>(factory: F) -> Source
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = Value>,
        I::IntoIter: Send + 'static,
    {
        Source {
            kind: SourceKind::Items(Arc::new(move || Box::new(factory().into_iter()))),
        }
    }

    /// Values of `ids`, computed by `produce` one id at a time.
    pub fn keyed<F, E>(ids: impl IntoIterator<Item = impl Into<String>>, produce: F) -> Source
    where
        F: Fn(&str) -> Result<Value, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Source {
            kind: SourceKind::Keyed {
                ids: ids.into_iter().map(Into::into).collect(),
                produce: Arc::new(move |id| produce(id).map_err(Into::into)),
            },
        }
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            SourceKind::Items(_) => f.write_str("Source::items(..)"),
            SourceKind::Keyed { ids, .. } => write!(f, "Source::keyed({} ids)", ids.len()),
        }
    }
}
