//! [`WindowFeed`]: a sharded source's windows read ahead of its batches, in
//! the order of its plan.
//!
//! An epoch ([`WindowFeed::epoch`], [`EpochWindows`]) yields the plan's
//! batches, each with the window holding its samples. Window `w + 1` is read
//! while window `w`'s batches are loaded, and once the last window is
//! reached, the next epoch's first window is read ahead too (kept by the
//! feed and taken by the next epoch), so that an epoch's first batch does
//! not wait for a whole window. Reads run on the process's runtime's
//! blocking pool ([`crate::runtime`]): a read blocks on files and on
//! fetches. For remote shards fetched whole, the feed tells the prefetcher
//! ([`RemoteShards::prefetch`](crate::remote::RemoteShards::prefetch)) the
//! shards of the plan's windows in the order the epoch reads them, and the
//! next epoch's once it is planned; a source with a sample index fetches
//! each window's byte ranges when the window is read instead. A window is
//! freed once no batch holds it; reads no longer wanted (the epoch dropped
//! early) are cancelled if they have not started.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::task::JoinHandle;

use super::error::{FeedError, ShardSetError};
use super::set::ShardSet;
use super::window::Window;
use crate::plan::{Piece, Plan, ShardPlan};

/// A window being read, or read.
enum Read {
    /// On the runtime's blocking pool: its result comes through `rx`.
    Pending {
        rx: Receiver<Result<Result<Window, ShardSetError>, String>>,
        task: JoinHandle<()>,
    },
    /// Read.
    Done(Arc<Window>),
}

impl Read {
    /// Starts reading `pieces` of `set`, whose first samples have the global
    /// ids `first_ids`, leaving the fields `located` in local tar shards'
    /// files ([`ShardSet::read_locating`]).
    fn start(
        set: &Arc<ShardSet>,
        pieces: Vec<Piece>,
        first_ids: Vec<u64>,
        located: &Arc<[String]>,
    ) -> Result<Self, FeedError> {
        let rt = crate::runtime::current().map_err(FeedError::Runtime)?;
        let (tx, rx) = sync_channel(1);
        let set = Arc::clone(set);
        let located = Arc::clone(located);
        let task = rt.spawn_blocking(move || {
            let read = catch_unwind(AssertUnwindSafe(|| {
                set.read_locating(&pieces, &first_ids, &located)
            }));
            // The receiver is gone when the read is no longer wanted.
            let _ = tx.send(read.map_err(|p| crate::panic::message(&*p)));
        });
        Ok(Self::Pending { rx, task })
    }

    /// The window, once read (blocking until it is).
    fn wait(&mut self) -> Result<Arc<Window>, FeedError> {
        if let Self::Pending { rx, .. } = self {
            let window = match rx.recv() {
                Ok(Ok(read)) => Arc::new(read?),
                Ok(Err(panic)) => return Err(FeedError::Panicked(panic)),
                // The task ended without a word: cancelled before it started.
                Err(_) => return Err(FeedError::Cancelled),
            };
            *self = Self::Done(Arc::clone(&window));
        }
        match self {
            Self::Done(window) => Ok(Arc::clone(window)),
            Self::Pending { .. } => unreachable!("a pending read was waited for above"),
        }
    }

    /// Cancels the read if it has not started (a started one runs to its
    /// end, its result dropped).
    fn cancel(&self) {
        if let Self::Pending { task, .. } = self {
            task.abort();
        }
    }
}

/// A window read ahead for a later epoch: its pieces, and the read.
type Ahead = (Vec<Piece>, Read);

/// The feed's read-ahead, with the process it was started in.
struct Slot {
    pid: u32,
    ahead: Option<Ahead>,
}

/// A sharded source's windows, read ahead of its batches (see the [module
/// docs](self)). One per loader over the source: it keeps the next epoch's
/// first window between epochs.
pub struct WindowFeed {
    set: Arc<ShardSet>,
    /// The fields whose bytes reads leave in local tar shards' files.
    located: Arc<[String]>,
    ahead: Mutex<Slot>,
    /// Window reads started, for tests and stats.
    reads: AtomicU64,
}

impl WindowFeed {
    /// A feed of `set`'s windows.
    pub fn new(set: Arc<ShardSet>) -> Self {
        Self::locating(set, Vec::new())
    }

