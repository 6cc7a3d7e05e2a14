//! A source's remote shards: fetched when a reader asks for one, and the
//! next ones in the plan's order fetched ahead within a byte budget.
//!
//! The reader of a sharded source reads its windows in order, on one thread,
//! and each window's pieces in order; the shards it will want, in order, are
//! known from the plan ([`RemoteShards::prefetch`]). So this keeps:
//!
//! - the shards being read, and the last two read (a window may end inside
//!   a shard and the next one go on with it; at the end of an epoch the next
//!   epoch's first window is read on a thread of its own);
//! - the next shards of the queue, fetched ahead while their bytes add up to
//!   at most `prefetch_bytes` (and always the next one, whatever its size, if
//!   `prefetch_bytes` is not 0).
//!
//! A shard the reader moved past is dropped from memory (a cache directory
//! keeps it on disk). Fetches share one pool of `concurrency` requests, handed
//! out first come, first served, so the shard wanted first arrives first.
//!
//! # Cancellation
//!
//! Each fetch is a task on the process's runtime, and the [`RemoteShards`]
//! that started it owns it: the tasks hold the shared state, never the
//! `RemoteShards` itself, so dropping the last handle to it (the Python
//! source that read it, gone) aborts every fetch still on its way and waits
//! for their tasks to end (they end at their next await point: a fetch never
//! blocks a runtime thread). No fetch outlives its `RemoteShards`, so a
//! source's read-ahead never keeps fetching, holding memory and requests,
//! for a source that is gone.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;

use super::cache::Cache;
use super::fetch::Object;
use object_store::RetryConfig;

use super::store::{client, retry_config, runtime, stats, Stats, StorageOptions};
use super::RemoteError;

/// Shards kept after `get` returned them (see `State::recent`).
const RECENT: usize = 2;

/// The longest that dropping a [`RemoteShards`] waits for its aborted
/// fetches' tasks to end: a hang guard (an aborted task ends at its next
/// await point, at once).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How a source reaches its remote shards.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Options of the store (`storage_options=`), sorted by key.
    pub storage: StorageOptions,
    /// Bytes of shards fetched ahead of the one being read.
    pub prefetch_bytes: u64,
    /// Bytes of one ranged GET.
    pub part_size: u64,
    /// Requests in flight at once, for all of the source's fetches.
    pub concurrency: usize,
    /// The cache directory and its size limit in bytes.
    pub cache: Option<(PathBuf, u64)>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            storage: Vec::new(),
            prefetch_bytes: 512 << 20,
            part_size: 8 << 20,
            concurrency: 8,
            cache: None,
        }
    }
}

/// The state of one shard's bytes.
enum Slot {
    Fetching,
    Ready(Bytes),
    Failed(Arc<RemoteError>),
}

/// What [`RemoteShards`] holds, behind its lock.
struct State {
    /// The process this state belongs to: a forked child starts afresh (the
    /// parent's fetches run on threads the child does not have).
    pid: u32,
    slots: HashMap<usize, Slot>,
    /// The shards the reader will ask for, in order, after the current one.
    queue: VecDeque<usize>,
    /// Readers waiting in [`RemoteShards::get`], by shard.
    waiting: HashMap<usize, u32>,
    /// The last [`RECENT`] shards `get` returned, the latest first: a window
    /// may end inside a shard and the next one go on with it, and at the end
    /// of an epoch the next epoch's first window is read on a thread of its
    /// own while this epoch's last one may still be read.
    recent: VecDeque<usize>,
    /// The requests semaphore of this process.
    requests: Arc<tokio::sync::Semaphore>,
    /// The fetch tasks started in this process and not seen finished: all
    /// aborted when the [`RemoteShards`] is dropped.
    fetches: Vec<tokio::task::JoinHandle<()>>,
}

