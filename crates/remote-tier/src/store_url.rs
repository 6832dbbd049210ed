//! From a URL to an object store: scheme, credentials and endpoints.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::ObjectStoreScheme;
use object_store::path::Path as ObjectPath;
use url::Url;

use crate::shared::SharedConnector;
use crate::{Error, Result};

/// The URL as it may be shown in errors and logs: no user, password or
/// query (where SAS tokens and the like travel).
pub(crate) fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string().trim_end_matches('/').to_string()
}

/// `url` as it may be shown in errors, logs and reports — the one
/// redaction every cachex crate uses: no user, password, query or
/// fragment; a URL that does not parse is withheld when it may carry
/// credentials.
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redact(&parsed),
        Err(_) => unparsed_shown(url),
    }
}

/// A URL that did not parse, as it may be shown: withheld when it may
/// carry credentials (`user:secret@`) or a query (tokens).
fn unparsed_shown(url: &str) -> String {
    if url.contains('@') || url.contains('?') {
        "(URL withheld: it may carry credentials)".to_string()
    } else {
        url.to_string()
    }
}

/// Builds the object store that `url` names and the path prefix inside it.
///
/// Credentials, regions and endpoints come from the environment variables
/// that `object_store`'s builders read (`AWS_*`, `GOOGLE_*`, `AZURE_*`),
/// then from `options` (keys as `object_store` spells them, e.g.
/// `aws_endpoint`, `aws_allow_http`, `google_service_account`), which win.
/// An option the store does not know is an error, not silently dropped.
///
/// Stores built here share one HTTP client per client configuration in a
/// process (its connections and TLS roots; see the crate docs).
pub fn build_store<I, K, V>(url: &str, options: I) -> Result<(Arc<dyn ObjectStore>, ObjectPath)>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    let parsed = Url::parse(url).map_err(|e| Error::BadUrl {
        url: unparsed_shown(url),
        reason: e.to_string(),
    })?;
    let shown = redact(&parsed);
    let bad_url = |reason: String| Error::BadUrl {
        url: shown.clone(),
        reason,
    };
    let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad_url(e.to_string()))?;
    let prefix = ObjectPath::parse(path).map_err(|e| bad_url(e.to_string()))?;
    let options: Vec<(String, String)> = options
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_ascii_lowercase(), v.into()))
        .collect();
    let unknown = |key: &str| Error::BadOption {
        url: shown.clone(),
        key: key.to_string(),
    };

    // Each cloud builder: every option set by its key (an unknown key
    // refused), then built over the tier's HTTP connector.
    macro_rules! configured {
        ($builder:expr) => {{
            let mut b = $builder;
            for (k, v) in options {
                let key = k.parse().map_err(|_| unknown(&k))?;
                b = b.with_config(key, v);
            }
            Arc::new(
                b.with_http_connector(SharedConnector)
                    .build()
                    .map_err(|e| bad_url(e.to_string()))?,
            )
        }};
    }

    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::Local => {
            if let Some((k, _)) = options.first() {
                return Err(unknown(k));
            }
            Arc::new(object_store::local::LocalFileSystem::new())
        }
        ObjectStoreScheme::Memory => {
            if let Some((k, _)) = options.first() {
                return Err(unknown(k));
            }
            Arc::new(object_store::memory::InMemory::new())
        }
        ObjectStoreScheme::AmazonS3 => {
            configured!(object_store::aws::AmazonS3Builder::from_env().with_url(parsed.as_str()))
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            configured!(
                object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(parsed.as_str())
            )
        }
        ObjectStoreScheme::MicrosoftAzure => {
            configured!(
                object_store::azure::MicrosoftAzureBuilder::from_env().with_url(parsed.as_str())
            )
        }
        ObjectStoreScheme::Http => {
            let base = &parsed[..url::Position::BeforePath];
            configured!(object_store::http::HttpBuilder::new().with_url(base))
        }
        other => return Err(bad_url(format!("unsupported scheme {other:?}"))),
    };
    Ok((store, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_credentials_and_query() {
        let url = Url::parse("s3://key:secret@bucket/prefix?sig=abc").unwrap();
        let shown = redact(&url);
        assert_eq!(shown, "s3://bucket/prefix");
    }

    #[test]
    fn unknown_options_and_schemes_are_named() {
        let err = build_store("memory:///", [("colour", "blue")]).unwrap_err();
        assert!(
            err.to_string().contains("`colour` is not an option"),
            "{err}"
        );
        let err = build_store("s3://bucket/p", [("aws_colour", "blue")]).unwrap_err();
        assert!(err.to_string().contains("s3://bucket/p"), "{err}");
        let err = build_store("s3://key:secret@[bad", Vec::<(String, String)>::new()).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = build_store("ftp://host/x", Vec::<(String, String)>::new()).unwrap_err();
        assert!(matches!(err, Error::BadUrl { .. }), "{err}");
    }
}
