//! The batch engine: read, decode, resize and crop a group of images, in
//! parallel on the process's CPU pool ([`crate::runtime::cpu`]), straight
//! into the slots of one batch buffer, laid out and converted as a
//! [`Layout`] says.
//!
//! Every native batch of ferrofeed is formed here: `ferrofeed.io.load_images`
//! (with [`decode_batch`], whose caller waits), the `DataLoader`'s image
//! batches (with [`spawn_batch`], whose last copy hands the batch on), and
//! (through [`write_slot`]) the `ops.collate` pipeline op. The Python
//! bindings only convert arguments and release the GIL around
//! [`decode_batch`].
//!
//! # Example
//!
//! ```
//! use ferrofeed::image::batch::{decode_batch, BatchItem, BatchOptions, OnError, Source};
//! use ferrofeed::image::{synth, Crop, Transform};
//!
//! let jpeg = synth::encode_jpeg(&synth::photo(64, 48, 1), 64, 48, 90, synth::Chroma::Subsampled)?;
//! let items: Vec<BatchItem<'_>> = (0..3)
//!     .map(|i| BatchItem::new(Source::Borrowed(&jpeg), format!("item {i}")).with_seed(i))
//!     .collect();
//! let t = Transform { size: Some((16, 16)), crop: Some(Crop::random_resized(0)), ..Transform::default() };
//! let options = BatchOptions { threads: 2, on_error: OnError::Stop, ..BatchOptions::default() };
//! let mut out = vec![0u8; options.layout.slot_len((16, 16, 3)) * items.len()];
//! let report = decode_batch(&items, &t, &options, &mut out)?;
//! assert_eq!(report.kept, 3);
//! assert!(report.failures.is_empty());
//! # Ok::<(), ferrofeed::image::ImageError>(())
//! ```

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{decode_into, Crop, ImageError, Transform};
use crate::staging::PooledBuffer;

/// Reads a whole file: the one file reader of the image paths (errors name
/// the path).
///
/// # Errors
///
/// [`ImageError::Io`] when the file cannot be read.
pub fn read_file(path: &Path) -> Result<Vec<u8>, ImageError> {
    read_named(path, &path.display().to_string())
}

/// [`read_file`], naming the file `name` in errors.
fn read_named(path: &Path, name: &str) -> Result<Vec<u8>, ImageError> {
    read_regular(path).map_err(|source| ImageError::Io {
        name: name.to_owned(),
        source,
    })
}

/// Reads a whole file that must be a regular file (or a symlink to one):
/// opened by [`crate::fs::open_regular`], so a FIFO, a socket, a device or a
/// directory is refused at once instead of blocking the reading thread.
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;

    let (mut file, size) = crate::fs::open_regular(path)?;
    let mut data = Vec::new();
    // The size is a hint: a file that grows or shrinks meanwhile is read to
    // its end all the same.
    data.try_reserve_exact(usize::try_from(size).unwrap_or(0))?;
    file.read_to_end(&mut data)?;
    Ok(data)
}

/// Where an image's encoded bytes are.
#[derive(Debug)]
pub enum Source<'a> {
    /// A file, read by the thread that decodes it.
    Path(PathBuf),
    /// Bytes the batch owns.
    Owned(Vec<u8>),
    /// Bytes borrowed for the call.
    Borrowed(&'a [u8]),
    /// Bytes left in a file (a local tar shard's member), read by the
    /// thread that decodes them.
    Located(crate::fs::FileRange),
}

impl Source<'_> {
    /// The encoded bytes (reads the file).
    ///
    /// # Errors
    ///
    /// [`ImageError::Io`] (naming `name`) when the file cannot be read.
    pub fn bytes(&self, name: &str) -> Result<Cow<'_, [u8]>, ImageError> {
        match self {
            Source::Path(p) => read_named(p, name).map(Cow::Owned),
            Source::Owned(v) => Ok(Cow::Borrowed(v)),
            Source::Borrowed(b) => Ok(Cow::Borrowed(b)),
            Source::Located(at) => at.read().map(Cow::Owned).map_err(|source| ImageError::Io {
                name: name.to_owned(),
                source,
            }),
        }
    }
}