impl State {
    /// The state of a process that has fetched nothing yet.
    fn new(concurrency: usize) -> Self {
        Self {
            pid: std::process::id(),
            slots: HashMap::new(),
            queue: VecDeque::new(),
            waiting: HashMap::new(),
            recent: VecDeque::new(),
            requests: Arc::new(tokio::sync::Semaphore::new(concurrency.max(1))),
            fetches: Vec::new(),
        }
    }
}

/// The remote shards of a source, by index.
///
/// Dropping it aborts the fetches it started (see the module's
/// "Cancellation").
pub struct RemoteShards {
    shared: Arc<Shared>,
}

/// What a [`RemoteShards`] shares with its fetch tasks.
struct Shared {
    objects: Vec<Object>,
    options: RemoteOptions,
    /// The retry limits of the storage options, for resuming broken bodies.
    retry: RetryConfig,
    cache: Option<Cache>,
    state: Mutex<State>,
    ready: Condvar,
}

impl RemoteShards {
    /// The shards `objects` (as listed), reached with `options`.
    ///
    /// # Errors
    ///
    /// [`RemoteError::Cache`] when the cache directory cannot be made.
    pub fn new(objects: Vec<Object>, options: RemoteOptions) -> Result<Arc<Self>, RemoteError> {
        let first = objects.first().map_or("", |o| o.url.url.as_str());
        let retry = retry_config(first, &options.storage)?;
        let cache = match &options.cache {
            Some((dir, limit)) => Some(Cache::open(dir, *limit)?),
            None => None,
        };
        let state = State::new(options.concurrency);
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                objects,
                options,
                retry,
                cache,
                state: Mutex::new(state),
                ready: Condvar::new(),
            }),
        }))
    }

    /// The shards.
    pub fn objects(&self) -> &[Object] {
        &self.shared.objects
    }

    /// The options it was made with.
    pub fn options(&self) -> &RemoteOptions {
        &self.shared.options
    }

    /// Sets the shards the reader will ask for next, in order (`append`:
    /// after those already queued), and starts fetching ahead.
    ///
    /// # Errors
    ///
    /// The OS error of starting this process's runtime, or a client that
    /// cannot be made (a bad storage option).
    pub fn prefetch(&self, order: &[usize], append: bool) -> Result<(), RemoteError> {
        self.shared.prefetch(order, append)
    }

    /// The bytes of shard `shard`, for the reader: fetched now if they are
    /// not already here or on their way. Blocks until they are.
    ///
    /// # Errors
    ///
    /// The fetch's error (the same for every reader that waited on it).
    pub fn get(&self, shard: usize) -> Result<Bytes, Arc<RemoteError>> {
        self.shared.get(shard)
    }

    /// The bytes of shard `shard` now, outside the reader's order (for
    /// counting), through the cache. While the shards held add up to at most
    /// `prefetch_bytes`, the bytes are also kept for the reader, so a first
    /// epoch without a cache does not fetch again what counting fetched (the
    /// reader's first `prefetch` drops what its order does not want).
    ///
    /// # Errors
    ///
    /// The fetch's error.
    pub fn fetch_now(&self, shard: usize) -> Result<Bytes, RemoteError> {
        self.shared.fetch_now(shard)
    }

    /// The last `n` bytes of shard `shard` (a Parquet footer), by one ranged
    /// GET, with the shard's size.
    ///
    /// # Errors
    ///
    /// The fetch's error.
    pub fn tail(&self, shard: usize, n: u64) -> Result<(Bytes, u64), RemoteError> {
        self.shared.tail(shard, n)
    }

    /// The byte ranges `ranges` (`(shard, range)` each) fetched now, all at
    /// once: what a source with a sample index reads of a window, its
    /// samples' bytes and nothing else (no whole shard is fetched or kept).
    /// A range of a shard the cache directory holds is sliced from it; the
    /// others are ranged GETs of the shard's listed version (`If-Match` its
    /// `ETag`), under the source's request limit.
    ///
    /// # Errors
    ///
    /// Each range's own: a shard replaced since it was listed is
    /// [`RemoteError::Changed`].
    pub fn fetch_ranges(
        &self,
        ranges: &[(usize, std::ops::Range<u64>)],
    ) -> Vec<Result<Bytes, RemoteError>> {
        self.shared.fetch_ranges(ranges)
    }
}