    /// A feed of `set`'s windows whose reads leave the bytes of the fields
    /// `located` where they are in local plain tar shards
    /// ([`super::Value::Located`]): the native image chain's image fields,
    /// which its decode threads then read.
    pub fn locating(set: Arc<ShardSet>, located: Vec<String>) -> Self {
        Self {
            set,
            located: located.into(),
            ahead: Mutex::new(Slot {
                pid: std::process::id(),
                ahead: None,
            }),
            reads: AtomicU64::new(0),
        }
    }

    /// Window reads started so far (each window once, however many of its
    /// batches there are; the next epoch's first once, read ahead).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The pieces of the window read ahead for the next epoch, until an
    /// epoch takes it.
    pub fn ahead(&self) -> Option<Vec<Piece>> {
        self.ahead_slot()
            .ahead
            .as_ref()
            .map(|(pieces, _)| pieces.clone())
    }

    /// The slot of the window read ahead (a panic elsewhere cannot leave it
    /// half-written: it is only ever replaced or taken whole). In a forked
    /// child, a read the parent started is forgotten, never waited for: it
    /// runs on the parent's runtime, whose threads are not in the child, so
    /// its result would never come (the runtime's fork rule, `PerProcess`).
    fn ahead_slot(&self) -> MutexGuard<'_, Slot> {
        let mut slot = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        let pid = std::process::id();
        if slot.pid != pid {
            if let Some(parents) = slot.ahead.take() {
                std::mem::forget(parents);
            }
            slot.pid = pid;
        }
        slot
    }

    /// Starts reading `pieces`, whose first samples have the global ids
    /// `first_ids`.
    fn start(&self, pieces: Vec<Piece>, first_ids: Vec<u64>) -> Result<Read, FeedError> {
        let read = Read::start(&self.set, pieces, first_ids, &self.located)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(read)
    }

    /// The shards it reads.
    pub fn set(&self) -> &Arc<ShardSet> {
        &self.set
    }

    /// `plan`'s batches from its start, each with its window. With
    /// `read_ahead`, the next epoch's first window is read once the last
    /// window is reached (a pass over a part of a mixture says no: the
    /// mixture plans the part's next pass).
    ///
    /// # Errors
    ///
    /// [`FeedError::Plan`] when the plan's shards are not the set's, and
    /// [`FeedError::Remote`] when the remote shards cannot be fetched ahead.
    pub fn epoch(
        self: &Arc<Self>,
        plan: ShardPlan,
        read_ahead: bool,
    ) -> Result<EpochWindows, FeedError> {
        let counts = &plan.config().counts;
        let shards = self.set.paths().len();
        if counts.len() != shards {
            return Err(FeedError::Plan {
                counts: counts.len(),
                shards,
            });
        }
        let firsts = counts
            .iter()
            .scan(0u64, |at, &n| {
                let first = *at;
                *at += n;
                Some(first)
            })
            .collect();
        let ahead = self.ahead_slot().ahead.take();
        let epoch = EpochWindows {
            feed: Arc::clone(self),
            next: plan.start(),
            plan,
            firsts,
            reads: BTreeMap::new(),
            ahead,
            read_ahead,
            read_next: false,
        };
        if let Some(remote) = epoch.fetched_whole() {
            if epoch.plan.batches() > epoch.plan.start() {
                // The shards this rank reads, in order, fetched ahead within the
                // budget (from the window after the one read ahead at the end of the
                // last epoch, if it was).
                let mut first = epoch.plan.window_of(epoch.plan.start());
                if epoch.ahead_is(first) {
                    first += 1;
                }
                remote.prefetch(&shards_of(&epoch.plan, first), false)?;
            }
        }
        Ok(epoch)
    }
}

/// The shards of `plan`'s windows from `first` on, in the order they are
/// read (a shard once per window it has a piece in).
fn shards_of(plan: &ShardPlan, first: u64) -> Vec<usize> {
    (first..plan.windows())
        .flat_map(|w| plan.window_pieces(w))
        .map(|p| p.shard)
        .collect()
}

/// One batch of an epoch: its number, its window, its samples' global ids,
/// and the window that holds them.
pub struct FedBatch {
    /// The batch's number in the epoch.
    pub batch_no: u64,
    /// Its window's number.
    pub window_no: u64,
    /// Its samples' global ids.
    pub ids: Vec<u64>,
    /// The window holding them.
    pub window: Arc<Window>,
}