/// One image of a batch.
#[derive(Debug)]
pub struct BatchItem<'a> {
    /// Its encoded bytes.
    pub source: Source<'a>,
    /// Its name in errors (a path, or `item 3`).
    pub name: String,
    /// The seed of its random draws (a [`Crop::RandomResized`]'s and a
    /// [`crate::image::Flip::Random`]'s, which it replaces: see
    /// [`crate::image::Transform::with_seed`]); derive it with
    /// [`crate::seed::crop_seed`], the one crop-seed rule.
    pub seed: u64,
}

impl<'a> BatchItem<'a> {
    /// An item with seed 0.
    pub fn new(source: Source<'a>, name: String) -> Self {
        Self {
            source,
            name,
            seed: 0,
        }
    }

    /// The item with the seed of its random draws.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// How a batch lays out and converts its images: `NHWC` or `NCHW`, `uint8`
/// or `float32` (0..1, optionally normalized per channel).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Layout {
    /// Channels first (`NCHW`) rather than last (`NHWC`).
    pub chw: bool,
    /// `float32` values (native-endian) rather than `uint8`.
    pub float: bool,
    /// Per-channel `(mean, std)` on the 0..1 scale, for float output.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

impl Layout {
    /// Bytes per value: 1 or 4.
    pub fn itemsize(&self) -> usize {
        if self.float {
            4
        } else {
            1
        }
    }

    /// Bytes of one image of `(height, width, channels)`.
    pub fn slot_len(&self, (h, w, c): (usize, usize, usize)) -> usize {
        h * w * c * self.itemsize()
    }

    /// The shape of a batch of `n` images of `(height, width, channels)`.
    pub fn shape(&self, n: usize, (h, w, c): (usize, usize, usize)) -> [usize; 4] {
        if self.chw {
            [n, c, h, w]
        } else {
            [n, h, w, c]
        }
    }

    /// Whether a decoded image is its own slot (`uint8` `NHWC`).
    fn is_direct(&self) -> bool {
        !self.float && !self.chw
    }
}

/// Writes one `HWC` `uint8` image into its slot of a batch, converting to
/// `layout`.
///
/// # Panics
///
/// When `src` or `slot` is shorter than the shape says.
#[allow(clippy::many_single_char_names)] // h, w, c, x, y: image coordinates
pub fn write_slot(src: &[u8], (h, w, c): (usize, usize, usize), layout: Layout, slot: &mut [u8]) {
    if layout.is_direct() {
        slot[..h * w * c].copy_from_slice(&src[..h * w * c]);
        return;
    }
    let value = |ch: usize, v: u8| -> f32 {
        let x = f32::from(v) / 255.0;
        match layout.normalize {
            Some((mean, std)) => (x - mean[ch.min(2)]) / std[ch.min(2)],
            None => x,
        }
    };
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let v = src[(y * w + x) * c + ch];
                let at = if layout.chw {
                    (ch * h + y) * w + x
                } else {
                    (y * w + x) * c + ch
                };
                if layout.float {
                    slot[at * 4..at * 4 + 4].copy_from_slice(&value(ch, v).to_ne_bytes());
                } else {
                    slot[at] = v;
                }
            }
        }
    }
}

/// What a batch does with an image that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// The batch fails with the failing image of lowest index (the others
    /// stop at their next image).
    #[default]
    Stop,
    /// The image is left out and reported; the others close the gap.
    Skip,
}

/// How [`decode_batch`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchOptions {
    /// The layout of the batch buffer.
    pub layout: Layout,
    /// Images decoded at once: `threads` jobs of the process's CPU pool
    /// ([`crate::runtime::cpu`]; the calling thread waits), so at most the
    /// pool's threads run at once; with 1 (or 0), on the calling thread.
    pub threads: usize,
    /// Failing images.
    pub on_error: OnError,
}

impl Default for BatchOptions {
    /// `uint8` `NHWC`, one thread per CPU of the pool, [`OnError::Stop`].
    fn default() -> Self {
        Self {
            layout: Layout::default(),
            threads: crate::runtime::cpu::pool_threads(),
            on_error: OnError::Stop,
        }
    }
}