impl Drop for RemoteShards {
    /// Aborts the fetches still on their way and waits (at most
    /// `CANCEL_GRACE`, 5 s) for their tasks to end. In a forked child the
    /// tasks are the parent's, on threads that do not exist here: they are
    /// forgotten, not touched.
    fn drop(&mut self) {
        let fetches = {
            let mut state = self
                .shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let fetches = std::mem::take(&mut state.fetches);
            if state.pid != std::process::id() {
                std::mem::forget(fetches);
                return;
            }
            fetches
        };
        for f in &fetches {
            f.abort();
        }
        // On a thread of the runtime (never the case from Python) the wait
        // could be for the very thread doing it: only abort.
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let deadline = Instant::now() + CANCEL_GRACE;
        while fetches.iter().any(|f| !f.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // An aborted fetch's cache write goes on on the blocking pool: it ends
        // with its file renamed into place, not cut off half-written.
        if let Some(cache) = &self.shared.cache {
            cache.settle(deadline);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.pid != std::process::id() {
            // A forked child: the parent's fetches run on threads the child
            // does not have; their handles are forgotten, not dropped.
            let inherited = std::mem::replace(&mut *state, State::new(self.options.concurrency));
            std::mem::forget(inherited.fetches);
        }
        state
    }

    /// See [`RemoteShards::prefetch`].
    fn prefetch(self: &Arc<Self>, order: &[usize], append: bool) -> Result<(), RemoteError> {
        let mut state = self.lock();
        if !append {
            state.queue.clear();
        }
        for &s in order {
            if s < self.objects.len() && state.queue.back() != Some(&s) {
                state.queue.push_back(s);
            }
        }
        Self::release(&mut state);
        self.top_up(&mut state)
    }

    /// See [`RemoteShards::get`].
    fn get(self: &Arc<Self>, shard: usize) -> Result<Bytes, Arc<RemoteError>> {
        let mut state = self.lock();
        advance(&mut state.queue, shard);
        *state.waiting.entry(shard).or_insert(0) += 1;
        Self::release(&mut state);
        let waited = Instant::now();
        let (mut state, result) = self.wait_for(state, shard);
        if let Some(n) = state.waiting.get_mut(&shard) {
            *n -= 1;
            if *n == 0 {
                state.waiting.remove(&shard);
            }
        }
        state.recent.retain(|&s| s != shard);
        state.recent.push_front(shard);
        state.recent.truncate(RECENT);
        Self::release(&mut state);
        Stats::add(
            &stats().wait_ns,
            u64::try_from(waited.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
        result
    }

    /// Waits (releasing the lock meanwhile) until `shard`'s bytes are here,
    /// starting its fetch if it is not on its way, and the next ones.
    fn wait_for<'a>(
        self: &'a Arc<Self>,
        mut state: MutexGuard<'a, State>,
        shard: usize,
    ) -> (MutexGuard<'a, State>, Result<Bytes, Arc<RemoteError>>) {
        if !state.slots.contains_key(&shard) {
            if let Err(e) = self.start(&mut state, shard) {
                return (state, Err(Arc::new(e)));
            }
        }
        if let Err(e) = self.top_up(&mut state) {
            return (state, Err(Arc::new(e)));
        }
        loop {
            match state.slots.get(&shard) {
                Some(Slot::Ready(bytes)) => {
                    let bytes = bytes.clone();
                    return (state, Ok(bytes));
                }
                Some(Slot::Failed(e)) => {
                    let e = Arc::clone(e);
                    // Asked again (the next epoch), it is fetched again.
                    state.slots.remove(&shard);
                    return (state, Err(e));
                }
                Some(Slot::Fetching) => {
                    state = self
                        .ready
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                None => {
                    // Failed and removed by another reader of the same shard (two
                    // windows at an epoch's end): fetch it again for this one.
                    if let Err(e) = self.start(&mut state, shard) {
                        return (state, Err(Arc::new(e)));
                    }
                }
            }
        }
    }

    /// See [`RemoteShards::fetch_now`].
    fn fetch_now(&self, shard: usize) -> Result<Bytes, RemoteError> {
        let runtime = runtime(&self.objects[shard].url.url)?;
        let requests = Arc::clone(&self.lock().requests);
        let bytes = runtime.block_on(self.fetch(shard, &requests))?;
        let mut state = self.lock();
        let held: u64 = state
            .slots
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Ready(_)))
            .map(|(&s, _)| self.objects[s].size)
            .sum();
        if !state.slots.contains_key(&shard)
            && held + self.objects[shard].size <= self.options.prefetch_bytes
        {
            state.slots.insert(shard, Slot::Ready(bytes.clone()));
        }
        Ok(bytes)
    }

    /// See [`RemoteShards::fetch_ranges`].
    fn fetch_ranges(
        &self,
        ranges: &[(usize, std::ops::Range<u64>)],
    ) -> Vec<Result<Bytes, RemoteError>> {
        let Some(first) = ranges.first() else {
            return Vec::new();
        };
        let runtime = match runtime(&self.objects[first.0].url.url) {
            Ok(r) => r,
            Err(e) => {
                let e = Arc::new(e);
                return ranges
                    .iter()
                    .map(|_| {
                        Err(RemoteError::Failed {
                            url: e.url(),
                            message: e.to_string(),
                        })
                    })
                    .collect();
            }
        };
        let requests = Arc::clone(&self.lock().requests);
        let one = |shard: usize, range: std::ops::Range<u64>| {
            let requests = &requests;
            async move {
                let object = &self.objects[shard];
                if let Some(cache) = &self.cache {
                    if let Some(bytes) = cache.lookup(object)? {
                        Stats::add(&stats().cache_hits, 1);
                        let end = range.end.min(bytes.len() as u64) as usize;
                        let start = (range.start as usize).min(end);
                        return Ok(bytes.slice(start..end));
                    }
                }
                let store = client(&object.url, &self.options.storage)?;
                object
                    .get(
                        &*store,
                        range,
                        self.options.part_size,
                        requests,
                        &self.retry,
                    )
                    .await
            }
        };
        runtime.block_on(futures_util::future::join_all(
            ranges.iter().map(|(s, r)| one(*s, r.clone())),
        ))
    }

    /// See [`RemoteShards::tail`].
    fn tail(&self, shard: usize, n: u64) -> Result<(Bytes, u64), RemoteError> {
        let object = &self.objects[shard];
        let runtime = runtime(&object.url.url)?;
        if let Some(cache) = &self.cache {
            if let Some(bytes) = cache.lookup(object)? {
                Stats::add(&stats().cache_hits, 1);
                let from = (bytes.len() as u64).saturating_sub(n) as usize;
                return Ok((bytes.slice(from..), object.size));
            }
        }
        let store = client(&object.url, &self.options.storage)?;
        let requests = Arc::clone(&self.lock().requests);
        let from = object.size.saturating_sub(n);
        let bytes = runtime.block_on(object.get(
            &*store,
            from..object.size,
            self.options.part_size,
            &requests,
            &self.retry,
        ))?;
        Ok((bytes, object.size))
    }

    /// Drops the bytes of shards no reader waits for, returned lately or
    /// queued.
    fn release(state: &mut State) {
        let State {
            slots,
            queue,
            waiting,
            recent,
            ..
        } = state;
        slots.retain(|s, slot| {
            matches!(slot, Slot::Fetching)
                || waiting.contains_key(s)
                || recent.contains(s)
                || queue.contains(s)
        });
    }

    /// Starts fetching queued shards while the bytes ahead fit the budget.
    fn top_up(self: &Arc<Self>, state: &mut State) -> Result<(), RemoteError> {
        let held: Vec<usize> = state
            .recent
            .iter()
            .chain(state.waiting.keys())
            .copied()
            .collect();
        let wanted = ahead(
            &state.queue,
            &held,
            |s| self.objects[s].size,
            self.options.prefetch_bytes,
        );
        for s in wanted {
            if !state.slots.contains_key(&s) {
                self.start(state, s)?;
            }
        }
        Ok(())
    }

    /// Starts fetching `shard` on the runtime; its slot is `Fetching` until
    /// the fetch ends. The task is kept in `state.fetches` (those seen
    /// finished are let go), for [`RemoteShards`]' drop to abort.
    fn start(self: &Arc<Self>, state: &mut State, shard: usize) -> Result<(), RemoteError> {
        let runtime = runtime(&self.objects[shard].url.url)?;
        state.slots.insert(shard, Slot::Fetching);
        let this = Arc::clone(self);
        let requests = Arc::clone(&state.requests);
        let pid = state.pid;
        let task = runtime.spawn(async move {
            // A panic in the fetch must still end the slot, or readers would wait
            // for it forever.
            let result = AssertUnwindSafe(this.fetch(shard, &requests))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(RemoteError::Failed {
                        url: this.objects[shard].url.url.clone(),
                        message: format!("the fetch panicked: {}", crate::panic::message(&*panic)),
                    })
                });
            let mut state = this.lock();
            if state.pid == pid && matches!(state.slots.get(&shard), Some(Slot::Fetching)) {
                let slot = match result {
                    Ok(bytes) => Slot::Ready(bytes),
                    Err(e) => Slot::Failed(Arc::new(e)),
                };
                state.slots.insert(shard, slot);
                // Dropped at once if the reader has moved past it meanwhile.
                Self::release(&mut state);
            }
            drop(state);
            this.ready.notify_all();
        });
        state.fetches.retain(|f| !f.is_finished());
        state.fetches.push(task);
        Ok(())
    }

