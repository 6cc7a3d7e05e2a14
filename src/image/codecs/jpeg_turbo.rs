//! JPEG through libjpeg-turbo (the `turbojpeg` feature): SIMD IDCT,
//! DCT-domain scaling to `n/8` of the stored size, and partial decoding of
//! a window (`TurboJPEG` 3's cropping region: only the rows of the window
//! are color-converted and inverse-transformed, only its iMCU columns are
//! inverse-transformed).
//!
//! Hand-written over `turbojpeg::raw` (the same library's C API, through
//! turbojpeg-sys): the `turbojpeg` crate's `Decompressor` (1.5.1, the
//! latest) keeps its handle private and does not wrap
//! `tj3SetCroppingRegion`, so [`Handle`] wraps the few calls used here.

use std::cell::RefCell;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;

use turbojpeg::raw;

use super::{corrupt, ColorMode, ImageError, Window, WindowPixels, MAX_JPEG_SCANS};
use crate::image::Format;

thread_local! {
    /// One libjpeg-turbo handle per thread (`tj3Init` allocates).
    static DECOMPRESSOR: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

const FMT: Format = Format::Jpeg;

/// A `TurboJPEG` decompression instance (`tjhandle`), owned: destroyed on drop.
struct Handle(NonNull<c_void>);

/// What `tj3DecompressHeader` reads.
#[derive(Debug, Clone, Copy)]
struct Header {
    width: usize,
    height: usize,
    /// `TJSAMP_*` (`TJSAMP_UNKNOWN` for unusual sampling factors).
    subsamp: c_int,
    /// `TJCS_*`.
    colorspace: c_int,
    lossless: bool,
}

/// Converts a size for the C API.
fn c_len(v: usize) -> Result<c_int, ImageError> {
    c_int::try_from(v).map_err(|_| corrupt(FMT, format!("dimension {v} is too large")))
}

impl Handle {
    fn new() -> Result<Self, ImageError> {
        // SAFETY: tj3Init has no preconditions; it returns a new instance, or
        // null when it cannot allocate one.
        let ptr = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS.cast_signed()) };
        NonNull::new(ptr)
            .map(Self)
            .ok_or_else(|| corrupt(FMT, "TurboJPEG error: cannot create a decompressor"))
    }

    fn ptr(&self) -> raw::tjhandle {
        self.0.as_ptr()
    }

    /// The instance's last error, as a [`ImageError::Corrupt`].
    #[cold]
    fn error(&self) -> ImageError {
        // SAFETY: the handle is live; tj3GetErrorStr returns a pointer to a
        // NUL-terminated message buffer of the instance (or a static one),
        // valid until the next call on the handle, and it is copied at once.
        let msg = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.ptr())) };
        corrupt(FMT, format!("TurboJPEG error: {}", msg.to_string_lossy()))
    }

    fn check(&self, rc: c_int) -> Result<(), ImageError> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn get(&self, param: raw::TJPARAM) -> c_int {
        // SAFETY: the handle is live; tj3Get reads a parameter (-1 for an
        // unknown one), it has no other effect.
        unsafe { raw::tj3Get(self.ptr(), param.cast_signed()) }
    }

    fn set(&mut self, param: raw::TJPARAM, value: c_int) -> Result<(), ImageError> {
        // SAFETY: the handle is live and not shared (thread-local, `&mut`).
        let rc = unsafe { raw::tj3Set(self.ptr(), param.cast_signed(), value) };
        self.check(rc)
    }

    fn read_header(&mut self, data: &[u8]) -> Result<Header, ImageError> {
        // SAFETY: the handle is live and not shared; `data` is valid for
        // `data.len()` bytes, which libjpeg-turbo only reads, during the call.
        let rc = unsafe {
            raw::tj3DecompressHeader(self.ptr(), data.as_ptr(), data.len() as raw::size_t)
        };
        self.check(rc)?;
        let dim = |v: c_int| usize::try_from(v).map_err(|_| corrupt(FMT, "bad image size"));
        Ok(Header {
            width: dim(self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH))?,
            height: dim(self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT))?,
            subsamp: self.get(raw::TJPARAM_TJPARAM_SUBSAMP),
            colorspace: self.get(raw::TJPARAM_TJPARAM_COLORSPACE),
            lossless: self.get(raw::TJPARAM_TJPARAM_LOSSLESS) == 1,
        })
    }

    /// Sets the scaling factor `num/8` (1 to 8).
    fn set_scaling(&mut self, num: usize) -> Result<(), ImageError> {
        // libjpeg-turbo lists its factors in lowest terms (1/4, not 2/8).
        let gcd = match num {
            8 => 8,
            4 => 4,
            2 | 6 => 2,
            _ => 1,
        };
        let factor = raw::tjscalingfactor {
            num: c_len(num / gcd)?,
            denom: c_len(8 / gcd)?,
        };
        // SAFETY: the handle is live and not shared.
        let rc = unsafe { raw::tj3SetScalingFactor(self.ptr(), factor) };
        self.check(rc)
    }

    /// Sets the cropping region (in scaled coordinates; all zero: none).
    fn set_crop(&mut self, w: Window) -> Result<(), ImageError> {
        let region = raw::tjregion {
            x: c_len(w.x)?,
            y: c_len(w.y)?,
            w: c_len(w.width)?,
            h: c_len(w.height)?,
        };
        // SAFETY: the handle is live and not shared; the region is checked
        // by libjpeg-turbo against the header read before.
        let rc = unsafe { raw::tj3SetCroppingRegion(self.ptr(), region) };
        self.check(rc)
    }

    /// Decompresses into `out`: `height` rows of `width` pixels of `format`
    /// (`TJPF_*`), `pitch` bytes apart, where `width` and `height` are
    /// those of the cropping region, or of the scaled image without one.
    fn decompress(
        &mut self,
        data: &[u8],
        out: &mut [u8],
        width: usize,
        height: usize,
        pitch: usize,
        format: raw::TJPF,
    ) -> Result<(), ImageError> {
        let px = match format {
            raw::TJPF_TJPF_GRAY => 1,
            raw::TJPF_TJPF_RGB => 3,
            _ => 4,
        };
        let needed = pitch * height.saturating_sub(1) + width * px;
        if width == 0 || height == 0 || pitch < width * px || out.len() < needed {
            return Err(corrupt(FMT, "output buffer too small (a bug)"));
        }
        let pitch = c_len(pitch)?;
        // SAFETY: the handle is live and not shared; `data` is valid for
        // reads of `data.len()` bytes; libjpeg-turbo writes `height` rows of
        // `width * px` bytes, `pitch` apart, from `out`'s start (`width` and
        // `height` are the output size it computes from the header, scaling
        // factor and cropping region set before, as the caller guarantees),
        // which is at most `needed <= out.len()` bytes (checked above).
        let rc = unsafe {
            raw::tj3Decompress8(
                self.ptr(),
                data.as_ptr(),
                data.len() as raw::size_t,
                out.as_mut_ptr(),
                pitch,
                format,
            )
        };
        self.check(rc)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { raw::tj3Destroy(self.ptr()) };
    }
}

