//! Fetching an object, or a range of it, in parts run concurrently.
//!
//! Each part is one ranged GET. `object_store` retries a request that fails
//! before its body (and, for an object with an `ETag`, a body that breaks
//! off); a part whose body still breaks off here (a server without `ETag`s,
//! retries spent) is asked for again from the byte where it stopped, within
//! the same limits (`max_retries` times, `retry_timeout` from the part's
//! first request), so a dropped connection costs the bytes not yet
//! received, not the part, and never a sample.
//!
//! A server that answers a ranged GET with the whole object (200, not 206:
//! `python -m http.server`, many plain web servers) is read with one GET of
//! the whole body instead, streamed: the bytes before the range are skipped
//! as they arrive, the request is dropped once the range is in, and a body
//! that breaks off is asked for again from the start (the only way without
//! ranges), within the same limits. The store is remembered for the rest of
//! the process, so it is asked for a range once, not once per shard.

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};

use super::url::ObjectUrl;
use super::RemoteError;

/// Times a listing is asked for again after its body broke off.
pub const MAX_RESUMES: u32 = 10;

/// A remote object as listed: where it is, its size and its `ETag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its URL.
    pub url: ObjectUrl,
    /// Its size in bytes.
    pub size: u64,
    /// Its `ETag`, if the store gives one: every later GET asks for this one
    /// version (`If-Match`), so an object replaced while a source reads it
    /// fails as [`RemoteError::Changed`] instead of mixing two versions.
    pub etag: Option<String>,
}

impl Object {
    /// The object's metadata, by one HEAD request.
    ///
    /// # Errors
    ///
    /// [`RemoteError::NotFound`] (a missing object or bucket),
    /// [`RemoteError::Denied`], or the failure once retries are spent.
    pub async fn head(store: &dyn ObjectStore, url: ObjectUrl) -> Result<Self, RemoteError> {
        let meta = again(|| async {
            store
                .head(&url.path)
                .await
                .map_err(|e| RemoteError::from_store(&url.url, &e))
        })
        .await?;
        Ok(Self {
            size: meta.size,
            etag: meta.e_tag,
            url,
        })
    }

    /// The objects under `prefix`'s directory (recursively), in the store's
    /// order (by key), as one listing (one request per thousand objects on
    /// S3).
    ///
    /// # Errors
    ///
    /// As [`Object::head`], for the listing.
    pub async fn list(
        store: &dyn ObjectStore,
        prefix: &ObjectUrl,
    ) -> Result<Vec<Self>, RemoteError> {
        let dir = prefix.path.clone();
        let metas: Vec<object_store::ObjectMeta> = again(|| async {
            store
                .list(Some(&dir))
                .try_collect()
                .await
                .map_err(|e| RemoteError::from_store(&prefix.url, &e))
        })
        .await?;
        let mut out = Vec::with_capacity(metas.len());
        for meta in metas {
            let url = ObjectUrl::parse(&prefix.sibling(&meta.location))?;
            out.push(Self {
                url,
                size: meta.size,
                etag: meta.e_tag,
            });
        }
        out.sort_by(|a, b| a.url.path.as_ref().cmp(b.url.path.as_ref()));
        Ok(out)
    }

