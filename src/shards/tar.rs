//! `WebDataset` tar shards, plain or gzip (or zstd) compressed.
//!
//! The compression is told from the file's first bytes (gzip `1f 8b`, zstd
//! `28 b5 2f fd`), not from its name, so `.tar.gz`, `.tgz` and a misnamed
//! `.tar` all read. A shard file is streamed, never held in memory whole (a
//! shard in memory, [`Shard::memory`], is read the same way). A plain
//! shard is read with seeks over member data that is not wanted: counting
//! reads its headers only (with the few KiB of buffer after each), and
//! [`ShardFormat::read`] of `lo..hi` reads the headers before `lo`, the
//! members of `lo..hi` and one header after them. With marks
//! ([`ShardFormat::count_marked`], [`ShardFormat::read_whole`]: where every
//! 128th sample starts, found by counting or by earlier reads) a read starts
//! at the last mark at or before `lo` instead, so reading a large shard by
//! windows does not walk its first headers again for every window. Such a
//! read of a plain file can also leave the members of the fields it is asked
//! to locate in the file ([`Value::Located`]: found, not read), for the
//! native image chain's decode threads to read. A compressed shard has to
//! be decompressed from its start up to `hi`, and its members are read.
//!
//! # Layout
//!
//! As the `webdataset` package reads a shard (its `base_plus_ext` and
//! `group_by_keys`):
//!
//! - Only regular files are members of samples; directories, links, devices
//!   and pax global headers are passed over. Long names (GNU long names, pax
//!   `path` records) are read by the `tar` crate.
//! - A member's name splits at the first dot of its base name into the
//!   sample's key (the directories and the base name up to that dot:
//!   `dir/000123.seg.png` has key `dir/000123`) and the field name (the rest,
//!   lowercased: `seg.png`; `A.JPG` is field `jpg`).
//! - A member whose base name has no dot (`README`), or starts with one
//!   (`.hidden`, `.DS_Store`, `dir/.x.jpg`, macOS's `._NAME` resource forks),
//!   has no key and is passed over, as is a member under a top-level
//!   `__name__` entry (`__index__`, `__meta__/x.json`: webdataset's metadata)
//!   or under `__MACOSX/`. (webdataset passes over a top-level hidden name
//!   only: `dir/.x.jpg` becomes its sample `dir/` with a field `x.jpg`, and
//!   `__MACOSX/._a.jpg` the sample `__MACOSX/`; those are not samples a
//!   writer meant, and a macOS tar's `dir/._a.jpg` before each `dir/a.jpg`
//!   would split its samples.)
//! - A member whose field name is `__key__` or `__shard__` (the sample's own
//!   metadata, which it would replace; webdataset refuses `__key__` too) is
//!   that sample's [`ShardError::Corrupt`].
//! - A PAX-format sparse member (`GNU.sparse.*` records, as `tar --sparse
//!   --format=posix` writes) is that sample's [`ShardError::Corrupt`]: its
//!   data would be read as stored, not expanded. GNU-format sparse members
//!   are expanded by the `tar` crate and read.
//! - bzip2 and xz compressed shards are refused at their start, naming the
//!   compression.
//! - Consecutive members with the same key form one sample, whose fields are
//!   the members' contents ([`Value::Bytes`]) in member order. Members passed
//!   over do not end a sample.
//! - Member names that are not UTF-8 are read with U+FFFD in place of the bad
//!   bytes.
//!
//! # Errors
//!
//! - A key that comes back after another key's members (a sample split
//!   within the shard, as `tar cf shard.tar *.jpg *.cls` writes) is
//!   [`ShardError::Corrupt`] at `"member NAME"`: [`ShardFormat::count`] fails
//!   with it (the shard's samples are not what its writer meant); a read gives
//!   it as the `Err` of the sample that starts there and goes on.
//! - Two members of one sample with the same field (`a.jpg`, `a.JPG`) are
//!   that sample's [`ShardError::Corrupt`] at the second member, and reading
//!   goes on ([`ShardFormat::count`] does not look).
//! - A file that ends without the tar end-of-archive marker (a zero block)
//!   right after a member's data and padding is whole (as GNU tar and
//!   webdataset read it: some writers leave the marker out). One that ends
//!   anywhere else is truncated: [`ShardError::Corrupt`] at `"member NAME"`
//!   when the file ends inside that member's data, at `"end of file after
//!   member NAME"` when it ends in the padding or a header after it. A header
//!   that does not check out is corrupt at `"header after member NAME"`; a
//!   compressed stream that breaks, at the member being read (or the header
//!   after it). Any of these ends a read: the samples before it were
//!   delivered, the one it falls in is lost. Counting such a shard gives the
//!   samples complete before the damage and the damage itself
//!   ([`ShardInfo::damage`]), so that a source can read up to it.

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use super::jsonl::{sniff, Codec};
use super::marks::{Marks, Stamp};
use super::{
    not_fetched, Each, Sample, SampleLayout, Shard, ShardError, ShardFormat, ShardInfo,
    ShardReader, Value, WholeRead,
};
use crate::fs::FileRange;