fn with_decompressor<T>(
    f: impl FnOnce(&mut Handle) -> Result<T, ImageError>,
) -> Result<T, ImageError> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Handle::new()?);
        }
        // The handle was just made if it was missing.
        let d = slot
            .as_mut()
            .ok_or_else(|| corrupt(FMT, "no decompressor"))?;
        let result = f(d);
        if result.is_err() {
            // libjpeg-turbo can leave a handle in a bad state after a corrupt
            // input (the next, valid image then fails): start afresh.
            *slot = None;
        }
        result
    })
}

/// The stored `(width, height)`.
pub(crate) fn header(data: &[u8]) -> Result<(usize, usize), ImageError> {
    let h = with_decompressor(|d| d.read_header(data))?;
    Ok((h.width, h.height))
}

/// The size libjpeg-turbo produces at `num/8` of `width` x `height`
/// (`TJSCALED`: rounded up).
pub(crate) fn scaled_size(width: usize, height: usize, num: usize) -> (usize, usize) {
    ((width * num).div_ceil(8), (height * num).div_ceil(8))
}

/// The iMCU width in pixels of a `TJSAMP_*` subsampling, or `None` for an
/// unusual one (such JPEGs cannot be decoded partially).
fn mcu_width(subsamp: c_int) -> Option<usize> {
    match subsamp {
        raw::TJSAMP_TJSAMP_444
        | raw::TJSAMP_TJSAMP_GRAY
        | raw::TJSAMP_TJSAMP_440
        | raw::TJSAMP_TJSAMP_441 => Some(8),
        raw::TJSAMP_TJSAMP_422 | raw::TJSAMP_TJSAMP_420 => Some(16),
        raw::TJSAMP_TJSAMP_411 => Some(32),
        _ => None,
    }
}

/// A decode [`prepare`]d on a handle.
struct Prepared {
    /// The window that will be decoded.
    window: Window,
    /// The whole scaled image's window (not scaled for lossless JPEGs).
    full: Window,
    /// A CMYK or YCCK JPEG (converted to RGB here, not by libjpeg-turbo).
    cmyk: bool,
    /// A lossless JPEG: decoded in the plain `mode` only (RGB or gray,
    /// never RGBX, which libjpeg-turbo's lossless path is not relied on for).
    lossless: bool,
}