/// What became of a batch's images.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Images in the buffer: slots `0..kept`, in the items' order.
    pub kept: usize,
    /// The images left out (under [`OnError::Skip`]), by item index,
    /// ascending.
    pub failures: Vec<(usize, ImageError)>,
}

/// The `(height, width, channels)` a transform gives every image, if it
/// fixes one (a final size, or a center crop without one).
pub fn batch_shape(transform: &Transform) -> Option<(usize, usize, usize)> {
    let (h, w) = match (transform.size, transform.crop) {
        (Some(size), _) => size,
        (None, Some(Crop::Center { height, width })) => (height, width),
        _ => return None,
    };
    Some((h, w, transform.mode.channels()))
}

/// Reads and decodes `items[i]` into slot `i` of `out` (each slot
/// `options.layout.slot_len(shape)` bytes, `shape` from [`batch_shape`]),
/// on up to `options.threads` threads. Under [`OnError::Skip`] the images
/// that fail are left out and the others moved up, in order, into slots
/// `0..kept`.
///
/// # Errors
///
/// [`ImageError::InvalidTransform`] when the transform gives images no
/// fixed shape or `out` is shorter than the batch; under [`OnError::Stop`],
/// the error of the failing item of lowest index (`out` is then partly
/// written).
pub fn decode_batch(
    items: &[BatchItem<'_>],
    transform: &Transform,
    options: &BatchOptions,
    out: &mut [u8],
) -> Result<BatchReport, ImageError> {
    decode_batch_with(items, transform, options, out, |copies, work| {
        crate::runtime::cpu::fan_out(copies, work);
    })
}

/// The slot length of a batch of `n` images into `out_len` bytes, or why
/// it cannot be decoded (no fixed shape, or too short a buffer).
fn batch_geometry(
    transform: &Transform,
    layout: Layout,
    n: usize,
    out_len: usize,
) -> Result<usize, ImageError> {
    let shape @ (h, w, c) = batch_shape(transform).ok_or_else(|| ImageError::InvalidTransform {
        reason: "images of a batch need one shape: give a size or a center crop".to_owned(),
    })?;
    let slot_len = layout.slot_len(shape);
    if out_len < n * slot_len {
        return Err(ImageError::InvalidTransform {
            reason: format!(
                "a batch of {n} images of {h}x{w}x{c} needs {} bytes, the buffer has {out_len}",
                n * slot_len,
            ),
        });
    }
    Ok(slot_len)
}

/// A batch's images being decoded by the copies of its work: what they
/// share (the items, the transform, the failures so far).
struct Decoding<I> {
    items: I,
    transform: Transform,
    layout: Layout,
    shape: (usize, usize, usize),
    skip: bool,
    failures: Mutex<Vec<(usize, ImageError)>>,
    stop: AtomicBool,
}

impl<'i, I: std::ops::Deref<Target = [BatchItem<'i>]>> Decoding<I> {
    fn new(items: I, transform: &Transform, options: &BatchOptions) -> Self {
        let shape = batch_shape(transform).unwrap_or_default();
        Self {
            items,
            transform: *transform,
            layout: options.layout,
            shape,
            skip: options.on_error == OnError::Skip,
            failures: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// One copy of the work: decodes the slots that `take` hands it (the
    /// next image's index and its slot) until none is left, or until an
    /// image failed under [`OnError::Stop`].
    fn run_copy<'s>(&self, mut take: impl FnMut() -> Option<(usize, &'s mut [u8])>) {
        // Straight into the slot when the batch is uint8 HWC; through a
        // per-copy scratch image, then converted into the slot, otherwise.
        let mut scratch = if self.layout.is_direct() {
            Vec::new()
        } else {
            vec![0u8; Layout::default().slot_len(self.shape)]
        };
        while !self.stop.load(Ordering::Relaxed) {
            let Some((i, slot)) = take() else { return };
            let item = &self.items[i];
            let t = self.transform.with_seed(item.seed);
            let r = item.source.bytes(&item.name).and_then(|data| {
                if self.layout.is_direct() {
                    decode_into(&data, &item.name, &t, slot).map(|_| ())
                } else {
                    decode_into(&data, &item.name, &t, &mut scratch)?;
                    write_slot(&scratch, self.shape, self.layout, slot);
                    Ok(())
                }
            });
            if let Err(e) = r {
                if !self.skip {
                    self.stop.store(true, Ordering::Relaxed);
                }
                self.failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((i, e));
            }
        }
    }

