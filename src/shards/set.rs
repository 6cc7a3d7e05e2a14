//! [`ShardSet`]: a source's shards in one format, local or remote, counted
//! and read by windows.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::error::ShardSetError;
use super::index::SampleOffsets;
use super::kept::Kept;
use super::marks::Marks;
use super::parallel::in_parallel;
use super::window::{read_piece, Window};
use super::{Shard, ShardData, ShardError, ShardFormat, ShardInfo};
use crate::plan::Piece;
use crate::remote::{RemoteError, RemoteShards};

/// A source's shards: their format, where their bytes are (local files, or
/// objects fetched through a [`RemoteShards`]), and, for remote tar shards
/// with a sample index, each shard's sample offsets, so that a window
/// fetches its samples' byte ranges alone.
pub struct ShardSet {
    format: Arc<dyn ShardFormat>,
    paths: Arc<Vec<PathBuf>>,
    remote: Option<Arc<RemoteShards>>,
    offsets: Option<Vec<SampleOffsets>>,
    /// The pieces windows fetched by their offsets, kept for later windows
    /// within the remote's `prefetch_bytes` (see [`Kept`]).
    kept: Mutex<Kept>,
    /// Each shard's marks, found by counting it and by reading it: where a
    /// read of a whole shard starts (see [`Marks`]).
    marks: Vec<Marks>,
}

impl ShardSet {
    /// The shards `paths` (URLs when `remote` is given, one object each, in
    /// the same order) read as `format`; `offsets`, one entry per shard,
    /// from their index.
    ///
    /// # Errors
    ///
    /// [`ShardSetError`] when `remote` or `offsets` do not have one entry
    /// per path.
    pub fn new(
        format: Arc<dyn ShardFormat>,
        paths: Vec<PathBuf>,
        remote: Option<Arc<RemoteShards>>,
        offsets: Option<Vec<SampleOffsets>>,
    ) -> Result<Self, ShardSetError> {
        let shards = paths.len();
        if let Some(r) = &remote {
            if r.objects().len() != shards {
                return Err(ShardSetError::Remote {
                    objects: r.objects().len(),
                    shards,
                });
            }
        }
        if let Some(o) = &offsets {
            if o.len() != shards {
                return Err(ShardSetError::Offsets {
                    offsets: o.len(),
                    shards,
                });
            }
        }
        // An indexed source fetches nothing ahead but its next window: its budget of
        // fetched bytes keeps what earlier windows fetched instead.
        let kept = Kept::new(remote.as_ref().map_or(0, |r| r.options().prefetch_bytes));
        Ok(Self {
            format,
            paths: Arc::new(paths),
            remote,
            offsets,
            kept: Mutex::new(kept),
            marks: (0..shards).map(|_| Marks::new()).collect(),
        })
    }

    /// The shards' format.
    pub fn format(&self) -> &dyn ShardFormat {
        &*self.format
    }

    /// The shards' paths (or URLs), in order.
    pub fn paths(&self) -> &Arc<Vec<PathBuf>> {
        &self.paths
    }

    /// The remote shards' fetcher, when they are remote.
    pub fn remote(&self) -> Option<&Arc<RemoteShards>> {
        self.remote.as_ref()
    }

    /// Whether windows fetch their samples' byte ranges (remote, with an
    /// index), rather than whole shards fetched ahead in the plan's order.
    pub fn ranged(&self) -> bool {
        self.remote.is_some()
            && self
                .offsets
                .as_ref()
                .is_some_and(|o| o.iter().any(Option::is_some))
    }

    fn remote_error(&self, shard: usize, e: Arc<RemoteError>) -> ShardError {
        ShardError::Remote {
            shard: self.paths[shard].clone(),
            source: e,
        }
    }