/// Buffer for reading a shard: small, as counting a plain shard reads a
/// header and seeks; a member read goes around it when larger.
const FILE_BUFFER: usize = 8 * 1024;

/// The most memory reserved up front for a member of a compressed shard
/// (its size in the header is not checked against anything until read).
const STREAM_RESERVE: u64 = 1 << 20;

/// The `WebDataset` tar shard reader (`.tar`, `.tar.gz`, `.tgz`); see the
/// [module docs](self) for the layout and the errors.
#[derive(Debug, Clone, Copy, Default)]
pub struct TarFormat;

impl ShardFormat for TarFormat {
    /// A corrupt or truncated shard counts the samples complete before the
    /// damage ([`ShardInfo::damage`]): a read of them stops before it, as a
    /// read stops once its last sample's next member (or the end) is seen.
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError> {
        count(shard, None)
    }

    /// A plain shard's count records a mark every [`STRIDE`](super::marks::STRIDE) samples.
    fn count_marked(&self, shard: &Shard, marks: &Marks) -> Result<ShardInfo, ShardError> {
        count(shard, Some(marks))
    }

    fn layout(&self) -> SampleLayout {
        SampleLayout::Members
    }

    fn read(&self, shard: &Shard, lo: u64, hi: u64, each: Each<'_>) -> Result<(), ShardError> {
        read(shard, lo..hi, None, each)
    }

    /// A plain shard is read from the last mark at or before `lo` (its
    /// headers before it are not walked again), recording the marks it
    /// walks over; a compressed one from its start. A plain shard's file
    /// leaves the members of the fields to locate where they are
    /// ([`Value::Located`]: found, not read).
    fn read_whole(&self, shard: &Shard, whole: &WholeRead, each: Each) -> Result<(), ShardError> {
        read(shard, whole.lo..whole.hi, Some(whole), each)
    }
}

/// [`TarFormat::count`], recording marks in `marks` if given.
fn count(shard: &Shard, marks: Option<&Marks>) -> Result<ShardInfo, ShardError> {
    let mut info = ShardInfo::default();
    if let Err(e) = walk(shard, &mut Job::Count(&mut info), marks, &[]) {
        info.damage = Some(super::Damage::of(&e).ok_or(e)?);
    }
    Ok(info)
}

/// [`TarFormat::read`] of `range`, or [`TarFormat::read_whole`] with `whole`.
fn read(
    shard: &Shard,
    range: Range<u64>,
    whole: Option<&WholeRead<'_>>,
    each: Each<'_>,
) -> Result<(), ShardError> {
    let hi = range.end;
    if range.is_empty() {
        return Ok(());
    }
    let (marks, located) = whole.map_or((None, &[][..]), |w| (Some(w.marks), w.located));
    let found = walk(shard, &mut Job::Read { range, each }, marks, located)?;
    if found < hi {
        return Err(ShardError::Changed {
            shard: shard.name.clone(),
            expected: hi,
            found,
        });
    }
    Ok(())
}