    /// Once every copy has returned: under [`OnError::Stop`] the failure of
    /// lowest index, if any; under [`OnError::Skip`] the report, the images
    /// that decoded moved up, in order, into slots `0..kept` of `out`.
    fn conclude(&self, out: &mut [u8]) -> Result<BatchReport, ImageError> {
        let n = self.items.len();
        let slot_len = self.layout.slot_len(self.shape);
        let mut failures =
            std::mem::take(&mut *self.failures.lock().unwrap_or_else(PoisonError::into_inner));
        failures.sort_by_key(|(i, _)| *i);
        if !self.skip {
            return match failures.into_iter().next() {
                Some((_, e)) => Err(e),
                None => Ok(BatchReport {
                    kept: n,
                    failures: Vec::new(),
                }),
            };
        }
        // Close the gaps the failed images left, keeping the order.
        let mut kept = 0;
        let mut next_failure = failures.iter().map(|(i, _)| *i).peekable();
        for i in 0..n {
            if next_failure.peek() == Some(&i) {
                next_failure.next();
                continue;
            }
            if kept != i {
                out.copy_within(i * slot_len..(i + 1) * slot_len, kept * slot_len);
            }
            kept += 1;
        }
        Ok(BatchReport { kept, failures })
    }
}

/// [`decode_batch`] with `run(copies, work)` running the copies of the
/// batch's work (each takes the next image until none is left).
fn decode_batch_with(
    items: &[BatchItem<'_>],
    transform: &Transform,
    options: &BatchOptions,
    out: &mut [u8],
    run: impl FnOnce(usize, &(dyn Fn() + Sync)),
) -> Result<BatchReport, ImageError> {
    let n = items.len();
    let slot_len = batch_geometry(transform, options.layout, n, out.len())?;
    if n == 0 || slot_len == 0 {
        return Ok(BatchReport {
            kept: n,
            failures: Vec::new(),
        });
    }
    let decoding = Decoding::new(items, transform, options);
    {
        let slots = Mutex::new(out[..n * slot_len].chunks_exact_mut(slot_len).enumerate());
        let work = || {
            decoding.run_copy(|| slots.lock().unwrap_or_else(PoisonError::into_inner).next());
        };
        run(options.threads.clamp(1, n), &work);
    }
    decoding.conclude(out)
}

/// What a batch spawned by [`spawn_batch`] hands over when it is done: the
/// outcome ([`decode_batch`]'s), the buffer, and the items (their bytes may
/// be reused).
pub type SpawnedOutcome = (
    Result<BatchReport, ImageError>,
    PooledBuffer,
    Vec<BatchItem<'static>>,
);

/// [`decode_batch`] without waiting, on the pool of `lanes`' threads: the
/// batch's `options.threads` copies of its work (one copy too) are queued
/// there, counted in its busy time, and this returns at once; the copy that finishes
/// last calls `done` (on its pool thread) with the outcome, the buffer and
/// the items. A batch that cannot be decoded at all (no fixed shape, a
/// short buffer), or has no images, calls `done` here.
///
/// So nobody waits for a batch: the pool's threads decode the batches in
/// the order they were spawned, and the batch is handed on by the thread
/// that finished it.
pub fn spawn_batch(
    items: Vec<BatchItem<'static>>,
    transform: &Transform,
    options: &BatchOptions,
    buffer: PooledBuffer,
    lanes: &std::sync::Arc<crate::runtime::cpu::Lanes>,
    done: impl FnOnce(SpawnedOutcome) + Send + 'static,
) {
    let n = items.len();
    let slot_len = match batch_geometry(transform, options.layout, n, buffer.len()) {
        Ok(slot_len) if n > 0 && slot_len > 0 => slot_len,
        Ok(_) => {
            let report = BatchReport {
                kept: n,
                failures: Vec::new(),
            };
            return done((Ok(report), buffer, items));
        }
        Err(e) => return done((Err(e), buffer, items)),
    };
    let copies = options.threads.clamp(1, n);
    let job = std::sync::Arc::new(SpawnedBatch {
        slots: Slots::new(&buffer, slot_len, n),
        decoding: Decoding::new(items, transform, options),
    });
    let worker = std::sync::Arc::clone(&job);
    // The buffer stays with the hand-over, which runs once every copy has
    // returned: until then only the slots handed out touch it.
    let mut buffer = buffer;
    lanes.spawn(
        copies,
        move || worker.decoding.run_copy(|| worker.slots.take()),
        move |panic| {
            let outcome = match panic {
                Some(reason) => Err(ImageError::DecoderPanic {
                    name: format!("a batch of {n} images"),
                    reason,
                }),
                None => job.decoding.conclude(&mut buffer),
            };
            // The copies' handle is gone (`Lanes::spawn` drops the work
            // first): the items come back to the caller.
            let items = std::sync::Arc::try_unwrap(job)
                .map_or_else(|_| Vec::new(), |job| job.decoding.items);
            done((outcome, buffer, items));
        },
    );
}

/// A batch spawned by [`spawn_batch`]: its slots and its decoding, shared
/// by its copies and its hand-over (which holds the buffer).
struct SpawnedBatch {
    slots: Slots,
    decoding: Decoding<Vec<BatchItem<'static>>>,
}

/// The first `n` slots of `slot_len` bytes of a buffer, each handed out
/// once, to whichever copy of a spawned batch asks next: what
/// `chunks_exact_mut` gives a scoped decode, for copies that cannot borrow
/// the buffer (they run after [`spawn_batch`] returned). Hand-written
/// because the buffer must stay with the batch, not with any one copy.
struct Slots {
    base: std::ptr::NonNull<u8>,
    slot_len: usize,
    n: usize,
    next: std::sync::atomic::AtomicUsize,
}

// SAFETY: `Slots` hands out disjoint `&mut` slices of a buffer owned by the
// same `SpawnedBatch` (see `take`); moving it to or sharing it with another
// thread moves or shares no access that `take` does not arbitrate.
unsafe impl Send for Slots {}
// SAFETY: as for `Send`: every `&mut` slice comes from `take`, which gives
// each index to one caller only (an atomic counter).
unsafe impl Sync for Slots {}

impl Slots {
    /// The slots of `buffer`, which must hold `n * slot_len` bytes and must
    /// outlive every slot handed out, unread and unwritten but through them
    /// (in [`spawn_batch`], the hand-over holds it, and runs once every copy
    /// has returned).
    fn new(buffer: &PooledBuffer, slot_len: usize, n: usize) -> Self {
        assert!(buffer.len() >= n * slot_len, "the buffer holds the slots");
        Self {
            base: buffer.non_null(),
            slot_len,
            n,
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The next slot not yet handed out, and its index; `None` once all
    /// have been.
    // A `&mut` from `&self` is the point: each slot is exclusive to the one
    // caller the counter gave it to (see the SAFETY argument below).
    #[allow(clippy::mut_from_ref)]
    fn take(&self) -> Option<(usize, &mut [u8])> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.n {
            return None;
        }
        // SAFETY: `i < n` and the buffer holds `n * slot_len` bytes
        // (checked in `new`), so the slice lies inside it; the counter
        // gives each `i` to one caller only, so slices never overlap; the
        // buffer is a heap allocation (moving its `PooledBuffer` does not
        // move it), and in `spawn_batch` the only callers are the batch's
        // copies, whose slices end before they return, while the buffer is
        // freed, read or written otherwise only by the hand-over, which
        // runs after every copy has returned (`Lanes::spawn`).
        Some((i, unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * self.slot_len), self.slot_len)
        }))
    }
}

#[cfg(test)]
mod tests;
