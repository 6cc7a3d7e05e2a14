//! Shards in object storage: S3 (and S3-compatible servers), Google Cloud
//! Storage, Azure Blob Storage and plain HTTP(S), through the `object_store`
//! crate (its clients, credential chains and request retries).
//!
//! A remote shard is fetched whole, with large ranged GETs run concurrently,
//! into memory (and, with a cache directory, onto local disk), and then read
//! by the same readers as a local file (`crate::shards`). Which shards are
//! fetched when is [`RemoteShards`]' business: the one a reader asks for now,
//! and the next ones in the plan's order within a byte budget, so that once
//! warm the decode never waits for the network.
//!
//! - [`url`]: which store and which object a URL names.
//! - [`store`]: the process's clients, made in the process that uses them
//!   (never inherited across `fork`, by [`crate::runtime::PerProcess`]'s
//!   rule), one per store and options, so credentials are fetched once per
//!   process, not per shard; their requests, and every fetch, run on the
//!   process's one runtime ([`crate::runtime`]); and the process-wide
//!   counters ([`Stats`]).
//! - [`fetch`]: an object or a range of it, in parts, each part resumed from
//!   the byte where a dropped body stopped.
//! - [`cache`]: fetched shards on local disk, shared by every process of a
//!   node (one download per shard, no half-written file ever read, least
//!   recently used evicted past a size cap).
//! - [`shards`]: the per-source set of remote shards with its prefetch.
//!
//! # What is retried, what fails fast
//!
//! `object_store` retries a request that fails with a 5xx status, 429 or
//! 408 (S3's 503 `SlowDown` among them), a connection error or a timeout,
//! with exponential backoff, up to `max_retries` times within
//! `retry_timeout` (storage options of the same names; 10 and 180 s by
//! default), and a body that breaks off when the object has an `ETag`;
//! [`fetch`] resumes a body that breaks off past that from the byte where it
//! stopped. A 404 (a missing object or bucket), 403 or 401 is not retried:
//! it fails at once, as [`RemoteError::NotFound`] or [`RemoteError::Denied`]
//! naming the URL.

pub mod cache;
mod error;
pub mod fetch;
pub mod list;
pub mod shards;
pub mod store;
pub mod url;

pub use cache::Cache;
pub(crate) use error::store_message;
pub use error::RemoteError;
pub use fetch::Object;
pub use shards::{RemoteOptions, RemoteShards};
pub use store::{stats, Stats, StatsSnapshot};
pub use url::ObjectUrl;