/// What a walk over a shard's members is for.
enum Job<'a> {
    /// Counting: fills in the samples and the keys at the ends.
    Count(&'a mut ShardInfo),
    /// Reading the samples `range`, delivered to `each`; the walk stops
    /// once the last of them is complete.
    Read {
        range: Range<u64>,
        each: &'a mut dyn FnMut(u64, Result<Sample, ShardError>),
    },
}

/// A walk's marks, and the version of the shard it walks (its marks are
/// for that version only).
#[derive(Clone, Copy)]
struct Marking<'m> {
    marks: &'m Marks,
    stamp: Stamp,
}

/// Opens `shard` and walks its members for `job`, returning the number of
/// samples walked over (all of them, or up to the end of a read's range).
/// With `marks`, a plain shard's walk records marks, and a read starts at
/// the last one at or before its first sample; a read of a plain shard's
/// file leaves the members of the fields `located` in it.
fn walk(
    shard: &Shard,
    job: &mut Job<'_>,
    marks: Option<&Marks>,
    located: &[String],
) -> Result<u64, ShardError> {
    let reader = shard.open()?;
    let len = reader.len();
    let marking = marks.map(|marks| Marking {
        marks,
        stamp: reader.stamp(),
    });
    // The file again (a second descriptor, closed with the last member left
    // in it), for the members left where they are.
    let file = match &reader {
        ShardReader::File { file, .. }
            if !located.is_empty() && matches!(job, Job::Read { .. }) =>
        {
            Some(Arc::new(
                file.try_clone()
                    .map_err(|e| ShardError::io(&shard.name, e))?,
            ))
        }
        _ => None,
    };
    let mut reader = BufReader::with_capacity(FILE_BUFFER, reader);
    let shard = shard.name.as_path();
    let codec = sniff(&mut reader).map_err(|e| ShardError::io(shard, e))?;
    match codec {
        Codec::Plain => {
            let mut walker = Walker::new(shard, Codec::Plain, Some(len), 0);
            walker.marking = marking;
            walker.located = file.map(|f| (f, located));
            walk_seekable(walker, reader, job)
        }
        Codec::Gzip => walk_stream(
            shard,
            codec,
            flate2::bufread::MultiGzDecoder::new(reader),
            job,
        ),
        Codec::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(reader)
                .map_err(|e| ShardError::io(shard, e))?;
            walk_stream(shard, codec, decoder, job)
        }
        Codec::Unsupported(name) => Err(Codec::refused(shard, name)),
    }
}

/// Walks an uncompressed tar with `walker` (made for it, from its start),
/// seeking over unwanted data: a read from the last of the walker's marks at
/// or before its first sample.
fn walk_seekable<R: Read + Seek>(
    mut walker: Walker<'_>,
    mut reader: R,
    job: &mut Job<'_>,
) -> Result<u64, ShardError> {
    let from = match (&*job, walker.marking) {
        (Job::Read { range, .. }, Some(m)) => m.marks.before(m.stamp, range.start),
        _ => None,
    };
    let (first, origin) = from.unwrap_or((0, 0));
    if origin > 0 {
        reader
            .seek(SeekFrom::Start(origin))
            .map_err(|e| ShardError::io(walker.shard, e))?;
        walker.origin = origin;
    }
    let mut archive = walker.archive(reader);
    let entries = archive
        .entries_with_seek()
        .map_err(|e| walker.corrupt_header(&e))?;
    walker.run(entries, job, first)
}

