//! The on-disk layout of an arena file.
//!
//! ```text
//! offset 0     header (64 bytes, little-endian)
//!   0  magic         8 bytes  b"FFARENA\0"
//!   8  version       u32      FORMAT_VERSION
//!   12 flags         u32      bit 0: complete; other bits 0 (readers refuse them)
//!   16 item_count    u64      n
//!   24 data_offset   u64      multiple of 64, >= 64
//!   32 index_offset  u64      multiple of 8
//!   40 file_len      u64      the file's exact size
//!   48 reserved      16 bytes zero
//! data_offset         item bytes; item i starts at align_up(off[i], 64)
//! index_offset        n + 1 little-endian u64 offsets `off`
//! ```
//!
//! `off[0] == data_offset`, and item `i` occupies `[align_up(off[i], 64),
//! off[i + 1])`: every item starts 64-byte aligned and `off[i + 1]` is its
//! exact end, so lengths are exact although items are padded. The index sits
//! after the data so that a writer can stream items of unknown count and size.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The eight bytes every arena file starts with.
pub const MAGIC: [u8; 8] = *b"FFARENA\0";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the fixed header at the start of the file.
pub const HEADER_LEN: u64 = 64;
/// Alignment of every item's first byte (and of `data_offset`).
pub const ITEM_ALIGN: u64 = 64;
/// Alignment of the index.
pub const INDEX_ALIGN: u64 = 8;
/// `flags` bit set once the file is completely written.
pub const FLAG_COMPLETE: u32 = 1;
/// Every `flags` bit this version knows; a reader refuses a file that sets
/// any other (a later format whose meaning it cannot honour).
pub const KNOWN_FLAGS: u32 = FLAG_COMPLETE;

/// The fixed 64-byte header, read in place from the mapping.
///
/// All fields are little-endian and unaligned, so the header can be viewed
/// from any byte slice without copying or alignment concerns.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`FORMAT_VERSION`].
    pub version: U32,
    /// Bit 0 ([`FLAG_COMPLETE`]) marks a completely written file.
    pub flags: U32,
    /// Number of items.
    pub item_count: U64,
    /// Start of the item data.
    pub data_offset: U64,
    /// Start of the `item_count + 1` offsets.
    pub index_offset: U64,
    /// Exact size of the file.
    pub file_len: U64,
    /// Zero; room for later versions.
    pub reserved: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_LEN as usize);

impl Header {
    /// A header for an arena that is not (yet) complete.
    pub fn incomplete() -> Self {
        Self {
            magic: MAGIC,
            version: U32::new(FORMAT_VERSION),
            flags: U32::new(0),
            item_count: U64::new(0),
            data_offset: U64::new(HEADER_LEN),
            index_offset: U64::new(0),
            file_len: U64::new(0),
            reserved: [0; 16],
        }
    }

    /// Whether the complete flag is set.
    pub fn is_complete(&self) -> bool {
        self.flags.get() & FLAG_COMPLETE != 0
    }
}

/// Rounds `x` up to a multiple of `align` (a power of two); `None` on overflow.
#[inline]
pub const fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    match x.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_bytes_and_round_trips() {
        let mut h = Header::incomplete();
        h.item_count = U64::new(7);
        let bytes = h.as_bytes();
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[..8], b"FFARENA\0");
        let back = Header::read_from_bytes(bytes).unwrap();
        assert_eq!(back.item_count.get(), 7);
        assert!(!back.is_complete());
    }

    #[test]
    fn align_up_works_and_detects_overflow() {
        assert_eq!(align_up(0, 64), Some(0));
        assert_eq!(align_up(1, 64), Some(64));
        assert_eq!(align_up(64, 64), Some(64));
        assert_eq!(align_up(65, 8), Some(72));
        assert_eq!(align_up(u64::MAX - 3, 64), None);
    }
}
