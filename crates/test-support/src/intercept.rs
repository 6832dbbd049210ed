//! A pass-through [`ObjectStore`] whose requests a test or a benchmark
//! watches, delays, fails or alters: the trait's forwarding written once,
//! so each wrapper (fault injection, request logs, latency) writes only
//! the requests it changes, as an [`Intercept`].
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use object_store::memory::InMemory;
//! use object_store::{GetOptions, GetResult, ObjectStore, ObjectStoreExt, path::Path};
//! use test_support::intercept::{Intercept, Intercepted};
//!
//! /// Counts GETs.
//! #[derive(Debug, Default)]
//! struct Gets(AtomicU64);
//!
//! #[async_trait::async_trait]
//! impl Intercept for Gets {
//!     fn name(&self) -> &'static str {
//!         "Gets"
//!     }
//!     async fn get(
//!         &self,
//!         inner: &dyn ObjectStore,
//!         location: &Path,
//!         options: GetOptions,
//!     ) -> object_store::Result<GetResult> {
//!         self.0.fetch_add(1, Ordering::SeqCst);
//!         inner.get_opts(location, options).await
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Intercepted::new(Arc::new(InMemory::new()), Gets::default());
//! store.put(&Path::from("a"), vec![1u8].into()).await.unwrap();
//! assert!(store.get(&Path::from("a")).await.is_ok());
//! assert_eq!(store.hooks.0.load(Ordering::SeqCst), 1);
//! # });
//! ```

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What a wrapper does to requests; each method forwards to `inner`
/// unchanged unless overridden.
#[async_trait]
pub trait Intercept: fmt::Debug + Send + Sync + 'static {
    /// The wrapper's name, shown as `name(inner)`.
    fn name(&self) -> &'static str;

    /// A put (`opts.mode` tells a conditional one).
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        inner.put_opts(location, payload, opts).await
    }

    /// The start of a multipart upload.
    async fn put_multipart(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        inner.put_multipart_opts(location, opts).await
    }

    /// A GET, or a HEAD when `options.head`.
    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        inner.get_opts(location, options).await
    }

    /// A LIST under `prefix`, about to be sent (seen, not changed).
    fn list(&self, _prefix: Option<&Path>) {}

    /// A LIST with a delimiter ([`Intercept::list`], then forwarded).
    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&Path>,
    ) -> Result<ListResult> {
        self.list(prefix);
        inner.list_with_delimiter(prefix).await
    }
}

/// Hooks shared with the test that set them (`Arc<Faults>`, say) work as
/// the hooks themselves.
#[async_trait]
impl<I: Intercept> Intercept for Arc<I> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        (**self).put(inner, location, payload, opts).await
    }

    async fn put_multipart(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        (**self).put_multipart(inner, location, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        (**self).get(inner, location, options).await
    }

    fn list(&self, prefix: Option<&Path>) {
        (**self).list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&Path>,
    ) -> Result<ListResult> {
        (**self).list_with_delimiter(inner, prefix).await
    }
}

/// `inner` behind the [`Intercept`] `hooks`.
#[derive(Debug)]
pub struct Intercepted<I> {
    /// The store requests go to.
    pub inner: Arc<dyn ObjectStore>,
    /// What happens to them on the way.
    pub hooks: I,
}

impl<I: Intercept> Intercepted<I> {
    /// `inner` behind `hooks`.
    pub fn new(inner: Arc<dyn ObjectStore>, hooks: I) -> Intercepted<I> {
        Intercepted { inner, hooks }
    }
}

impl<I: Intercept> fmt::Display for Intercepted<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.hooks.name(), self.inner)
    }
}

#[async_trait]
impl<I: Intercept> ObjectStore for Intercepted<I> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.hooks.put(&*self.inner, location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.hooks.put_multipart(&*self.inner, location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.hooks.get(&*self.inner, location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.hooks.list(prefix);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.hooks.list(prefix);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.hooks.list_with_delimiter(&*self.inner, prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
