"""Decode images (JPEG, PNG, WebP, BMP) straight into pooled tensors, with the GIL released.

`decode_image` decodes one image to a ``(H, W, C)`` uint8 `ferrofeed.Tensor`;
`load_images` decodes many, in parallel, into one ``(N, H, W, C)`` batch. Both honour JPEG
EXIF orientation and take the same transform arguments, applied in this order: orientation,
``resize_shorter``, ``crop``, ``size``, ``flip``. Resizing is antialiased bilinear, as
Pillow's ``Image.resize(..., Image.BILINEAR)``.

No input aborts the process: an image whose header announces more pixels than the budget
(`set_max_image_pixels`, default 178956970, Pillow's decompression-bomb limit), a file too
short for the size it claims, or an image whose buffers cannot be allocated is an
`ImageDecodeError` naming the file. The budget applies to every decode in the process
(`decode_image`, `load_images`, the decode ops of pipelines and `DataLoader`).

Example:
    >>> import ferrofeed.io
    >>> png = bytes.fromhex(  # a 1x1 red PNG
    ...     "89504e470d0a1a0a0000000d494844520000000100000001080200000090"
    ...     "7753de0000000c49444154789c63f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
    ... )
    >>> t = ferrofeed.io.decode_image(png, size=(2, 3))
    >>> t.shape, t.numpy()[0, 0].tolist()
    ((2, 3, 3), [255, 0, 0])
"""

from __future__ import annotations

from ._core import decode_image, get_max_image_pixels, load_images, set_max_image_pixels
from ._errors import ImageDecodeError, ImageError, ImageReadError

__all__ = [
    "ImageDecodeError",
    "ImageError",
    "ImageReadError",
    "decode_image",
    "get_max_image_pixels",
    "load_images",
    "set_max_image_pixels",
]
