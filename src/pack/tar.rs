//! Writing a `WebDataset` tar shard.
//!
//! A sample is one member per field, `KEY.FIELD`, in the sample's order,
//! each a regular file whose bytes are the field's ([`Value::tar_bytes`]).
//! Headers are GNU tar headers (a member name past 100 bytes gets a GNU
//! long-name entry before it) with every field that could vary fixed: mode
//! `0444`, uid and gid 0, no user or group name, modification time 0. So
//! the same samples give the same bytes on every run, machine and number of
//! threads. The shard ends with tar's two zero blocks.

use std::io::{self, Write};

use super::dest::ShardOut;
use super::sample::{Prepared, Value};
use super::shard::{Finished, FormatWriter};
use super::PackError;

/// Bytes a tar member of `len` bytes named `name` takes: its header (and a
/// long-name entry for a name past 100 bytes), its data rounded up to 512.
pub fn member_len(name_len: usize, len: usize) -> u64 {
    let blocks = |n: usize| (n as u64).div_ceil(512) * 512;
    let long_name = if name_len >= 100 {
        512 + blocks(name_len + 1)
    } else {
        0
    };
    long_name + 512 + blocks(len)
}

/// A [`Write`] that counts what passes through it.
struct Counting {
    out: ShardOut,
    pos: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A tar shard being written.
pub struct TarWriter {
    builder: ::tar::Builder<Counting>,
    offsets: Vec<u64>,
    first_key: Option<String>,
    last_key: Option<String>,
}

impl TarWriter {
    /// A shard written to `out`.
    pub fn new(out: ShardOut) -> Self {
        Self {
            builder: ::tar::Builder::new(Counting { out, pos: 0 }),
            offsets: Vec::new(),
            first_key: None,
            last_key: None,
        }
    }

    fn failure(&mut self, e: &io::Error) -> PackError {
        self.builder.get_mut().out.failure(e)
    }
}

impl FormatWriter for TarWriter {
    fn cost(&self, s: &Prepared) -> u64 {
        s.fields
            .iter()
            .map(|(name, v)| member_len(s.key.len() + 1 + name.len(), tar_len(v)))
            .sum()
    }

    fn append(&mut self, s: &Prepared) -> Result<(), PackError> {
        self.offsets.push(self.builder.get_ref().pos);
        for (field, value) in &s.fields {
            let bytes = value.tar_bytes();
            let mut header = ::tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o444);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_entry_type(::tar::EntryType::Regular);
            let member = format!("{}.{field}", s.key);
            // Keys and field names were checked (`sample::prepare`): the tar
            // crate takes every one, so a failure here is the write's.
            if let Err(e) = self.builder.append_data(&mut header, &member, &*bytes) {
                return Err(self.failure(&e));
            }
        }
        if self.first_key.is_none() {
            self.first_key = Some(s.key.clone());
        }
        self.last_key = Some(s.key.clone());
        Ok(())
    }

    fn samples(&self) -> u64 {
        self.offsets.len() as u64
    }

    fn finish(self: Box<Self>) -> Result<Finished, PackError> {
        let mut this = *self;
        let end = this.builder.get_ref().pos;
        if let Err(e) = this.builder.finish() {
            return Err(this.failure(&e));
        }
        let counting = match this.builder.into_inner() {
            Ok(c) => c,
            Err(e) => {
                return Err(PackError::Dest {
                    dest: String::new(),
                    reason: format!("cannot end the tar: {e}"),
                    kind: super::error::DestKind::Other,
                    errno: e.raw_os_error(),
                })
            }
        };
        Ok(Finished {
            out: counting.out,
            samples: this.offsets.len() as u64,
            first_key: this.first_key,
            last_key: this.last_key,
            offsets: Some(this.offsets),
            end: Some(end),
        })
    }
}

/// The bytes of a value in a tar member.
fn tar_len(v: &Value) -> usize {
    match v {
        Value::Bytes(b) => b.len(),
        Value::Text(t) => t.len(),
        Value::Int(_) | Value::Float(_) => v.tar_bytes().len(),
    }
}