/// Walks a decompressed tar stream.
fn walk_stream<R: Read>(
    shard: &Path,
    codec: Codec,
    reader: R,
    job: &mut Job<'_>,
) -> Result<u64, ShardError> {
    let walker = Walker::new(shard, codec, None, 0);
    let mut archive = walker.archive(reader);
    let entries = archive.entries().map_err(|e| walker.corrupt_header(&e))?;
    walker.run(entries, job, 0)
}

/// Where the tar reader is in the stream it reads, shared between the
/// reader ([`Tracked`]) and the [`Walker`] that explains errors.
#[derive(Debug, Default)]
struct StreamState {
    /// Bytes from the start of the (decompressed) tar: read or sought over.
    pos: Cell<u64>,
    /// Whether a read found the end of the stream.
    eof: Cell<bool>,
}

/// A reader that keeps [`StreamState`] up to date; its seeks are relative
/// seeks that keep a buffered reader's buffer when they land in it.
struct Tracked<R> {
    inner: R,
    state: Rc<StreamState>,
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.state.eof.set(true);
        }
        self.state.pos.set(self.state.pos.get() + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Tracked<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Current(by) => {
                let pos = self.state.pos.get().checked_add_signed(by).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "seek out of range")
                })?;
                self.inner.seek_relative(by)?;
                pos
            }
            to => self.inner.seek(to)?,
        };
        self.state.pos.set(pos);
        Ok(pos)
    }
}

/// The last member the tar reader gave, for errors after it.
struct Member {
    name: String,
    /// Where its data starts and ends in the tar stream.
    data: Range<u64>,
}

/// A sample whose members are being walked.
struct Group {
    key: String,
    /// Its number in the shard.
    n: u64,
    /// Its fields, when its content is read.
    fields: Vec<(String, Value)>,
    /// What is wrong with it, if anything (its content is then not read).
    error: Option<ShardError>,
}

/// Walks a shard's members, groups them into samples and explains errors.
struct Walker<'p> {
    shard: &'p Path,
    codec: Codec,
    /// The length of an uncompressed shard (for the bytes reserved for a
    /// member, and where a truncated file ends).
    len: Option<u64>,
    state: Rc<StreamState>,
    last: Option<Member>,
    /// Where in the shard the walk starts (a mark's offset, or 0): the tar
    /// reader's positions, and the stream's, are from there.
    origin: u64,
    /// Where the walk records the marks it walks over, if anywhere.
    marking: Option<Marking<'p>>,
    /// The shard's file, and the fields whose members are left in it
    /// ([`Value::Located`]), if any.
    located: Option<(Arc<File>, &'p [String])>,
}

impl<'p> Walker<'p> {
    fn new(shard: &'p Path, codec: Codec, len: Option<u64>, origin: u64) -> Self {
        Self {
            shard,
            codec,
            len,
            state: Rc::default(),
            last: None,
            origin,
            marking: None,
            located: None,
        }
    }

    /// Where the walk is in the shard.
    fn pos(&self) -> u64 {
        self.origin + self.state.pos.get()
    }

    /// A tar archive over `reader`, whose reads and seeks this walker follows
    /// (to say where in the stream an error is).
    fn archive<R: Read>(&self, reader: R) -> tar::Archive<Tracked<R>> {
        tar::Archive::new(Tracked {
            inner: reader,
            state: Rc::clone(&self.state),
        })
    }

