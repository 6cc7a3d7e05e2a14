//! The process's object-store clients, and its counters of remote reads.
//!
//! Clients are kept per store and options for the life of the process, so a
//! store's credentials (an instance profile, a web identity token, a GCS
//! service account) are fetched once, not per shard. They are the
//! process's by the rule of [`crate::runtime::PerProcess`]: a client's
//! connection pool holds sockets shared with the parent across a `fork`,
//! so a forked child makes its own on first use and leaves the inherited
//! ones untouched. Their requests run on the process's one runtime
//! ([`runtime`]), made again in the child by the same rule. Worker
//! processes under fork, spawn or forkserver each get their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use http_body_util::BodyExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::{ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};

use super::url::{ObjectUrl, Scheme};
use super::RemoteError;
use crate::runtime::{PerProcess, Runtime};

/// The process-wide counters of remote reads.
#[derive(Debug, Default)]
pub struct Stats {
    /// HTTP requests sent (retries included).
    pub requests: AtomicU64,
    /// Requests that failed and were retried (a 5xx, 429 or 408 status, a
    /// connection error, a body broken off), by `object_store` or by
    /// [`super::fetch`]'s resume.
    pub retries: AtomicU64,
    /// Response body bytes received.
    pub bytes: AtomicU64,
    /// Shards fetched from their store.
    pub fetched: AtomicU64,
    /// Shards found in the cache directory.
    pub cache_hits: AtomicU64,
    /// Nanoseconds readers waited for a shard's bytes to arrive.
    pub wait_ns: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`Stats::requests`].
    pub requests: u64,
    /// See [`Stats::retries`].
    pub retries: u64,
    /// See [`Stats::bytes`].
    pub bytes: u64,
    /// See [`Stats::fetched`].
    pub fetched: u64,
    /// See [`Stats::cache_hits`].
    pub cache_hits: u64,
    /// See [`Stats::wait_ns`].
    pub wait_ns: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fetched: self.fetched.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The process's counters (a forked child starts from its parent's values).
pub fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::default)
}

/// Options of a store, as given by the source (`storage_options=`), sorted
/// so that equal options give one client.
pub type StorageOptions = Vec<(String, String)>;

/// Clients by store URL and options (the storage options, then the store's
/// environment: see [`store_environment`]).
type Clients = Mutex<HashMap<(String, StorageOptions), Arc<dyn ObjectStore>>>;

/// This process's clients.
static CLIENTS: PerProcess<Clients> = PerProcess::new();

/// This process's runtime ([`crate::runtime::current`]), or the error of
/// starting it, naming `url` (what it was started for).
///
/// # Errors
///
/// [`RemoteError::Failed`] with the OS error of starting the runtime's
/// threads.
pub fn runtime(url: &str) -> Result<Arc<Runtime>, RemoteError> {
    crate::runtime::current().map_err(|e| RemoteError::Failed {
        url: url.to_string(),
        message: format!("cannot start the runtime: {e}"),
    })
}

/// The client of `url`'s store with `options`, made once per process.
///
/// # Errors
///
/// [`RemoteError::BadOption`] for an option the store does not know, the
/// store's refusal of its configuration (as `Failed`), or the runtime's
/// failure to start.
pub fn client(
    url: &ObjectUrl,
    options: &StorageOptions,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    // The store's environment is part of the key: a process that changes
    // AWS_ENDPOINT_URL (or the like) gets a client for the new one.
    let mut keyed = options.clone();
    keyed.extend(store_environment(url.scheme));
    let key = (url.store.clone(), keyed);
    let clients = CLIENTS.get_or_init(Clients::default);
    // The lock is held for a look-up (or a client's build) only, never
    // across a request.
    let mut clients = clients.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = clients.get(&key) {
        return Ok(Arc::clone(c));
    }
    // Building an S3 client reads the environment only; credentials are
    // fetched on the first request, inside the runtime.
    let runtime = runtime(&url.url)?;
    let _guard = runtime.enter();
    let client = build(url, options)?;
    clients.insert(key, Arc::clone(&client));
    Ok(client)
}

/// The options `ferrofeed` reads itself (the rest go to the store).
const RETRY_KEYS: [&str; 2] = ["max_retries", "retry_timeout"];

/// The variables of the store's environment that say which server and
/// account a URL reaches (not secrets: no secret keys or tokens), sorted,
/// with an `env:` prefix: part of the key of a client, and of a node's index
/// of a source (`_remote.py` asks for it through `_core._remote_environment`).
pub fn store_environment(scheme: Scheme) -> Vec<(String, String)> {
    let prefix = match scheme {
        Scheme::S3 => "AWS_",
        Scheme::Gcs => "GOOGLE_",
        Scheme::Azure => "AZURE_",
        Scheme::Http => return Vec::new(),
    };
    let mut out: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with(prefix) && locates(k))
        .map(|(k, v)| (format!("env:{k}"), v))
        .collect();
    out.sort();
    out
}