/// One epoch of a [`WindowFeed`]: an iterator of [`FedBatch`]es (see
/// [`WindowFeed::epoch`]). Blocks while a batch's window is read.
pub struct EpochWindows {
    feed: Arc<WindowFeed>,
    plan: ShardPlan,
    /// Each shard's first global id.
    firsts: Vec<u64>,
    /// The next batch.
    next: u64,
    /// Windows read or being read, by number: the current one and the next.
    reads: BTreeMap<u64, Read>,
    /// The window the last epoch read ahead, until it is taken.
    ahead: Option<Ahead>,
    read_ahead: bool,
    /// Whether the next epoch's first window was read ahead.
    read_next: bool,
}

impl EpochWindows {
    /// The plan.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// The remote fetcher, when shards are fetched whole ahead of the
    /// reader (remote, without an index).
    fn fetched_whole(&self) -> Option<Arc<crate::remote::RemoteShards>> {
        let set = &self.feed.set;
        set.remote().filter(|_| !set.ranged()).cloned()
    }

    /// Whether the window read ahead by the last epoch is window `w` of
    /// this one.
    fn ahead_is(&self, w: u64) -> bool {
        self.ahead
            .as_ref()
            .is_some_and(|(pieces, _)| *pieces == self.plan.window_pieces(w))
    }

    fn first_ids(&self, pieces: &[Piece]) -> Vec<u64> {
        pieces.iter().map(|p| self.firsts[p.shard] + p.lo).collect()
    }

    /// Starts reading window `w` unless it is read, being read, or past
    /// the last.
    fn ensure(&mut self, w: u64) -> Result<(), FeedError> {
        if w >= self.plan.windows() || self.reads.contains_key(&w) {
            return Ok(());
        }
        let read = if self.ahead_is(w) {
            self.ahead.take().expect("checked above").1
        } else {
            let pieces = self.plan.window_pieces(w);
            let ids = self.first_ids(&pieces);
            self.feed.start(pieces, ids)?
        };
        self.reads.insert(w, read);
        Ok(())
    }

    /// Reads the next epoch's first window ahead, into the feed, and tells
    /// the prefetcher the next epoch's shards; nothing when the next epoch
    /// cannot be planned (it will say so itself).
    fn read_next_epoch(&mut self) -> Result<(), FeedError> {
        let plan = &self.plan;
        let Ok(following) = ShardPlan::new(plan.config(), plan.epoch() + 1, &[], 0) else {
            return Ok(());
        };
        if following.windows() == 0 {
            return Ok(());
        }
        if let Some(remote) = self.fetched_whole() {
            // The next epoch's shards, in its order, fetched ahead within the budget
            // while this epoch's last window is batched.
            remote.prefetch(&shards_of(&following, 0), true)?;
        }
        let pieces = following.window_pieces(0);
        let read = self.feed.start(pieces.clone(), self.first_ids(&pieces))?;
        let old = self.feed.ahead_slot().ahead.replace((pieces, read));
        if let Some((_, old)) = old {
            old.cancel();
        }
        Ok(())
    }

    fn next_batch(&mut self) -> Result<Option<FedBatch>, FeedError> {
        let j = self.next;
        if j >= self.plan.batches() {
            return Ok(None);
        }
        self.next += 1;
        let w = self.plan.window_of(j);
        self.ensure(w)?;
        self.ensure(w + 1)?;
        // Windows before this one are done with: freed once no batch holds them.
        while let Some(entry) = self.reads.first_entry() {
            if *entry.key() >= w {
                break;
            }
            entry.remove().cancel();
        }
        if self.read_ahead && !self.read_next && w + 1 == self.plan.windows() {
            self.read_next = true;
            self.read_next_epoch()?;
        }
        let window = self.reads.get_mut(&w).expect("ensured above").wait()?;
        Ok(Some(FedBatch {
            batch_no: j,
            window_no: w,
            ids: self.plan.batch(j),
            window,
        }))
    }
}

impl Iterator for EpochWindows {
    type Item = Result<FedBatch, FeedError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for EpochWindows {
    fn drop(&mut self) {
        // Reads no longer wanted are dropped; the next epoch's, held by the feed,
        // goes on.
        for read in self.reads.values() {
            read.cancel();
        }
        if let Some((_, read)) = &self.ahead {
            read.cancel();
        }
    }
}

#[cfg(test)]
mod tests;