    /// Walks the members of `entries`, whose first is sample `first`'s, for
    /// `job`; see [`walk`].
    fn run<R: Read>(
        mut self,
        mut entries: tar::Entries<'_, R>,
        job: &mut Job<'_>,
        first: u64,
    ) -> Result<u64, ShardError> {
        // Every key met so far: one met again after another key is a split.
        let mut seen: HashSet<String> = HashSet::new();
        let mut group: Option<Group> = None;
        // Samples completed (or, from a mark, the samples before it).
        let mut done = first;
        // Where the next entry's headers start (its long name or pax ones
        // included): where the entry before it ends, padded to a block.
        // Unknown after a GNU sparse entry, whose extra headers the tar
        // reader reads after its first.
        let mut chain = Some(self.origin);
        loop {
            let mut entry = match entries.next() {
                Some(Ok(entry)) => entry,
                Some(Err(e)) => return Err(self.broken(e)),
                None if self.state.eof.get() && !self.ended_after_a_member() => {
                    return Err(self.truncated(None))
                }
                None => break,
            };
            let size = entry.size();
            let (name, sparse) = member_name(&mut entry);
            let start = entry.raw_file_position() + self.origin;
            let headers = chain;
            chain = match entry.header().entry_type() {
                tar::EntryType::GNUSparse => None,
                _ => start.saturating_add(size).checked_next_multiple_of(512),
            };
            self.last = Some(Member {
                name,
                data: start..start.saturating_add(size),
            });
            let name: &str = self.last.as_ref().map_or("", |m| m.name.as_str());
            if !is_member_file(entry.header().entry_type()) || is_meta(name) {
                continue;
            }
            let Some((key, ext)) = split_name(name) else {
                continue;
            };
            if group.as_ref().is_none_or(|g| g.key != key) {
                if let Some(g) = group.take() {
                    done += 1;
                    if finish(g, job) {
                        return Ok(done);
                    }
                }
                let mut error = None;
                if !seen.insert(key.to_owned()) {
                    let e = ShardError::corrupt(
                        self.shard,
                        format!("member {name}"),
                        format!(
                            "key {key:?} comes back after other keys: the members of a \
                             sample must be consecutive (was the tar written in name order?)"
                        ),
                    );
                    match job {
                        Job::Count(_) => return Err(e),
                        Job::Read { .. } => error = Some(e),
                    }
                }
                if let (Some(m), Some(at)) = (self.marking, headers) {
                    m.marks.record(m.stamp, done, at);
                }
                group = Some(Group {
                    key: key.to_owned(),
                    n: done,
                    fields: Vec::new(),
                    error,
                });
            }
            let Some(g) = group.as_mut() else {
                unreachable!("a group was just started")
            };
            let wanted = matches!(job, Job::Read { range, .. } if range.contains(&g.n));
            if !wanted || g.error.is_some() {
                continue;
            }
            let ext = ext.to_lowercase();
            if let Some(e) = self.refused(g, name, &ext, sparse) {
                g.error = Some(e);
                g.fields.clear();
                continue;
            }
            let value = match self.locate(&ext, start, size) {
                Some(at) => Value::Located(at),
                None => Value::Bytes(self.read_data(&mut entry, name, start, size)?),
            };
            g.fields.push((ext, value));
        }
        if let Some(g) = group.take() {
            done += 1;
            finish(g, job);
        }
        Ok(done)
    }

    /// Why member `name` (field `ext`) makes its sample `g` an error, if it
    /// does: a PAX sparse file, a field named as the sample's metadata, or a
    /// second member with `g`'s field `ext`.
    fn refused(&self, g: &Group, name: &str, ext: &str, sparse: bool) -> Option<ShardError> {
        let why = if sparse {
            "a PAX sparse file (GNU.sparse.* records, as `tar --sparse --format=posix` \
             writes): not read (pack it without --sparse, or with --format=gnu)"
                .to_owned()
        } else if METADATA.contains(&ext) {
            format!(
                "its field {ext:?} is the name of the sample's own metadata (the key and the \
                 shard): rename the member"
            )
        } else if g.fields.iter().any(|(e, _)| e == ext) {
            format!("a second {ext:?} member in sample {:?}", g.key)
        } else {
            return None;
        };
        Some(ShardError::corrupt(
            self.shard,
            format!("member {name}"),
            why,
        ))
    }

