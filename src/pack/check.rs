//! Whether an image file is whole, without decoding its pixels.
//!
//! Packing copies an image's bytes unchanged, so decoding every pixel only
//! to throw the pixels away would cost more than the rest of the pack
//! together. What is checked instead finds the files a pack must not take:
//!
//! - the header parses ([`crate::image::probe`]: the format from the first
//!   bytes, a size within the pixel budget; a JPEG's frame header, a PNG's
//!   `IHDR`, a WebP's chunk header, a BMP's info header);
//! - the file is whole: a JPEG has its end-of-image marker after its first
//!   scan (entropy-coded data never holds `FF D9`: an `FF` in it is stuffed
//!   as `FF 00`), a PNG's chunks follow each other up to `IEND`, a WebP's
//!   RIFF size fits the file, a BMP's declared file size and pixel offset
//!   fit the file.
//!
//! A file damaged in the middle of its compressed data passes; only a full
//! decode finds that (a pack with re-encoding decodes every image).

use crate::image::{self, Format, ImageInfo};

/// Checks `data` (named `name`) as described in the module docs.
///
/// # Errors
///
/// A message saying what is wrong (not an image, which header fails, what
/// is missing at the end).
pub fn check_image(data: &[u8], name: &str) -> Result<ImageInfo, String> {
    let info = image::probe(data, name).map_err(|e| {
        let text = e.to_string();
        text.strip_prefix(&format!("{name}: "))
            .unwrap_or(&text)
            .to_string()
    })?;
    let whole = match info.format {
        Format::Jpeg => jpeg_whole(data),
        Format::Png => png_whole(data),
        Format::Webp => webp_whole(data),
        Format::Bmp => bmp_whole(data),
    };
    whole.map_err(|why| format!("{} is truncated or damaged: {why}", info.format))?;
    Ok(info)
}

/// A JPEG has an EOI marker (`FF D9`) after the start of its first scan.
fn jpeg_whole(data: &[u8]) -> Result<(), &'static str> {
    let sos = first_scan(data).ok_or("no scan (SOS marker) in the file")?;
    if data[sos..].windows(2).any(|w| w == [0xFF, 0xD9]) {
        Ok(())
    } else {
        Err("no end-of-image marker after the scan")
    }
}

/// Where the first SOS marker starts, walking the marker segments from SOI
/// (so an EXIF thumbnail's markers, inside APP1, are passed over).
fn first_scan(data: &[u8]) -> Option<usize> {
    let mut pos = 2;
    loop {
        pos += data.get(pos..)?.iter().position(|&b| b == 0xFF)?;
        let at = pos;
        pos += data.get(pos..)?.iter().position(|&b| b != 0xFF)?;
        let code = *data.get(pos)?;
        pos += 1;
        match code {
            0x00 | 0x01 | 0xD0..=0xD8 => continue,
            0xDA => return Some(at),
            0xD9 => return None,
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([*data.get(pos)?, *data.get(pos + 1)?]));
        pos = pos.checked_add(len)?;
    }
}

/// A PNG's chunks, each `length, type, data, CRC`, run from the signature
/// to an `IEND` chunk, every one within the file.
fn png_whole(data: &[u8]) -> Result<(), &'static str> {
    let mut pos: usize = 8;
    loop {
        let Some(head) = data.get(pos..pos + 8) else {
            return Err("the chunks end before IEND");
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let end = pos
            .checked_add(12)
            .and_then(|p| p.checked_add(len))
            .ok_or("a chunk length overflows")?;
        if end > data.len() {
            return Err("a chunk runs past the end of the file");
        }
        if &head[4..8] == b"IEND" {
            return Ok(());
        }
        pos = end;
    }
}

/// A WebP's RIFF header says how long the file is: it must fit.
fn webp_whole(data: &[u8]) -> Result<(), &'static str> {
    let size = data
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("no RIFF size")?;
    if size.saturating_add(8) > data.len() {
        Err("the RIFF size runs past the end of the file")
    } else {
        Ok(())
    }
}

/// A BMP's file header gives the file's size (0 is allowed by some
/// writers) and where the pixels start: both must fit.
fn bmp_whole(data: &[u8]) -> Result<(), &'static str> {
    let word = |at: usize| {
        data.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let (Some(size), Some(offset)) = (word(2), word(10)) else {
        return Err("no file header");
    };
    if size > data.len() {
        return Err("the declared file size runs past the end of the file");
    }
    if offset >= data.len() {
        return Err("the pixel data starts past the end of the file");
    }
    Ok(())
}

/// The format an image's bytes are in, by their first bytes, as the file
/// extension a `WebDataset` member takes (`jpg`, `png`, `webp`, `bmp`).
pub fn extension(format: Format) -> &'static str {
    match format {
        Format::Jpeg => "jpg",
        Format::Png => "png",
        Format::Webp => "webp",
        Format::Bmp => "bmp",
    }
}

#[cfg(test)]
mod tests;