    /// The bytes `range` of the object, fetched as ranged GETs of at most
    /// `part` bytes, each holding a permit of `requests` while it runs (the
    /// semaphore is fair: the parts of an object asked for first go first),
    /// a broken body resumed within `retry`'s limits.
    ///
    /// # Errors
    ///
    /// The first part's failure: [`RemoteError::NotFound`],
    /// [`RemoteError::Denied`], [`RemoteError::Changed`] (its size or `ETag`
    /// differ from this object's), or the failure once retries and resumes
    /// are spent.
    pub async fn get(
        &self,
        store: &dyn ObjectStore,
        range: Range<u64>,
        part: u64,
        requests: &tokio::sync::Semaphore,
        retry: &RetryConfig,
    ) -> Result<Bytes, RemoteError> {
        if range.end > self.size || range.start > range.end {
            return Err(RemoteError::Changed {
                url: self.url.url.clone(),
                message: format!(
                    "bytes {}..{} asked of an object of {} bytes",
                    range.start, range.end, self.size
                ),
            });
        }
        let len = usize::try_from(range.end - range.start).map_err(|_| RemoteError::Failed {
            url: self.url.url.clone(),
            message: "larger than this machine's address space".into(),
        })?;
        let part = usize::try_from(part.max(1)).unwrap_or(usize::MAX);
        // Not zeroed first (a memset of every shard, about 2% of the training
        // job's CPU): the parts write every byte, and the length is set only
        // once they all have.
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        let mut ranged = !ranges_refused(&self.url.store);
        if ranged {
            let chunks = buf.spare_capacity_mut()[..len].chunks_mut(part);
            let parts = chunks.enumerate().map(|(k, out)| async move {
                let _permit = self.permit(requests).await?;
                self.part(store, range.start + (k * part) as u64, out, true, retry)
                    .await
            });
            let served = futures_util::future::try_join_all(parts).await?;
            if served.contains(&Served::RangesRefused) {
                refuse_ranges(&self.url.store);
                ranged = false;
            }
        }
        if !ranged {
            // One request for the whole range: parts would each download the
            // object from its first byte.
            let _permit = self.permit(requests).await?;
            let out = &mut buf.spare_capacity_mut()[..len];
            self.part(store, range.start, out, false, retry).await?;
        }
        // SAFETY: bytes 0..len of the buffer's capacity are covered either by
        // the chunks of the ranged parts, all of which returned `Served::All`,
        // or by the one unranged part, which returned Ok. `part` returns
        // `Served::All` (the only Ok of an unranged part) only once it has
        // written every byte of its slice (`done == out.len()`), so 0..len is
        // initialised. On an error the buffer is dropped with length 0.
        unsafe { buf.set_len(len) };
        Ok(Bytes::from(buf))
    }

    /// A permit of `requests`, or the error of a closed source.
    async fn permit<'s>(
        &self,
        requests: &'s tokio::sync::Semaphore,
    ) -> Result<tokio::sync::SemaphorePermit<'s>, RemoteError> {
        requests.acquire().await.map_err(|_| RemoteError::Failed {
            url: self.url.url.clone(),
            message: "the source was closed".into(),
        })
    }

    /// Fills `out` with the bytes from `start`, resuming a broken body up to
    /// `retry.max_retries` times within `retry.retry_timeout`: ranged GETs
    /// from the byte where the last one stopped, or (`ranged` false) GETs of
    /// the whole object whose bytes before `start + done` are skipped.
    ///
    /// A ranged part that the server answers with the whole object returns
    /// [`Served::RangesRefused`] at once, having written nothing.
    async fn part(
        &self,
        store: &dyn ObjectStore,
        start: u64,
        out: &mut [MaybeUninit<u8>],
        ranged: bool,
        retry: &RetryConfig,
    ) -> Result<Served, RemoteError> {
        let began = std::time::Instant::now();
        let mut done = 0usize;
        let mut resumes = 0usize;
        while done < out.len() {
            let from = start + done as u64;
            let options = GetOptions {
                range: ranged.then(|| GetRange::Bounded(from..start + out.len() as u64)),
                if_match: self.etag.clone(),
                ..GetOptions::default()
            };
            let result = match store.get_opts(&self.url.path, options).await {
                Ok(result) => result,
                Err(e) if ranged && is_whole_answer(&e) => return Ok(Served::RangesRefused),
                Err(e) => return Err(RemoteError::from_store(&self.url.url, &e)),
            };
            if result.meta.size != self.size {
                return Err(RemoteError::Changed {
                    url: self.url.url.clone(),
                    message: format!("{} bytes, {} when listed", result.meta.size, self.size),
                });
            }
            let mut body = result.into_stream();
            let mut broke: Option<object_store::Error> = None;
            // Bytes of an unranged body still to skip before `from`.
            let mut skip = if ranged { 0 } else { from };
            while let Some(chunk) = body.next().await {
                match chunk {
                    Ok(mut bytes) => {
                        if skip > 0 {
                            let n = skip.min(bytes.len() as u64);
                            skip -= n;
                            bytes = bytes.slice(n as usize..);
                        }
                        if !ranged {
                            // The rest of the object is not wanted: dropping
                            // the body ends the request.
                            bytes.truncate(out.len() - done);
                        }
                        let n = bytes.len();
                        let Some(slot) = out.get_mut(done..done + n) else {
                            return Err(RemoteError::Failed {
                                url: self.url.url.clone(),
                                message: format!(
                                    "the server sent more than the {} bytes asked from byte {from}",
                                    out.len() - (from - start) as usize
                                ),
                            });
                        };
                        // SAFETY: `slot` is `n` writable bytes of the buffer
                        // (bounds checked by `get_mut` above), `bytes` holds
                        // `n` bytes, and the two do not overlap (one is the
                        // response's, the other ours).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                bytes.as_ptr(),
                                slot.as_mut_ptr().cast::<u8>(),
                                n,
                            );
                        }
                        done += n;
                        if done == out.len() {
                            break;
                        }
                    }
                    Err(e) => {
                        broke = Some(e);
                        break;
                    }
                }
            }
            if done == out.len() {
                break;
            }
            // The body broke off (or ended short): ask again from `done`.
            resumes += 1;
            if resumes > retry.max_retries || began.elapsed() > retry.retry_timeout {
                let message = match broke {
                    Some(e) => format!(
                        "the body broke off {resumes} times in {:.1} s (the last at byte {}; \
                         max_retries {}, retry_timeout {} s): {e}",
                        began.elapsed().as_secs_f64(),
                        start + done as u64,
                        retry.max_retries,
                        retry.retry_timeout.as_secs_f64(),
                    ),
                    None => format!("the body ended short at byte {}", start + done as u64),
                };
                return Err(RemoteError::Failed {
                    url: self.url.url.clone(),
                    message,
                });
            }
            if broke.is_none() {
                // A clean short end is a failed attempt the client did not
                // see as one: count it here.
                super::store::Stats::add(&super::store::stats().retries, 1);
            }
            tokio::time::sleep(backoff(u32::try_from(resumes).unwrap_or(u32::MAX))).await;
        }
        Ok(Served::All)
    }
}