    /// Whether the stream ended right after the last member's data and its
    /// padding to a 512-byte block: a tar without its end-of-archive blocks,
    /// which GNU tar and webdataset read as whole (and which a cut at a
    /// header boundary cannot be told from).
    fn ended_after_a_member(&self) -> bool {
        let end = self.len.unwrap_or_else(|| self.pos());
        self.last
            .as_ref()
            .is_some_and(|m| end >= m.data.end.next_multiple_of(512))
    }

    /// Where member data of field `ext`, `size` bytes at `start`, is left in
    /// the shard's file, when the walk locates that field's members and the
    /// file holds the whole member (a member cut short is read, to fail as
    /// read members do).
    fn locate(&self, ext: &str, start: u64, size: u64) -> Option<FileRange> {
        let (file, fields) = self.located.as_ref()?;
        let inside = start
            .checked_add(size)
            .is_some_and(|end| end <= self.len.unwrap_or(0));
        (inside && fields.iter().any(|f| f == ext))
            .then(|| FileRange::new(Arc::clone(file), start, size))
    }

    /// Reads the `size` bytes of data of the member `name` (at `start` in the
    /// tar stream).
    fn read_data<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
        start: u64,
        size: u64,
    ) -> Result<Vec<u8>, ShardError> {
        // The header's size is not trusted for the memory reserved: no more
        // than the file holds (or, compressed, than a bound).
        let reserve = match self.len {
            Some(len) => size.min(len.saturating_sub(start)),
            None => size.min(STREAM_RESERVE),
        };
        // A buffer the decode gave back, when one fits: still mapped, so no page
        // of it is faulted in and zeroed again (see `crate::recycle`).
        let mut data = crate::recycle::take(usize::try_from(reserve).unwrap_or(0));
        match entry.read_to_end(&mut data) {
            Ok(_) if data.len() as u64 == size => Ok(data),
            Ok(_) => Err(ShardError::corrupt(
                self.shard,
                format!("member {name}"),
                format!(
                    "truncated: the {} ends after {} of its {size} bytes",
                    self.codec.name(),
                    data.len()
                ),
            )),
            Err(e) if e.raw_os_error().is_some() || not_fetched(&e) => {
                Err(ShardError::io(self.shard, e))
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.truncated(Some(&e))),
            Err(e) => Err(ShardError::corrupt(
                self.shard,
                format!("member {name}"),
                format!("{} cannot be read: {e}", self.codec.name()),
            )),
        }
    }

    /// The error for `e`, met by the tar reader between members (skipping
    /// the last one's data or reading the next header).
    fn broken(&self, e: io::Error) -> ShardError {
        if e.raw_os_error().is_some() || not_fetched(&e) {
            return ShardError::io(self.shard, e);
        }
        if self.state.eof.get() || e.kind() == io::ErrorKind::UnexpectedEof {
            return self.truncated(Some(&e));
        }
        match &self.last {
            Some(m) if self.pos() < m.data.end => ShardError::corrupt(
                self.shard,
                format!("member {}", m.name),
                format!("{} cannot be read: {e}", self.codec.name()),
            ),
            _ => self.corrupt_header(&e),
        }
    }

    /// A header (or what should be one) that does not check out.
    fn corrupt_header(&self, e: &io::Error) -> ShardError {
        let at = match &self.last {
            Some(m) => format!("header after member {}", m.name),
            None => "first header".to_owned(),
        };
        ShardError::corrupt(self.shard, at, format!("not a tar header: {e}"))
    }

    /// The error for a tar stream that ended before its end-of-archive
    /// marker (`e`: what the tar reader said of it, if anything).
    fn truncated(&self, e: Option<&io::Error>) -> ShardError {
        // Where the stream ended: an uncompressed file is its length (the
        // reader may have sought past it), a stream where reading stopped.
        let end = self.len.unwrap_or_else(|| self.pos());
        let what = self.codec.name();
        let said = e.map(|e| format!(" ({e})")).unwrap_or_default();
        match &self.last {
            Some(m) if end < m.data.end => ShardError::corrupt(
                self.shard,
                format!("member {}", m.name),
                format!(
                    "truncated: the {what} ends after {} of its {} bytes{said}",
                    end.saturating_sub(m.data.start),
                    m.data.end - m.data.start
                ),
            ),
            Some(m) => ShardError::corrupt(
                self.shard,
                format!("end of file after member {}", m.name),
                format!("truncated: the {what} ends without the tar end-of-archive marker{said}"),
            ),
            None if end == 0 => ShardError::corrupt(
                self.shard,
                "end of file",
                format!("the {what} is empty: not a tar archive"),
            ),
            None => ShardError::corrupt(
                self.shard,
                "end of file",
                format!("truncated: the {what} ends inside the first header{said}"),
            ),
        }
    }
}