    /// Shard `shard` as counting reads it: a local file; a remote one
    /// fetched whole (through the cache, if any), or only its tail when its
    /// format counts from the tail ([`ShardFormat::count_tail`]).
    ///
    /// # Errors
    ///
    /// [`ShardError::Remote`] when a fetch fails.
    pub fn for_count(&self, shard: usize) -> Result<Shard, ShardError> {
        let name = &self.paths[shard];
        let Some(remote) = &self.remote else {
            return Ok(Shard::file(name));
        };
        let fail = |e| self.remote_error(shard, Arc::new(e));
        if let Some(first) = self.format.count_tail(None) {
            let (mut tail, size) = remote.tail(shard, first).map_err(fail)?;
            if let Some(need) = self.format.count_tail(Some(&tail)) {
                if need > tail.len() as u64 && need <= size {
                    tail = remote.tail(shard, need).map_err(fail)?.0;
                }
            }
            return Ok(Shard::tail(name, tail, size));
        }
        let bytes = remote.fetch_now(shard).map_err(fail)?;
        Ok(Shard::memory(name, bytes))
    }

    /// `f` of every shard (its number, and the shard as counting reads it:
    /// [`Self::for_count`]), on up to `threads` threads; results in shard
    /// order.
    pub fn scan<R: Send>(
        &self,
        threads: usize,
        f: impl Fn(usize, &Shard) -> Result<R, ShardError> + Sync,
    ) -> Vec<Result<R, ShardError>> {
        in_parallel(self.paths.len(), threads.max(1), |i| {
            self.for_count(i).and_then(|shard| f(i, &shard))
        })
    }

    /// Every shard counted ([`ShardFormat::count_marked`]: a plain tar
    /// shard's marks are kept for its reads) on up to `threads` threads;
    /// results in shard order.
    pub fn count(&self, threads: usize) -> Vec<Result<ShardInfo, ShardError>> {
        self.scan(threads, |i, shard| {
            self.format.count_marked(shard, &self.marks[i])
        })
    }

    /// How many marks are known for shard `shard` (see [`Marks`]).
    pub fn marks(&self, shard: usize) -> usize {
        self.marks.get(shard).map_or(0, Marks::len)
    }

    /// Shard `shard` for reading: its file, or its bytes once fetched
    /// (blocking until they are).
    fn for_read(&self, shard: usize) -> Result<Shard, ShardError> {
        let name = &self.paths[shard];
        match &self.remote {
            None => Ok(Shard::file(name)),
            Some(remote) => match remote.get(shard) {
                Ok(bytes) => Ok(Shard::memory(name, bytes)),
                Err(e) => Err(self.remote_error(shard, e)),
            },
        }
    }