/// Whether the environment variable `name` says where a store is (its
/// endpoint, region, account, the credentials' identity), as opposed to a
/// secret.
fn locates(name: &str) -> bool {
    const PARTS: [&str; 7] = [
        "ENDPOINT",
        "REGION",
        "ACCOUNT",
        "BUCKET",
        "ACCESS_KEY_ID",
        "APPLICATION_CREDENTIALS",
        "ALLOW_HTTP",
    ];
    PARTS.iter().any(|p| name.contains(p)) && !name.contains("SECRET")
}

/// The retry limits of `options` (`max_retries`, `retry_timeout` in
/// seconds) over `object_store`'s defaults (10 retries within 180 s).
///
/// # Errors
///
/// [`RemoteError::BadOption`] naming `url` and the option for a value that
/// is not a count or a number of seconds.
pub fn retry_config(url: &str, options: &StorageOptions) -> Result<RetryConfig, RemoteError> {
    let bad = |key: &str, why: String| RemoteError::BadOption {
        url: url.to_string(),
        key: key.to_string(),
        why,
    };
    let mut retry = RetryConfig::default();
    for (key, value) in options {
        match key.as_str() {
            "max_retries" => {
                retry.max_retries = value
                    .parse()
                    .map_err(|_| bad(key, format!("{value:?} is not a count")))?;
            }
            "retry_timeout" => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| bad(key, format!("{value:?} is not a number of seconds")))?;
                retry.retry_timeout = Duration::from_secs_f64(secs);
            }
            _ => {}
        }
    }
    Ok(retry)
}

/// Builds the client of `url`'s store: the store's environment
/// (`AWS_*`, `GOOGLE_*`, `AZURE_*`), then `options` over it.
fn build(url: &ObjectUrl, options: &StorageOptions) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    install_tls_provider();
    let bad = |key: &str, why: String| RemoteError::BadOption {
        url: url.url.clone(),
        key: key.to_string(),
        why,
    };
    let retry = retry_config(&url.url, options)?;
    let given = || {
        options
            .iter()
            .filter(|(k, _)| !RETRY_KEYS.contains(&k.as_str()))
    };
    // An endpoint given as http:// is meant to be reached over HTTP (a local
    // S3-compatible server), as boto3 and the AWS CLI take it.
    let http_endpoint = |env: &str, keys: &[&str]| {
        given()
            .find(|(k, _)| keys.contains(&k.to_ascii_lowercase().as_str()))
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(env).ok())
            .is_some_and(|e| e.starts_with("http://"))
    };
    // The four builders share these steps but no trait: the storage options
    // parsed by each store's own config key type, then the retry limits and
    // the counting HTTP client.
    macro_rules! with_options {
        ($builder:expr) => {{
            let mut b = $builder;
            for (k, v) in given() {
                let key = k
                    .to_ascii_lowercase()
                    .parse()
                    .map_err(|e| bad(k, format!("{e}")))?;
                b = b.with_config(key, v);
            }
            b
        }};
    }
    macro_rules! built {
        ($builder:expr) => {
            Arc::new(
                $builder
                    .with_retry(retry)
                    .with_http_connector(CountingConnector)
                    .build()
                    .map_err(|e| RemoteError::from_store(&url.url, &e))?,
            )
        };
    }
    let store: Arc<dyn ObjectStore> = match url.scheme {
        Scheme::S3 => {
            let mut b =
                with_options!(object_store::aws::AmazonS3Builder::from_env().with_url(&url.url));
            if http_endpoint(
                "AWS_ENDPOINT_URL",
                &[
                    "aws_endpoint_url",
                    "aws_endpoint",
                    "endpoint_url",
                    "endpoint",
                ],
            ) {
                b = b.with_config(
                    object_store::aws::AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
                    "true",
                );
            }
            built!(b)
        }
        Scheme::Gcs => built!(with_options!(
            object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(&url.url)
        )),
        Scheme::Azure => built!(with_options!(
            object_store::azure::MicrosoftAzureBuilder::from_env().with_url(&url.url)
        )),
        Scheme::Http => built!(with_options!(object_store::http::HttpBuilder::new()
            .with_url(&url.store)
            .with_config(
                ClientConfigKey::AllowHttp,
                if url.store.starts_with("http://") {
                    "true"
                } else {
                    "false"
                },
            ))),
    };
    Ok(store)
}