/// Completes sample `g` for `job`; true when the job needs no more samples.
fn finish(g: Group, job: &mut Job<'_>) -> bool {
    match job {
        Job::Count(info) => {
            info.samples += 1;
            if info.first_key.is_none() {
                info.first_key = Some(g.key.clone());
            }
            info.last_key = Some(g.key);
            false
        }
        Job::Read { range, each } => {
            if range.contains(&g.n) {
                let sample = match g.error {
                    Some(e) => Err(e),
                    None => Ok(Sample {
                        key: g.key,
                        fields: g.fields,
                    }),
                };
                each(g.n, sample);
            }
            g.n + 1 >= range.end
        }
    }
}

/// The fields a sample has besides its members' (set by the bindings): a
/// member with one of these as its field name is refused, not let replace
/// them.
const METADATA: [&str; 2] = ["__key__", "__shard__"];

/// A member's name, and whether it is a PAX-format sparse file (`GNU.sparse.*`
/// records, which the `tar` crate does not expand): its name is then the
/// one in `GNU.sparse.name` when there is one (it is stored under
/// `GNUSparseFile.N/NAME`), so that it groups with its sample's other
/// members.
pub(super) fn member_name<R: Read>(entry: &mut tar::Entry<'_, R>) -> (String, bool) {
    let mut sparse = false;
    let mut real = None;
    // A PAX header that does not parse has already failed the entry's path
    // in the `tar` crate, or holds nothing read here.
    if let Ok(Some(records)) = entry.pax_extensions() {
        for record in records.flatten() {
            let Ok(key) = record.key() else { continue };
            if let Some(what) = key.strip_prefix("GNU.sparse.") {
                sparse = true;
                if what == "name" {
                    real = Some(String::from_utf8_lossy(record.value_bytes()).into_owned());
                }
            }
        }
    }
    let name = real.unwrap_or_else(|| String::from_utf8_lossy(&entry.path_bytes()).into_owned());
    (name, sparse)
}

/// Whether an entry of this type is a file (webdataset's `isreg`).
pub(super) fn is_member_file(kind: tar::EntryType) -> bool {
    matches!(
        kind,
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
    )
}

/// Whether `name` is webdataset's metadata (a top-level `__name__` entry, or
/// one under it), which samples do not include, or under a top-level
/// `__MACOSX/` (macOS's resource forks, `._NAME` each).
pub(super) fn is_meta(name: &str) -> bool {
    let top = name.split('/').next().unwrap_or("");
    top == "__MACOSX" || (top.len() >= 4 && top.starts_with("__") && top.ends_with("__"))
}

/// Splits a member's name into its sample's key and its field name (not yet
/// lowercased): `dir/000123.seg.png` -> (`dir/000123`, `seg.png`). `None`
/// when its base name has no dot or starts with one.
pub(super) fn split_name(name: &str) -> Option<(&str, &str)> {
    let base = name.rfind('/').map_or(0, |slash| slash + 1);
    let dot = name[base..].find('.')?;
    if dot == 0 {
        return None;
    }
    Some((&name[..base + dot], &name[base + dot + 1..]))
}

#[cfg(test)]
mod tests;