    /// The pieces' samples fetched by their offsets, each a shard of its own
    /// whose sample 0 is the piece's `lo` (`index::fetch_pieces`), or taken
    /// from the pieces earlier windows fetched ([`Kept`]); `None` for a
    /// piece that is read from its whole shard.
    fn fetch_pieces(&self, pieces: &[(usize, u64, u64)]) -> Vec<Option<Result<Shard, ShardError>>> {
        let mut out: Vec<Option<Result<Shard, ShardError>>> = pieces.iter().map(|_| None).collect();
        let (Some(offsets), Some(remote)) = (&self.offsets, &self.remote) else {
            return out;
        };
        let mut missing = Vec::new();
        {
            let mut kept = self.kept();
            for (i, &piece) in pieces.iter().enumerate() {
                match kept.get(offsets, piece) {
                    Some(bytes) => out[i] = Some(Ok(Shard::memory(&self.paths[piece.0], bytes))),
                    None => missing.push(i),
                }
            }
        }
        let wanted: Vec<(usize, u64, u64)> = missing.iter().map(|&i| pieces[i]).collect();
        let fetched = super::index::fetch_pieces(remote, offsets, &self.paths, &wanted);
        let mut kept = self.kept();
        for ((i, piece), got) in missing.into_iter().zip(wanted).zip(fetched) {
            if let Some(Ok(Shard {
                data: ShardData::Memory { bytes, .. },
                ..
            })) = &got
            {
                kept.keep(piece, bytes.clone());
            }
            out[i] = got;
        }
        out
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `(pieces served from the kept ones, bytes kept)` of an indexed remote
    /// source (see [`Kept`]).
    pub fn kept_stats(&self) -> (u64, u64) {
        let kept = self.kept();
        (kept.hits(), kept.held())
    }

    /// Reads `pieces` into a window, the first sample of each with the
    /// global id in `first_ids` (blocking: files are read, fetches waited
    /// for). The pieces are parsed side by side when their bytes are at hand
    /// (local files; remote pieces all fetched by their index offsets): on a
    /// machine of many cores, one thread parsing a window would feed fewer
    /// images a second than the decode threads take. Whole remote shards are
    /// taken in the plan's order (the prefetcher fetches ahead of the
    /// reader, on its own tasks). A sample that cannot be read is kept as
    /// its error, raised when it is asked for.
    ///
    /// # Errors
    ///
    /// [`ShardSetError::Piece`] for a piece outside the shards, and
    /// [`ShardSetError::FirstIds`] unless there is one first id per piece.
    pub fn read(&self, pieces: &[Piece], first_ids: &[u64]) -> Result<Window, ShardSetError> {
        self.read_locating(pieces, first_ids, &[])
    }

    /// [`Self::read`], leaving the bytes of the fields `located` where they
    /// are in local plain tar shards ([`super::Value::Located`]) in pieces
    /// of at least [`LOCATE_MIN`] samples: the native image chain names its
    /// image fields, whose bytes its decode threads then read, so that the
    /// one thread that reads a window of one piece only walks its headers.
    ///
    /// # Errors
    ///
    /// As [`Self::read`].
    pub fn read_locating(
        &self,
        pieces: &[Piece],
        first_ids: &[u64],
        located: &[String],
    ) -> Result<Window, ShardSetError> {
        if pieces.len() != first_ids.len() {
            return Err(ShardSetError::FirstIds {
                ids: first_ids.len(),
                pieces: pieces.len(),
            });
        }
        let shards = self.paths.len();
        let pieces: Vec<(usize, u64, u64)> = pieces.iter().map(|p| (p.shard, p.lo, p.hi)).collect();
        if let Some(&(shard, lo, hi)) = pieces.iter().find(|(s, lo, hi)| *s >= shards || lo > hi) {
            return Err(ShardSetError::Piece {
                shard,
                lo,
                hi,
                shards,
            });
        }
        let fetched = self.fetch_pieces(&pieces);
        let threads = if self.remote.is_some() && fetched.iter().any(Option::is_none) {
            1
        } else {
            piece_threads(pieces.len())
        };
        let fetched: Vec<Mutex<_>> = fetched.into_iter().map(Mutex::new).collect();
        let spans = in_parallel(pieces.len(), threads, |i| {
            let (shard, lo, hi) = pieces[i];
            // A fetched piece is a shard of its own, from its sample `lo`.
            let taken = fetched[i].lock().map(|mut f| f.take()).ok().flatten();
            // A whole shard is read from its marks; a long piece of it locates.
            let located = if hi - lo >= LOCATE_MIN { located } else { &[] };
            let (data, base, whole) = match taken {
                Some(data) => (data, lo, None),
                None => (self.for_read(shard), 0, Some((&self.marks[shard], located))),
            };
            read_piece(
                &*self.format,
                &self.paths[shard],
                (shard, lo, hi),
                first_ids[i],
                (data, base),
                whole,
            )
        });
        Ok(Window::new(Arc::clone(&self.paths), spans))
    }
}

/// The fewest samples of a piece whose fields are located
/// ([`ShardSet::read_locating`]). A piece's members left in its file keep the
/// file open (one descriptor per piece) until its last one is decoded; short
/// pieces (a window across many small shards) are read on a thread each
/// anyway, and reading them whole keeps the descriptors few.
pub const LOCATE_MIN: u64 = 64;

/// The threads a window's pieces are read on: one per piece, at most the
/// machine's cores and 8 (a piece is a file read or a fetch's wait plus
/// parsing; more threads than that only contend).
fn piece_threads(pieces: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    pieces.min(cores).min(8)
}
