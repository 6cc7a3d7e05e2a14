"""ferrofeed.io against Pillow on images generated at test time.

Thresholds (mean absolute difference per channel value, 0-255):
- JPEG decode vs Pillow: MAE < 1.5 (both are libjpeg-turbo with the islow IDCT; measured
  0.0 on every variant here, CMYK included; gray output of a color JPEG: 0.005).
- PNG (every variant) and lossless WebP: exact.
- Lossy WebP vs Pillow (libwebp): MAE < 1.0 (measured 0.0).
- BMP (1, 8, 16, 24 and 32 bit, palette, gray, bit fields, RLE4 and RLE8, OS/2 header,
  top-down): exact.
- Resize vs Pillow BILINEAR: PSNR >= 50 dB without DCT scaling (measured 55-57 dB, max
  difference 1: rounding in the two-pass convolution); >= 35 dB with DCT scaling (measured
  39-49 dB: libjpeg-turbo's scaled IDCT is a different, also antialiased, downscale).
"""

from __future__ import annotations

import io
import math
import re
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import ferrofeed
import ferrofeed.io as fio
import numpy as np
import pytest
from conftest import TESTS_DIR

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")


# --------------------------------------------------------------------------------------
# helpers


def photo_like(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus mild noise: compresses like a photo, exercises every channel."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 120 * np.sin(x / max(w, 1) * 6.0 + y / max(h, 1) * 2.0)
    g = 255 * (y / max(h - 1, 1))
    b = 127 + 100 * np.cos((x + y) / 17.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def pil_rgb(data: bytes, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def ours(src: object, **kw: object) -> np.ndarray:
    t = fio.decode_image(src, **kw)  # type: ignore[arg-type]
    assert isinstance(t, ferrofeed.Tensor)
    arr = np.from_dlpack(t)
    assert arr.dtype == np.uint8
    assert arr.ctypes.data % 64 == 0
    return arr


def mae(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def write_png(arr: np.ndarray, bit_depth: int, color_type: int) -> bytes:
    """A minimal PNG writer (for 16-bit RGB, which Pillow cannot save)."""
    h, w = arr.shape[:2]
    raw = arr.astype(">u2").tobytes() if bit_depth == 16 else arr.astype(np.uint8).tobytes()
    stride = len(raw) // h
    rows = b"".join(b"\0" + raw[i * stride : (i + 1) * stride] for i in range(h))

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


SIZES = [(48, 64), (217, 333), (375, 500)]


# --------------------------------------------------------------------------------------
# JPEG


@pytest.mark.parametrize(("h", "w"), SIZES)
@pytest.mark.parametrize("quality", [75, 90, 95])
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg_matches_pillow(h: int, w: int, quality: int, subsampling: int, progressive: bool):
    img = Image.fromarray(photo_like(h, w, seed=h + quality))
    data = encode(img, "JPEG", quality=quality, subsampling=subsampling, progressive=progressive)
    got = ours(data)
    assert got.shape == (h, w, 3)
    assert mae(got, pil_rgb(data)) < 1.5


def test_jpeg_grayscale_and_cmyk():
    rgb = photo_like(120, 90, seed=3)
    gray = encode(Image.fromarray(rgb).convert("L"), "JPEG", quality=90)
    assert mae(ours(gray), pil_rgb(gray)) < 1.5
    g1 = ours(gray, mode="L")
    assert g1.shape == (120, 90, 1)
    assert mae(g1[..., 0], pil_rgb(gray, "L")) < 1.5
    cmyk = encode(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95)
    assert mae(ours(cmyk), pil_rgb(cmyk)) < 1.5
    # Grayscale output of a color JPEG: luma, within rounding of Pillow's convert("L").
    color = encode(Image.fromarray(rgb), "JPEG", quality=90)
    assert mae(ours(color, mode="L")[..., 0], pil_rgb(color, "L")) < 1.5


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(orientation: int):
    img = Image.fromarray(photo_like(40, 64, seed=orientation))
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(img, "JPEG", quality=95, exif=exif.tobytes())
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    got = ours(data)
    assert got.shape == want.shape
    assert mae(got, want) < 1.5


# --------------------------------------------------------------------------------------
# PNG and WebP


def test_png_variants_are_exact():
    rgb = photo_like(37, 53, seed=1)
    rgba = np.dstack([rgb, np.arange(37 * 53, dtype=np.uint8).reshape(37, 53)])
    cases = {
        "RGB": encode(Image.fromarray(rgb), "PNG"),
        "RGBA": encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "L": encode(Image.fromarray(rgb).convert("L"), "PNG"),
        "LA": encode(Image.fromarray(rgba, "RGBA").convert("LA"), "PNG"),
        "P": encode(Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "1": encode(Image.fromarray(rgb).convert("1"), "PNG"),
    }
    for name, data in cases.items():
        assert np.array_equal(ours(data), pil_rgb(data)), name
        assert np.array_equal(ours(data, mode="L")[..., 0], pil_rgb(data, "L")), name
    # 16 bit: the high byte of each sample.
    rgb16 = (photo_like(21, 30, seed=2).astype(np.uint16) * 257) ^ 0x5A
    assert np.array_equal(ours(write_png(rgb16, 16, 2)), (rgb16 >> 8).astype(np.uint8))
    gray16 = rgb16[..., 0]
    got = ours(write_png(gray16, 16, 0))
    assert np.array_equal(got, np.repeat((gray16 >> 8).astype(np.uint8)[..., None], 3, axis=2))


def test_webp_lossless_exact_and_lossy_close():
    rgb = photo_like(64, 80, seed=4)
    lossless = encode(Image.fromarray(rgb), "WEBP", lossless=True)
    assert np.array_equal(ours(lossless), rgb)
    rgba = np.dstack([rgb, np.full((64, 80), 200, np.uint8)])
    lossless_a = encode(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True)
    assert np.array_equal(ours(lossless_a), rgb)
    lossy = encode(Image.fromarray(rgb), "WEBP", quality=90)
    assert mae(ours(lossy), pil_rgb(lossy)) < 1.0


# --------------------------------------------------------------------------------------
# BMP


def bmp_top_down(bmp: bytes) -> bytes:
    """The same image stored top-down: negative height, rows in the other order."""
    (offset,) = struct.unpack_from("<I", bmp, 10)
    width, height = struct.unpack_from("<ii", bmp, 18)
    (bpp,) = struct.unpack_from("<H", bmp, 28)
    stride = (width * bpp + 31) // 32 * 4
    rows = [bmp[offset + i * stride : offset + (i + 1) * stride] for i in range(height)]
    head = bytearray(bmp[:offset])
    struct.pack_into("<i", head, 22, -height)
    return bytes(head) + b"".join(reversed(rows))


def bmp_rle8(index: np.ndarray, palette: np.ndarray) -> bytes:
    """An 8-bit RLE BMP (BI_RLE8) of palette indices, runs of up to 255 per row."""
    h, w = index.shape
    body = bytearray()
    for row in index[::-1]:  # bottom-up
        x = 0
        while x < w:
            run = 1
            while x + run < w and run < 255 and row[x + run] == row[x]:
                run += 1
            body += bytes([run, int(row[x])])
            x += run
        body += b"\0\0"  # end of line
    body[-2:] = b"\0\1"  # end of bitmap
    pal = b"".join(bytes([b, g, r, 0]) for r, g, b in palette)
    offset = 14 + 40 + len(pal)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(body), 0, 0, len(palette), 0)
    head = b"BM" + struct.pack("<IHHI", offset + len(body), 0, 0, offset)
    return head + info + pal + bytes(body)


def bmp_raw(
    rows: list[bytes], width: int, bpp: int, info: bytes, extra: bytes = b"", top_down: bool = False
) -> bytes:
    """A BMP of ``rows`` (top first, unpadded) after the info header ``info`` and ``extra``
    (bit masks, palette); rows are padded to 4 bytes and stored bottom-up unless asked."""
    stride = (width * bpp + 31) // 32 * 4
    order = rows if top_down else rows[::-1]
    body = b"".join(r + b"\0" * (stride - len(r)) for r in order)
    offset = 14 + len(info) + len(extra)
    return b"BM" + struct.pack("<IHHI", offset + len(body), 0, 0, offset) + info + extra + body


def bmp_info(w: int, h: int, bpp: int, compression: int = 0, colors: int = 0) -> bytes:
    """A BITMAPINFOHEADER (40 bytes)."""
    return struct.pack("<IiiHHIIiiII", 40, w, h, 1, bpp, compression, 0, 0, 0, colors, 0)


def more_bmp_variants(rgb: np.ndarray) -> dict[str, bytes]:
    """BMP variants Pillow cannot write: 16 bit (5-5-5, and 5-6-5 bit fields), 32-bit bit
    fields, an OS/2 header, RLE4."""
    h, w = rgb.shape[:2]
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    v555 = (r >> 3) << 10 | (g >> 3) << 5 | b >> 3
    v565 = (r >> 3) << 11 | (g >> 2) << 5 | b >> 3
    v888 = r << 16 | g << 8 | b
    masks565 = struct.pack("<III", 0xF800, 0x07E0, 0x001F)
    masks888 = struct.pack("<III", 0xFF0000, 0xFF00, 0xFF)
    core = struct.pack("<IHHHH", 12, w, h, 1, 24)
    quantized = Image.fromarray(rgb).quantize(8)
    index = np.asarray(quantized)
    palette = bytes(
        v for i in range(8) for v in (*quantized.getpalette()[3 * i : 3 * i + 3][::-1], 0)
    )
    rle4 = bytearray()
    for row in index[::-1]:
        x = 0
        while x < w:
            run = 1
            while x + run < w and run < 255 and row[x + run] == row[x]:
                run += 1
            rle4 += bytes([run, int(row[x]) << 4 | int(row[x])])
            x += run
        rle4 += b"\0\0"
    rle4[-2:] = b"\0\1"
    rle_info = bmp_info(w, h, 4, compression=2, colors=8)
    rle_info = rle_info[:20] + struct.pack("<I", len(rle4)) + rle_info[24:]
    return {
        "16-bit 5-5-5": bmp_raw(
            [x.astype("<u2").tobytes() for x in v555], w, 16, bmp_info(w, h, 16)
        ),
        "16-bit 5-6-5 bit fields": bmp_raw(
            [x.astype("<u2").tobytes() for x in v565], w, 16, bmp_info(w, h, 16, 3), masks565
        ),
        "32-bit bit fields": bmp_raw(
            [x.astype("<u4").tobytes() for x in v888], w, 32, bmp_info(w, h, 32, 3), masks888
        ),
        "OS/2 24-bit": bmp_raw([x[:, ::-1].tobytes() for x in rgb], w, 24, core),
        "RLE4": b"BM"
        + struct.pack("<IHHI", 14 + 40 + 32 + len(rle4), 0, 0, 14 + 40 + 32)
        + rle_info
        + palette
        + bytes(rle4),
    }


def test_bmp_variants_match_pillow():
    rgb = photo_like(37, 53, seed=12)  # 53 * 3 = 159-byte rows: padded to 160
    rgba = np.dstack([rgb, np.arange(37 * 53, dtype=np.uint8).reshape(37, 53)])
    cases = {
        "24-bit": encode(Image.fromarray(rgb), "BMP"),
        "32-bit": encode(Image.fromarray(rgba, "RGBA"), "BMP"),
        "8-bit palette": encode(
            Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE), "BMP"
        ),
        "8-bit gray": encode(Image.fromarray(rgb).convert("L"), "BMP"),
        "1-bit": encode(Image.fromarray(rgb).convert("1"), "BMP"),
    }
    cases["24-bit top-down"] = bmp_top_down(cases["24-bit"])
    cases["8-bit palette top-down"] = bmp_top_down(cases["8-bit palette"])
    quantized = Image.fromarray(rgb).quantize(16)  # few colours: long runs
    index = np.asarray(quantized)
    palette = np.array(quantized.getpalette()[: 16 * 3], np.uint8).reshape(16, 3)
    cases["8-bit RLE"] = bmp_rle8(index, palette)
    cases.update(more_bmp_variants(rgb))
    for name, data in cases.items():
        assert data[:2] == b"BM"
        want = pil_rgb(data)
        assert np.array_equal(ours(data), want), name
        assert np.array_equal(ours(data, mode="L")[..., 0], pil_rgb(data, "L")), name
    assert np.array_equal(ours(cases["24-bit"]), rgb)
    assert np.array_equal(ours(cases["24-bit top-down"]), rgb)
    assert np.array_equal(ours(cases["8-bit RLE"]), palette[index])
    # Resized like the other formats.
    got = ours(cases["24-bit"], size=(20, 30))
    want_r = np.asarray(Image.fromarray(rgb).resize((30, 20), Image.Resampling.BILINEAR))
    assert psnr(got, want_r) >= 50


def test_bmp_truncated_or_corrupt_errors_name_the_file(tmp_path: Path):
    data = encode(Image.fromarray(photo_like(30, 40, seed=13)), "BMP")
    for cut in (2, 14, 30, 54, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{cut}.bmp"
        p.write_bytes(data[:cut])
        with pytest.raises(ferrofeed.ImageDecodeError, match=re.escape(str(p))):
            fio.decode_image(p)
    with pytest.raises(ferrofeed.ImageDecodeError, match="truncated"):
        fio.decode_image(data[:-1])
    bad_depth = bytearray(data)
    bad_depth[28] = 7  # bits per pixel
    with pytest.raises(ferrofeed.ImageDecodeError, match=r"item 1.*BMP"):
        fio.load_images([data, bytes(bad_depth)], size=8)


# --------------------------------------------------------------------------------------
# geometry


@pytest.mark.parametrize(("h", "w", "out"), [(375, 500, (224, 224)), (217, 333, (100, 60))])
def test_resize_psnr_vs_pillow_bilinear(h: int, w: int, out: tuple[int, int]):
    rgb = photo_like(h, w, seed=5)
    png = encode(Image.fromarray(rgb), "PNG")
    want = np.asarray(Image.fromarray(rgb).resize(out[::-1], Image.Resampling.BILINEAR))
    got = ours(png, size=out)
    assert psnr(got, want) >= 50, psnr(got, want)
    jpg = encode(Image.fromarray(rgb), "JPEG", quality=95)
    want_j = np.asarray(Image.open(io.BytesIO(jpg)).resize(out[::-1], Image.Resampling.BILINEAR))
    assert psnr(ours(jpg, size=out, dct_scaling=False), want_j) >= 50
    assert psnr(ours(jpg, size=out), want_j) >= 35


def test_resize_shorter_center_crop_flip_like_torchvision_steps():
    rgb = photo_like(375, 500, seed=6)
    png = encode(Image.fromarray(rgb), "PNG")
    # torchvision: Resize(256) -> 341x256, CenterCrop(224): left = round(58.5) = 58, top = 16.
    step = Image.fromarray(rgb).resize((341, 256), Image.Resampling.BILINEAR)
    want = np.asarray(step)[16 : 16 + 224, 58 : 58 + 224]
    got = ours(png, resize_shorter=256, crop=224)
    assert got.shape == (224, 224, 3)
    assert psnr(got, want) >= 50
    flipped = ours(png, resize_shorter=256, crop=224, flip=True)
    assert np.array_equal(flipped, got[:, ::-1])
    # A crop larger than the image pads with zeros, centered.
    small = ours(encode(Image.fromarray(rgb[:10, :6]), "PNG"), crop=(14, 8))
    assert small.shape == (14, 8, 3)
    assert np.array_equal(small[2:12, 1:7], rgb[:10, :6])
    assert small[:2].max() == 0
    assert small[:, 0].max() == 0


def test_random_resized_crop_is_seeded():
    png = encode(Image.fromarray(photo_like(120, 160, seed=7)), "PNG")
    a = ours(png, crop="random", size=64, seed=11)
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, ours(png, crop="random", size=64, seed=11))
    assert any(not np.array_equal(a, ours(png, crop="random", size=64, seed=s)) for s in range(5))
    with pytest.raises(ValueError, match="size"):
        fio.decode_image(png, crop="random")


# --------------------------------------------------------------------------------------
# real photos (scikit-image's bundled samples)
#
# Measured (libjpeg-turbo build, Pillow 13 / libjpeg-turbo 3.2): decode MAE vs Pillow 0.000
# for every JPEG variant and for lossy WebP, exact for PNG, BMP and lossless WebP; gray output
# within 0.05 of Pillow's convert("L"). Resize to 224x224 vs Pillow's BILINEAR resize of its
# own decode: PSNR 55.7-58.9 dB from PNG, 56.1-58.8 dB from JPEG without DCT scaling (max
# difference 1); with DCT scaling, where it applies (astronaut 4/8: 41.0 dB, hubble 4/8:
# 50.3 dB, retina 2/8: 45.3 dB; the others decode at 8/8). Resize(256) + CenterCrop(224) vs
# the same steps in Pillow: 55.1-59.6 dB.

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "retina"]


def real_photo(name: str) -> np.ndarray:
    skimage_data = pytest.importorskip("skimage.data")
    arr = np.asarray(getattr(skimage_data, name)())
    assert arr.dtype == np.uint8
    assert arr.shape[2:] == (3,), (name, arr.shape)
    return arr


REAL_VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "jpeg-q75-420": ("JPEG", {"quality": 75, "subsampling": 2}),
    "jpeg-q95-420": ("JPEG", {"quality": 95, "subsampling": 2}),
    "jpeg-q75-444": ("JPEG", {"quality": 75, "subsampling": 0}),
    "jpeg-q95-444": ("JPEG", {"quality": 95, "subsampling": 0}),
    "jpeg-q90-progressive": ("JPEG", {"quality": 90, "progressive": True}),
    "png": ("PNG", {}),
    "webp-q90": ("WEBP", {"quality": 90}),
    "webp-lossless": ("WEBP", {"lossless": True}),
    "bmp": ("BMP", {}),
}


@pytest.mark.parametrize("variant", sorted(REAL_VARIANTS))
@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photos_decode_like_pillow(photo: str, variant: str):
    rgb = real_photo(photo)
    fmt, kw = REAL_VARIANTS[variant]
    data = encode(Image.fromarray(rgb), fmt, **kw)
    got = ours(data)
    want = pil_rgb(data)
    assert got.shape == rgb.shape
    if fmt in ("PNG", "BMP") or kw.get("lossless"):
        assert np.array_equal(got, want)
        assert np.array_equal(got, rgb)
    else:
        assert mae(got, want) < (1.5 if fmt == "JPEG" else 1.0)
    assert mae(ours(data, mode="L")[..., 0], pil_rgb(data, "L")) < 1.5


@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photos_resize_like_pillow(photo: str):
    rgb = real_photo(photo)
    out = (224, 224)
    png = encode(Image.fromarray(rgb), "PNG")
    want = np.asarray(Image.fromarray(rgb).resize(out[::-1], Image.Resampling.BILINEAR))
    assert psnr(ours(png, size=out), want) >= 50
    jpg = encode(Image.fromarray(rgb), "JPEG", quality=90)
    want_j = np.asarray(Image.open(io.BytesIO(jpg)).resize(out[::-1], Image.Resampling.BILINEAR))
    assert psnr(ours(jpg, size=out, dct_scaling=False), want_j) >= 50
    assert psnr(ours(jpg, size=out), want_j) >= 35
    # torchvision's eval transform, step by step in Pillow: Resize(256), CenterCrop(224).
    h, w = rgb.shape[:2]
    sh, sw = (256, w * 256 // h) if h <= w else (h * 256 // w, 256)
    step = np.asarray(Image.fromarray(rgb).resize((sw, sh), Image.Resampling.BILINEAR))
    top, left = round((sh - 224) / 2), round((sw - 224) / 2)
    want_c = step[top : top + 224, left : left + 224]
    assert psnr(ours(png, resize_shorter=256, crop=224), want_c) >= 50


@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photos_crop_decode_matches_a_full_decode(photo: str):
    # crop_decode (the default) decodes only the JPEG rows and iMCU columns the output reads:
    # against crop_decode=False, PSNR >= 40 dB on random resized crops (to several sizes, so
    # every DCT scale comes up) and center crops; measured: identical (PSNR inf).
    rgb = real_photo(photo)
    for kw in ({"quality": 90, "subsampling": 2}, {"quality": 80, "progressive": True}):
        jpg = encode(Image.fromarray(rgb), "JPEG", **kw)
        for seed in range(12):
            for t in (
                {"size": 224, "crop": "random", "seed": seed, "flip": seed % 2 == 1},
                {"size": (40, 56), "crop": "random", "seed": seed},
                {"resize_shorter": 64 + 16 * seed, "crop": 48 + 8 * seed},
            ):
                got = ours(jpg, **t)  # type: ignore[arg-type]
                want = ours(jpg, crop_decode=False, **t)  # type: ignore[arg-type]
                assert psnr(got, want) >= 40, (photo, kw, t)
    batch = fio.load_images([jpg] * 3, size=32, crop="random", seed=1, crop_decode=False)
    assert np.from_dlpack(batch).shape == (3, 32, 32, 3)
    assert ferrofeed.ops.decode_image(size=32, crop="random", crop_decode=False).name == (
        "decode_image"
    )


@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photos_png_crop_decode_is_exact(photo: str):
    # A PNG's crop decode reads only its rows down to the crop's last and keeps the crop's
    # columns: PNG is lossless, so the output is exactly the whole image's, here against
    # crop_decode=False and against a BMP of the same pixels (always decoded whole), on
    # PNGs Pillow wrote (its adaptive row filters) in RGB, RGBA, L and 16-bit gray.
    rgb = real_photo(photo)
    images = {
        "RGB": Image.fromarray(rgb),
        "RGBA": Image.fromarray(np.dstack([rgb, rgb[..., 1]])),
        "L": Image.fromarray(rgb).convert("L"),
        "I;16": Image.fromarray(rgb[..., 0].astype(np.uint16) * 257),
    }
    for kind, im in images.items():
        png = encode(im, "PNG")
        # (Pillow's BMP of 16-bit gray would not hold its high bytes: no BMP for it.)
        bmp = None if kind == "I;16" else encode(im, "BMP")
        for seed in range(6):
            for t in (
                {"size": 224, "crop": "random", "seed": seed, "flip": seed % 2 == 1},
                {"size": (40, 56), "crop": "random", "seed": seed, "mode": "L"},
                {"resize_shorter": 64 + 16 * seed, "crop": 48 + 8 * seed},
            ):
                got = ours(png, **t)  # type: ignore[arg-type]
                assert np.array_equal(got, ours(png, crop_decode=False, **t)), (kind, t)  # type: ignore[arg-type]
                if bmp is not None:
                    assert np.array_equal(got, ours(bmp, **t)), (kind, t)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# sources and batches


def test_sources_bytes_bytearray_memoryview_paths(tmp_path: Path):
    data = encode(Image.fromarray(photo_like(30, 40)), "PNG")
    p = tmp_path / "x.png"
    p.write_bytes(data)
    want = ours(data)
    for src in (bytearray(data), memoryview(data), str(p), p):
        assert np.array_equal(ours(src), want)
    with pytest.raises(TypeError):
        fio.decode_image(12)  # type: ignore[arg-type]


def test_load_images_equals_per_image_decode(tmp_path: Path):
    paths = []
    for i, (fmt, kw) in enumerate(
        [("JPEG", {"quality": 85}), ("PNG", {}), ("WEBP", {"lossless": True})] * 4
    ):
        p = tmp_path / f"img{i}.{fmt.lower()}"
        Image.fromarray(photo_like(90 + 7 * i, 120 - 3 * i, seed=i)).save(p, fmt, **kw)
        paths.append(p)
    kw2: dict[str, object] = {"size": (48, 40), "resize_shorter": 64, "crop": 56}
    batch = fio.load_images(paths, threads=3, **kw2)  # type: ignore[arg-type]
    arr = np.from_dlpack(batch)
    assert arr.shape == (12, 48, 40, 3)
    for i, p in enumerate(paths):
        assert np.array_equal(arr[i], ours(p, **kw2)), i
    # Seeded random crops: reproducible batches.
    r1 = np.from_dlpack(fio.load_images(paths, size=32, crop="random", seed=3)).copy()
    r2 = np.from_dlpack(fio.load_images(paths, size=32, crop="random", seed=3))
    assert np.array_equal(r1, r2)
    gray = np.from_dlpack(fio.load_images([str(p) for p in paths[:2]], size=16, mode="L"))
    assert gray.shape == (2, 16, 16, 1)
    assert np.from_dlpack(fio.load_images([], size=8)).shape == (0, 8, 8, 3)


def test_load_images_error_names_the_first_bad_item(tmp_path: Path):
    good = tmp_path / "good.png"
    Image.fromarray(photo_like(20, 20)).save(good)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ferrofeed.ImageDecodeError, match=r"bad\.jpg"):
        fio.load_images([good, bad, good], size=8)
    with pytest.raises(ferrofeed.ImageDecodeError, match="item 1"):
        fio.load_images([good.read_bytes(), b"junk"], size=8)
    with pytest.raises(ferrofeed.ImageReadError) as info:
        fio.load_images([good, tmp_path / "missing.png"], size=8)
    assert isinstance(info.value, OSError)
    assert info.value.filename == str(tmp_path / "missing.png")


FORK_CHILD = """
import os, sys, warnings
import numpy as np
import ferrofeed.io as fio
from forking import HUNG, wait_or_kill

warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a multi-threaded process
paths = sys.argv[1:]
want = np.from_dlpack(fio.load_images(paths, size=16, threads=2)).copy()
pid = os.fork()
if pid == 0:
    ok = False
    try:
        ok = bool(np.array_equal(np.from_dlpack(fio.load_images(paths, size=16, threads=2)), want))
    finally:
        os._exit(0 if ok else 1)
status = wait_or_kill(pid, 60, poll=0.05)
if status == HUNG:
    sys.exit("load_images hung in a forked child")
assert os.waitstatus_to_exitcode(status) == 0, status
# And the parent's pool still works.
assert np.array_equal(np.from_dlpack(fio.load_images(paths, size=16, threads=2)), want)
print("OK")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs os.fork")
def test_load_images_works_in_a_forked_child(tmp_path: Path) -> None:
    # The batch engine's CPU pool is made once per process: a child forked after the
    # parent used it has none of its threads, and must make its own (not hang).
    import subprocess

    paths = []
    for i in range(6):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(photo_like(30, 40, seed=i)).save(p)
        paths.append(str(p))
    r = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=TESTS_DIR,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK"


# --------------------------------------------------------------------------------------
# corrupt input


def corrupt_cases() -> list[tuple[str, bytes]]:
    rgb = photo_like(64, 64, seed=9)
    jpg = encode(Image.fromarray(rgb), "JPEG", quality=90)
    pjpg = encode(Image.fromarray(rgb), "JPEG", quality=90, progressive=True)
    png = encode(Image.fromarray(rgb), "PNG")
    webp = encode(Image.fromarray(rgb), "WEBP", quality=80)
    bmp = encode(Image.fromarray(rgb), "BMP")
    cases = [("empty", b""), ("garbage", bytes(range(256)) * 4), ("gif", b"GIF89a" + b"\0" * 64)]
    named = (("jpeg", jpg), ("progjpeg", pjpg), ("png", png), ("webp", webp), ("bmp", bmp))
    for name, data in named:
        for frac in (0.0, 0.01, 0.1, 0.5, 0.9, 0.99):
            cut = max(1, int(len(data) * frac)) if frac else 4
            cases.append((f"{name}-cut{frac}", data[:cut]))
        mangled = bytearray(data)
        mangled[len(data) // 3 : len(data) // 3 + 64] = b"\xff" * 64
        cases.append((f"{name}-mangled", bytes(mangled)))
    return cases


@pytest.mark.parametrize(
    ("name", "data"), corrupt_cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_corrupt_input_errors_cleanly(tmp_path: Path, name: str, data: bytes):
    # Mangled data may still decode (a JPEG scan with flipped bits is often "valid"); it
    # must never crash, and anything that fails raises ImageDecodeError naming the file.
    p = tmp_path / f"{name}.png"  # wrong extension on purpose for most: sniffed, not named
    p.write_bytes(data)
    error: ferrofeed.ImageDecodeError | None = None
    try:
        fio.decode_image(p, size=16)
    except ferrofeed.ImageDecodeError as e:
        error = e
    if error is None:
        assert "mangled" in name, f"{name} decoded without an error"
    else:
        assert str(p) in str(error)
        assert isinstance(error, ValueError)


def test_wrong_extension_is_fine_and_unknown_format_is_named(tmp_path: Path):
    p = tmp_path / "actually_png.jpg"
    p.write_bytes(encode(Image.fromarray(photo_like(8, 8)), "PNG"))
    assert ours(p).shape == (8, 8, 3)
    with pytest.raises(ferrofeed.ImageDecodeError, match=r"not a JPEG, PNG, WebP or BMP"):
        fio.decode_image(b"GIF89a" + b"\0" * 100)
    # "BM" alone is not enough: a BMP also has a known header size at byte 14.
    with pytest.raises(ferrofeed.ImageDecodeError, match=r"not a JPEG, PNG, WebP or BMP"):
        fio.decode_image(b"BM" + b"\0" * 100)


def test_random_bytes_never_crash():
    rng = np.random.default_rng(0)
    heads = [
        b"\xff\xd8\xff",
        b"\x89PNG\r\n\x1a\n",
        b"RIFF\0\0\0\0WEBPVP8 ",
        b"BM" + bytes(12) + b"\x28\0\0\0",
        b"",
    ]
    for i in range(300):
        tail = rng.integers(0, 256, int(rng.integers(0, 300)), np.uint8).tobytes()
        data = heads[i % len(heads)] + tail
        with pytest.raises(ferrofeed.ImageDecodeError):
            fio.decode_image(data, size=8)


# --------------------------------------------------------------------------------------
# the GIL


def test_decode_releases_the_gil():
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 256, (1500, 2000, 3), np.uint8)  # incompressible: slow to inflate
    data = encode(Image.fromarray(noise), "PNG", compress_level=1)
    calls = 10
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0)

    # With the GIL held for the whole decode, the other thread could run at most once per
    # switch interval (it gets the GIL only when the holder is forced to drop it), plus once
    # as each call returns; with the GIL released, it spins freely: ask for 20 times that
    # bound. A busy machine may starve the spinning thread for a while, so rounds are
    # repeated until one shows it (a held GIL never can), with a hang guard of 60 s.
    rounds = []
    deadline = time.monotonic() + 60
    t = threading.Thread(target=spin)
    t.start()
    try:
        while True:
            start_ticks = ticks
            t0 = time.perf_counter()
            for _ in range(calls):
                fio.decode_image(data, size=(150, 200))
            elapsed = time.perf_counter() - t0
            during = ticks - start_ticks
            held_bound = elapsed / sys.getswitchinterval() + calls
            rounds.append((during, round(elapsed, 3), held_bound))
            if during > 20 * held_bound:
                break
            assert time.monotonic() < deadline, rounds
    finally:
        stop.set()
        t.join()


def test_module_docstring_runs():
    import doctest

    res = doctest.testmod(fio)
    assert res.failed == 0
    assert res.attempted > 0