/// Prepares a decode at `num/8` of the window `want` (in scaled
/// coordinates; `None`: all of it). The window decoded is `want` with its
/// left edge moved down to an iMCU boundary, or the whole scaled image
/// where a window cannot be decoded (lossless or unusually subsampled
/// JPEGs).
fn prepare(
    d: &mut Handle,
    data: &[u8],
    num: usize,
    want: Option<Window>,
) -> Result<Prepared, ImageError> {
    let header = d.read_header(data)?;
    // Lossless JPEGs can be neither scaled nor cropped while decoding.
    let num = if header.lossless { 8 } else { num };
    d.set_scaling(num)?;
    d.set_scan_limit()?;
    let (sw, sh) = scaled_size(header.width, header.height, num);
    let full = Window {
        x: 0,
        y: 0,
        width: sw,
        height: sh,
    };
    let mcu = mcu_width(header.subsamp).filter(|_| !header.lossless);
    let window = match (want, mcu) {
        (Some(w), Some(mcu)) if w.width > 0 && w.height > 0 => {
            let x1 = (w.x + w.width).min(sw);
            let y1 = (w.y + w.height).min(sh);
            // The left edge on a scaled iMCU boundary (TJSCALED of the iMCU
            // width), as tj3SetCroppingRegion requires.
            let step = (mcu * num).div_ceil(8);
            let x0 = (w.x.min(x1.saturating_sub(1)) / step) * step;
            let y0 = w.y.min(y1.saturating_sub(1));
            Window {
                x: x0,
                y: y0,
                width: x1 - x0,
                height: y1 - y0,
            }
        }
        _ => full,
    };
    if window == full {
        d.set_crop(Window::default())?;
    } else {
        d.set_crop(window)?;
    }
    let cmyk = header.colorspace == raw::TJCS_TJCS_CMYK.cast_signed()
        || header.colorspace == raw::TJCS_TJCS_YCCK.cast_signed();
    Ok(Prepared {
        window,
        full,
        cmyk,
        lossless: header.lossless,
    })
}

impl Handle {
    fn set_scan_limit(&mut self) -> Result<(), ImageError> {
        self.set(raw::TJPARAM_TJPARAM_SCANLIMIT, c_len(MAX_JPEG_SCANS)?)
    }
}

/// Decodes at `num/8` scale in `mode` into `out`, rows `pitch` bytes apart
/// (`out` holds at least `pitch * scaled height` bytes).
pub(crate) fn decode_into(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(usize, usize), ImageError> {
    with_decompressor(|d| {
        let Prepared {
            window: w, cmyk, ..
        } = prepare(d, data, num, None)?;
        write(d, data, w, cmyk, mode, out, pitch)?;
        Ok((w.width, w.height))
    })
}

/// Decodes the window `want` (scaled coordinates) of the image at `num/8`
/// scale in `mode`, into a buffer of packed rows. Returns it, the window
/// decoded (`want` widened left to an iMCU boundary, or the whole image
/// where a JPEG cannot be decoded partially), the size of the whole image
/// at the scale used (full size for a lossless JPEG, which cannot be
/// scaled), and the bytes per pixel: with `padded`, RGB comes as RGBX (4;
/// not CMYK or YCCK JPEGs, which are converted here, nor lossless ones).
pub(crate) fn decode_window(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    want: Window,
    padded: bool,
) -> Result<WindowPixels, ImageError> {
    with_decompressor(|d| {
        let Prepared {
            window: w,
            full,
            cmyk,
            lossless,
        } = prepare(d, data, num, Some(want))?;
        let padded = padded && mode == ColorMode::Rgb && !cmyk && !lossless;
        let channels = if padded { 4 } else { mode.channels() };
        let pitch = w.width * channels;
        let mut buf = super::scratch(pitch * w.height)?;
        if padded {
            d.decompress(
                data,
                &mut buf,
                w.width,
                w.height,
                pitch,
                raw::TJPF_TJPF_RGBX,
            )?;
        } else {
            write(d, data, w, cmyk, mode, &mut buf, pitch)?;
        }
        Ok(WindowPixels {
            pixels: buf,
            channels,
            window: w,
            full: (full.width, full.height),
        })
    })
}

/// Decompresses the prepared window `w` in `mode` into `out`.
fn write(
    d: &mut Handle,
    data: &[u8],
    w: Window,
    cmyk: bool,
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(), ImageError> {
    if cmyk {
        // libjpeg converts neither CMYK nor YCCK to RGB: take the
        // (Adobe-inverted) CMYK and convert it as Pillow does.
        let mut buf = super::scratch(w.width * w.height * 4)?;
        d.decompress(
            data,
            &mut buf,
            w.width,
            w.height,
            w.width * 4,
            raw::TJPF_TJPF_CMYK,
        )?;
        if out.len() < pitch * w.height.saturating_sub(1) + w.width * mode.channels() {
            return Err(corrupt(FMT, "output buffer too small (a bug)"));
        }
        super::write_inverted_cmyk(&buf, w.width, mode, out, pitch);
        return Ok(());
    }
    let format = match mode {
        ColorMode::Rgb => raw::TJPF_TJPF_RGB,
        ColorMode::Gray => raw::TJPF_TJPF_GRAY,
    };
    d.decompress(data, out, w.width, w.height, pitch, format)
}