/// Makes ring rustls's process-wide TLS provider, once, before the first
/// client is built.
///
/// reqwest is built without a provider of its own (`rustls-no-provider` in
/// Cargo.toml: the default would compile aws-lc), and panics when it makes a
/// TLS client with none installed. `install_default` fails only when a
/// provider is installed already; this extension's copy of rustls is its
/// own (statically linked), so that one is ours, and ring either way.
fn install_tls_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // An Err holds a provider that was installed first: nothing to do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Makes reqwest clients whose requests, failures and body bytes are
/// counted in [`stats`]: `object_store` retries inside its client, and this
/// is the one place that sees every attempt.
#[derive(Debug, Clone, Copy)]
struct CountingConnector;

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counting { inner }))
    }
}

/// See [`CountingConnector`].
#[derive(Debug)]
struct Counting {
    inner: HttpClient,
}

/// Whether `object_store` retries a response of `status`.
fn retried_status(status: http::StatusCode) -> bool {
    status.is_server_error()
        || status == http::StatusCode::TOO_MANY_REQUESTS
        || status == http::StatusCode::REQUEST_TIMEOUT
}

#[async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let s = stats();
        Stats::add(&s.requests, 1);
        match self.inner.execute(req).await {
            Ok(response) => {
                if retried_status(response.status()) {
                    Stats::add(&s.retries, 1);
                }
                let (parts, body) = response.into_parts();
                let body = body
                    .map_frame(|frame| {
                        if let Some(data) = frame.data_ref() {
                            Stats::add(&stats().bytes, data.len() as u64);
                        }
                        frame
                    })
                    .map_err(|e| {
                        Stats::add(&stats().retries, 1);
                        e
                    });
                Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
            }
            Err(e) => {
                if !matches!(e.kind(), HttpErrorKind::Unknown | HttpErrorKind::Decode) {
                    Stats::add(&s.retries, 1);
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(url: &str, options: &[(&str, &str)]) -> Result<Arc<dyn ObjectStore>, RemoteError> {
        let options: StorageOptions = options
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        super::client(&ObjectUrl::parse(url).unwrap(), &options)
    }

    #[test]
    fn builds_a_client_per_store_without_a_request() {
        // No request is made: building reads the options (and environment) only.
        let s3 = [
            ("region", "eu-west-1"),
            ("access_key_id", "k"),
            ("secret_access_key", "s"),
        ];
        client("s3://bucket/a.tar", &s3).unwrap();
        client("gs://bucket/a.tar", &[("skip_signature", "true")]).unwrap();
        client(
            "az://container/a.tar",
            &[("account_name", "acct"), ("skip_signature", "true")],
        )
        .unwrap();
        client("http://127.0.0.1:9/data/a.tar", &[]).unwrap();
    }

    #[test]
    fn https_clients_get_the_ring_tls_provider() {
        // reqwest has no TLS provider of its own (Cargo.toml): without the one
        // build() installs, making an https client panics.
        client(
            "s3://bucket/a.tar",
            &[("region", "eu-west-1"), ("skip_signature", "true")],
        )
        .unwrap();
        client("https://example.invalid/data/a.tar", &[]).unwrap();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }

    #[test]
    fn one_client_per_store_and_options() {
        let opts = [("region", "us-east-1"), ("skip_signature", "true")];
        let a = client("s3://same/a.tar", &opts).unwrap();
        let b = client("s3://same/b.tar", &opts).unwrap();
        let c = client("s3://other/a.tar", &opts).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn refuses_unknown_options_and_bad_retry_values() {
        for (url, options) in [
            ("s3://b/a.tar", [("no_such_option", "1")]),
            ("gs://b/a.tar", [("no_such_option", "1")]),
            ("az://c/a.tar", [("no_such_option", "1")]),
            ("http://h/a.tar", [("no_such_option", "1")]),
            ("s3://b/a.tar", [("max_retries", "many")]),
            ("s3://b/a.tar", [("retry_timeout", "-1")]),
        ] {
            let Err(e) = client(url, &options) else {
                panic!("{url} {options:?}: not refused")
            };
            assert!(matches!(e, RemoteError::BadOption { .. }), "{e}");
            assert!(e.to_string().contains(options[0].0), "{e}");
        }
    }

    #[test]
    fn counts_status_codes_retried_as_retries() {
        assert!(retried_status(http::StatusCode::SERVICE_UNAVAILABLE));
        assert!(retried_status(http::StatusCode::INTERNAL_SERVER_ERROR));
        assert!(retried_status(http::StatusCode::TOO_MANY_REQUESTS));
        assert!(!retried_status(http::StatusCode::NOT_FOUND));
        assert!(!retried_status(http::StatusCode::FORBIDDEN));
        assert!(!retried_status(http::StatusCode::PARTIAL_CONTENT));
    }
}
