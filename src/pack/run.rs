//! Running a pack: samples prepared on worker threads, written in input
//! order by the calling thread.
//!
//! Preparing a sample (reading its file, checking its image, re-encoding
//! it) is independent of every other, so `workers` threads take input
//! positions in turn; the [`Packer`] must see them in order, so the calling
//! thread takes each outcome as soon as every earlier one is in, and writes
//! it. Workers run at most [`AHEAD_PER_WORKER`] positions per worker ahead
//! of the writer, which bounds the memory held by prepared samples. Which
//! sample lands in which shard, and the bytes, never depend on the number
//! of workers: only the writer decides, in input order.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, PoisonError};

use super::sample::{prepare, Prepared, Sample, Value};
use super::writer::{Packer, Progress};
use super::PackError;

/// Positions a worker may be ahead of the writer.
pub const AHEAD_PER_WORKER: u64 = 4;

/// An image of an image folder.
#[derive(Debug, Clone)]
pub struct FileInput {
    /// The file to read.
    pub path: PathBuf,
    /// Its path as stored (relative to the folder: the Parquet `path`).
    pub stored: String,
    /// Its class.
    pub label: Option<i64>,
}

/// What [`ordered`]'s threads share.
struct Shared {
    state: Mutex<State>,
    /// A prepared sample came in.
    ready: Condvar,
    /// The writer took one (room for the workers).
    room: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State {
    next_claim: u64,
    consumed: u64,
    done: BTreeMap<u64, Result<Prepared, PackError>>,
    stop: bool,
}

/// Runs `produce(i)` for each `i` of `range` on `workers` threads and
/// `consume(i, outcome)` on the calling thread, in order. A panic in
/// `produce` is that position's error. Stops at the first error of
/// `consume`, and returns it once the workers are gone.
fn ordered(
    range: Range<u64>,
    workers: usize,
    produce: &(dyn Fn(u64) -> Result<Prepared, PackError> + Sync),
    consume: &mut dyn FnMut(u64, Result<Prepared, PackError>) -> Result<(), PackError>,
) -> Result<(), PackError> {
    let workers = workers.max(1);
    let ahead = AHEAD_PER_WORKER * workers as u64;
    let shared = Shared {
        state: Mutex::new(State {
            next_claim: range.start,
            consumed: range.start,
            done: BTreeMap::new(),
            stop: false,
        }),
        ready: Condvar::new(),
        room: Condvar::new(),
    };
    let end = range.end;
    std::thread::scope(|scope| {
        for w in 0..workers {
            let shared = &shared;
            std::thread::Builder::new()
                .name(format!("ferrofeed-pack-{w}"))
                .spawn_scoped(scope, move || loop {
                    let i = {
                        let mut st = shared.lock();
                        loop {
                            if st.stop || st.next_claim >= end {
                                return;
                            }
                            if st.next_claim < st.consumed + ahead {
                                break;
                            }
                            st = shared.room.wait(st).unwrap_or_else(PoisonError::into_inner);
                        }
                        st.next_claim += 1;
                        st.next_claim - 1
                    };
                    let outcome =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| produce(i)))
                            .unwrap_or_else(|payload| {
                                Err(PackError::Panic(format!(
                                    "preparing the sample at position {i} panicked: {}",
                                    crate::panic::message(&*payload)
                                )))
                            });
                    shared.lock().done.insert(i, outcome);
                    shared.ready.notify_one();
                })
                .expect("cannot start a pack worker thread");
        }
        let result = (|| {
            for i in range {
                let outcome = {
                    let mut st = shared.lock();
                    loop {
                        if let Some(o) = st.done.remove(&i) {
                            st.consumed = i + 1;
                            break o;
                        }
                        st = shared
                            .ready
                            .wait(st)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                };
                shared.room.notify_all();
                consume(i, outcome)?;
            }
            Ok(())
        })();
        shared.lock().stop = true;
        shared.room.notify_all();
        result
    })
}

/// How often, in samples, the progress callback is asked at least.
const REPORT_EVERY: u64 = 64;

/// Packs the image files `files` (positions are their indices), from where
/// `packer` resumes, on `workers` threads. `report` is called with the
/// progress now and then (and at the end); when it returns `false` the pack
/// stops with [`PackError::Stopped`].
///
/// # Errors
///
/// A file's [`PackError::BadSample`] (not skipped), naming its path; a
/// write's [`PackError::Dest`]; [`PackError::Stopped`].
pub fn pack_files(
    files: &[FileInput],
    packer: &mut Packer,
    workers: usize,
    report: &mut dyn FnMut(Progress) -> bool,
) -> Result<(), PackError> {
    if packer.complete().is_some() {
        return Ok(());
    }
    let reencode = packer.options().reencode;
    let produce = |i: u64| {
        // `i` is below `files.len()`: the range is the files'.
        let file = &files[i as usize];
        let shown = file.path.display().to_string();
        // Opened as a regular file only: a FIFO named like an image fails
        // at once instead of blocking the worker.
        let bytes = crate::image::batch::read_file(&file.path).map_err(|e| {
            let text = e.to_string();
            let reason = text
                .strip_prefix(&format!("{shown}: "))
                .unwrap_or(&text)
                .to_string();
            PackError::bad(shown.clone(), reason)
        })?;
        let mut fields = vec![("image".to_string(), Value::Bytes(bytes))];
        if let Some(label) = file.label {
            fields.push(("cls".to_string(), Value::Int(label)));
        }
        let sample = Sample {
            key: None,
            path: Some(file.stored.clone()),
            fields,
        };
        prepare(sample, i, reencode.as_ref()).map_err(|e| match e {
            PackError::BadSample { reason, .. } => PackError::BadSample {
                name: shown,
                reason,
            },
            e => e,
        })
    };
    let start = packer.resume_at();
    let mut consume = |i: u64, outcome| {
        packer.push(i, outcome)?;
        if (i + 1).is_multiple_of(REPORT_EVERY) && !report(packer.progress()) {
            return Err(PackError::Stopped);
        }
        Ok(())
    };
    ordered(start..files.len() as u64, workers, &produce, &mut consume)?;
    if report(packer.progress()) {
        Ok(())
    } else {
        Err(PackError::Stopped)
    }
}

/// Packs `samples`, the next ones of the input (`first` is the position of
/// the first), preparing them on `workers` threads.
///
/// # Errors
///
/// As [`Packer::push`].
pub fn pack_samples(
    samples: Vec<Sample>,
    first: u64,
    packer: &mut Packer,
    workers: usize,
) -> Result<(), PackError> {
    if packer.complete().is_some() {
        return Ok(());
    }
    let reencode = packer.options().reencode;
    let slots: Vec<Mutex<Option<Sample>>> =
        samples.into_iter().map(|s| Mutex::new(Some(s))).collect();
    let n = slots.len() as u64;
    let produce = |i: u64| {
        let taken = slots[(i - first) as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match taken {
            Some(sample) => prepare(sample, i, reencode.as_ref()),
            None => Err(PackError::Panic(format!("sample {i} was taken twice"))),
        }
    };
    let mut consume = |i: u64, outcome| packer.push(i, outcome);
    ordered(first..first + n, workers, &produce, &mut consume)
}
