//! The image file formats the decoders read.

/// An image file format, recognized by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JPEG (JFIF/EXIF; baseline, progressive, lossless; gray, `YCbCr`, CMYK, YCCK).
    Jpeg,
    /// PNG (1 to 16 bits, gray, RGB, palette, with or without alpha).
    Png,
    /// WebP (lossy or lossless; the first frame of an animation).
    Webp,
    /// BMP (1, 4 and 8 bit palette, 8 bit gray, 16, 24 and 32 bit, bit
    /// fields, RLE; bottom-up or top-down).
    Bmp,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Jpeg => "JPEG",
            Format::Png => "PNG",
            Format::Webp => "WebP",
            Format::Bmp => "BMP",
        })
    }
}