    /// Fetches `shard` whole: from the cache if it holds it, else from its
    /// store (into the cache, if any).
    async fn fetch(
        &self,
        shard: usize,
        requests: &tokio::sync::Semaphore,
    ) -> Result<Bytes, RemoteError> {
        let object = &self.objects[shard];
        let store = client(&object.url, &self.options.storage)?;
        let get = || async {
            let bytes = object
                .get(
                    &*store,
                    0..object.size,
                    self.options.part_size,
                    requests,
                    &self.retry,
                )
                .await?;
            Stats::add(&stats().fetched, 1);
            Ok(bytes)
        };
        match &self.cache {
            Some(cache) => {
                let (bytes, fetched) = cache.get_or_fetch(object, get).await?;
                if !fetched {
                    Stats::add(&stats().cache_hits, 1);
                }
                Ok(bytes)
            }
            None => get().await,
        }
    }
}

/// The reader is at `shard`: the queue up to its first occurrence (what the
/// reader went past, and `shard` itself) is done with.
fn advance(queue: &mut VecDeque<usize>, shard: usize) {
    if let Some(at) = queue.iter().position(|&s| s == shard) {
        queue.drain(..=at);
    }
}

/// The shards of `queue` to hold ahead of the reader: from the front, while
/// their sizes add up to at most `budget`, and always the first one (a shard
/// larger than the budget is still fetched ahead) unless `budget` is 0. The
/// shards held anyway (`held`: being read, or read lately) are not counted.
fn ahead(
    queue: &VecDeque<usize>,
    held: &[usize],
    size: impl Fn(usize) -> u64,
    budget: u64,
) -> Vec<usize> {
    let mut out = Vec::new();
    if budget == 0 {
        return out;
    }
    let mut bytes = 0u64;
    for &s in queue {
        if held.contains(&s) || out.contains(&s) {
            continue;
        }
        let n = size(s);
        if !out.is_empty() && bytes.saturating_add(n) > budget {
            break;
        }
        bytes = bytes.saturating_add(n);
        out.push(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::ObjectUrl;
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A server on localhost that takes connections and never answers:
    /// requests to it stay on their way. Returns its address and the count
    /// of requests it has read the start of.
    fn silent_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let asked = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&asked);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let seen = Arc::clone(&seen);
                // Each connection read (and held, never answered) on a
                // thread of its own, for the life of the test process.
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    if matches!(conn.read(&mut buf), Ok(n) if n > 0) {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = conn.read(&mut buf);
                    std::thread::park();
                });
            }
        });
        (addr, asked)
    }

    #[test]
    fn dropping_remote_shards_ends_the_fetches_it_started() {
        let (addr, asked) = silent_server();
        let objects: Vec<Object> = (0..3)
            .map(|i| Object {
                url: ObjectUrl::parse(&format!("http://{addr}/s{i}.tar")).unwrap(),
                size: 1000,
                etag: None,
            })
            .collect();
        let shards = RemoteShards::new(objects, RemoteOptions::default()).unwrap();
        shards.prefetch(&[0, 1, 2], false).unwrap();
        // The fetches are on their way: their requests reached the server.
        let deadline = Instant::now() + Duration::from_secs(30);
        while asked.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3, "the fetches did not start");
        let fetches: Vec<_> = {
            let state = shards.shared.lock();
            assert!(state.slots.values().all(|s| matches!(s, Slot::Fetching)));
            state
                .fetches
                .iter()
                .map(tokio::task::JoinHandle::abort_handle)
                .collect()
        };
        assert_eq!(fetches.len(), 3);
        assert!(fetches.iter().all(|f| !f.is_finished()));
        let shared = Arc::downgrade(&shards.shared);
        drop(shards);
        // Every fetch task has ended, and none holds the shards' state.
        assert!(fetches.iter().all(tokio::task::AbortHandle::is_finished));
        assert!(
            shared.upgrade().is_none(),
            "a fetch outlived its RemoteShards"
        );
    }

    fn q(items: &[usize]) -> VecDeque<usize> {
        items.iter().copied().collect()
    }

    #[test]
    fn fetches_ahead_within_the_budget() {
        let size = |s: usize| [10, 20, 30, 40][s];
        let queue = q(&[1, 2, 3]);
        assert_eq!(ahead(&queue, &[0], size, 50), vec![1, 2]);
        assert_eq!(ahead(&queue, &[0], size, 49), vec![1]);
        // Always the next shard, even larger than the budget; never with 0.
        assert_eq!(ahead(&queue, &[0], size, 5), vec![1]);
        assert!(ahead(&queue, &[0], size, 0).is_empty());
        // A shard held at the front (a window going on with it) is not counted.
        assert_eq!(ahead(&q(&[0, 3, 1]), &[0], size, 40), vec![3]);
        assert_eq!(ahead(&q(&[0, 3, 1]), &[2, 0], size, 60), vec![3, 1]);
        // A shard queued twice (the next epoch's first window) is held once.
        assert_eq!(ahead(&q(&[1, 2, 1]), &[], size, 100), vec![1, 2]);
    }

    #[test]
    fn advancing_drops_what_the_reader_went_past() {
        let mut queue = q(&[1, 2, 3, 2]);
        advance(&mut queue, 2);
        assert_eq!(queue, q(&[3, 2]));
        // A shard not queued (asked for outside the plan) leaves the queue as it is.
        advance(&mut queue, 9);
        assert_eq!(queue, q(&[3, 2]));
        advance(&mut queue, 2);
        assert!(queue.is_empty());
    }
}