/// What a part's requests gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// Every byte asked for.
    All,
    /// Nothing: the server answered the range with the whole object.
    RangesRefused,
}

/// Whether `e` is a store's refusal of a range: the whole object (200) in
/// answer to a ranged GET. The HTTP store says `NotSupported`; the cloud
/// stores' shared client "non-partial response".
fn is_whole_answer(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotSupported { .. })
        || super::store_message(e).contains("non-partial response when range requested")
}

/// The stores (by [`ObjectUrl::store`]) that answered a ranged GET with the
/// whole object, in this process. A forked child keeps its parent's: they
/// are facts about servers, not about the process. The lock is held for a
/// lookup or an insert only.
fn refused() -> &'static Mutex<HashSet<String>> {
    static REFUSED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    REFUSED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Whether `store` is known to refuse ranges.
fn ranges_refused(store: &str) -> bool {
    refused()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .contains(store)
}

/// Remembers that `store` refuses ranges.
fn refuse_ranges(store: &str) {
    refused()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(store.to_string());
}

/// Runs `attempt` again (after a backoff) while it fails with
/// [`RemoteError::Interrupted`], up to [`MAX_RESUMES`] times: a listing
/// whose response body broke off, which `object_store` does not retry
/// itself. Anything else fails at once (`object_store` has already retried
/// what it retries).
async fn again<T, F, Fut>(mut attempt: F) -> Result<T, RemoteError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RemoteError>>,
{
    let mut n = 0;
    loop {
        match attempt().await {
            Err(RemoteError::Interrupted { .. }) if n < MAX_RESUMES => {
                n += 1;
                tokio::time::sleep(backoff(n)).await;
            }
            other => return other,
        }
    }
}

/// The wait before resume `n` (from 1): 50 ms, doubling up to 3.2 s.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(50 << (n.clamp(1, 7) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(7), Duration::from_millis(3200));
        assert_eq!(backoff(30), Duration::from_millis(3200));
    }
}
