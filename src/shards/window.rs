//! [`Window`]: the samples of one window of a sharded source, read, by
//! global id.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::marks::Marks;
use super::{Sample, Shard, ShardError, ShardFormat, WholeRead};

/// A sample of a window, or the error that kept it from being read. Behind a
/// lock of its own: the native chain takes its image bytes out (a move, not a
/// copy), while Python transforms only read it.
pub type Entry = Mutex<Result<Sample, Arc<ShardError>>>;

/// One piece of a window: samples of a shard from global id `first`.
pub(super) struct Span {
    first: u64,
    shard: usize,
    samples: Vec<Entry>,
}

/// The samples of one window, by global id: what a window's batches take
/// their samples from.
pub struct Window {
    paths: Arc<Vec<PathBuf>>,
    spans: Vec<Span>,
}

impl Window {
    pub(super) fn new(paths: Arc<Vec<PathBuf>>, spans: Vec<Span>) -> Self {
        Self { paths, spans }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.spans.iter().map(|s| s.samples.len()).sum()
    }

    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The path (or URL) of the shard that sample `id` comes from, and its
    /// entry; `None` when the window does not hold it.
    pub fn entry(&self, id: u64) -> Option<(&Path, &Entry)> {
        self.spans.iter().find_map(|span| {
            let i = usize::try_from(id.checked_sub(span.first)?).ok()?;
            let entry = span.samples.get(i)?;
            Some((self.paths[span.shard].as_path(), entry))
        })
    }
}

/// Locks a window's entry (a panic elsewhere cannot leave one half-written:
/// its lock is only held to read it or to take bytes out).
pub fn lock_entry(entry: &Entry) -> MutexGuard<'_, Result<Sample, Arc<ShardError>>> {
    entry.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads the piece `(shard, lo, hi)` of the shard at `path` from `data`,
/// whose sample `base` is the shard's sample 0 (a whole shard: 0; a piece
/// fetched by its offsets: `lo`), with `whole` if given (a whole shard's
/// marks, and the fields to locate: [`WholeRead`]); its first sample has
/// global id `first`.
pub(super) fn read_piece(
    format: &dyn ShardFormat,
    path: &Path,
    (shard, lo, hi): (usize, u64, u64),
    first: u64,
    (data, base): (Result<Shard, ShardError>, u64),
    whole: Option<(&Marks, &[String])>,
) -> Span {
    let n = usize::try_from(hi - lo).expect("a piece fits in memory");
    let mut samples: Vec<Option<Result<Sample, Arc<ShardError>>>> = Vec::with_capacity(n);
    samples.resize_with(n, || None);
    let result = data.and_then(|data| {
        let each: super::Each<'_> = &mut |k, sample| {
            if let Some(slot) = (k + base)
                .checked_sub(lo)
                .and_then(|i| samples.get_mut(usize::try_from(i).ok()?))
            {
                *slot = Some(sample.map_err(Arc::new));
            }
        };
        match whole {
            Some((marks, located)) => {
                let read = WholeRead {
                    lo: lo - base,
                    hi: hi - base,
                    marks,
                    located,
                };
                format.read_whole(&data, &read, each)
            }
            None => format.read(&data, lo - base, hi - base, each),
        }
    });
    // What the reader did not deliver is lost with the error that ended it
    // (the rest of the shard), or, should a reader stop short without one,
    // with an error that says the shard changed.
    let lost = match result {
        Err(e) => Arc::new(e),
        Ok(()) => Arc::new(ShardError::Changed {
            shard: path.to_path_buf(),
            expected: hi,
            found: lo + samples.iter().filter(|s| s.is_some()).count() as u64,
        }),
    };
    Span {
        first,
        shard,
        samples: samples
            .into_iter()
            .map(|s| Mutex::new(s.unwrap_or_else(|| Err(Arc::clone(&lost)))))
            .collect(),
    }
}
