"""Native pipeline ops: stages that run in Rust, never taking the GIL.

Pass them to `PipelineBuilder.pipe` like a function. When the first stage is native, the
source's paths (``str`` or ``os.PathLike``), ``bytes``, and ``(path, label)`` pairs become
native items as they are pulled, so a chain ``read_file -> decode_image -> collate`` runs
without touching the GIL until a batch reaches the consumer as a `ferrofeed.Tensor` (with
its labels as an int64 Tensor beside it).

Example:
    >>> from ferrofeed import PipelineBuilder, ops
    >>> p = PipelineBuilder().add_source(range(3)).pipe(ops.identity()).add_sink().build()
    >>> list(p)
    [0, 1, 2]
"""

from __future__ import annotations

from typing import Literal

from . import _core

__all__ = [
    "BatchLayout",
    "ImageSpec",
    "NativeOp",
    "collate",
    "decode_image",
    "identity",
    "read_file",
]

NativeOp = _core.NativeOp
ImageSpec = _core.ImageSpec
BatchLayout = _core.BatchLayout


def identity() -> NativeOp:
    """Pass items through unchanged (a native no-op, for measuring overhead).

    Example:
        >>> identity().name
        'identity'
    """
    return _core._op_identity()


def read_file() -> NativeOp:
    """Read each path's bytes (a ``(path, label)`` pair keeps its label).

    Errors are ``OSError`` naming the file.

    Example:
        >>> read_file().name
        'read_file'
    """
    return _core._op_read_file()


def decode_image(
    *,
    size: int | tuple[int, int] | None = None,
    mode: str = "RGB",
    resize_shorter: int | None = None,
    crop: int | tuple[int, int] | str | None = None,
    flip: bool | Literal["random"] = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    seed: int | None = None,
    dct_scaling: bool = True,
    crop_decode: bool = True,
) -> NativeOp:
    """Decode each item's bytes (or path) into an image, without the GIL.

    The transforms are those of `ferrofeed.io.decode_image` (orientation, resize, crop,
    flip).

    With ``crop="random"`` each image's crop is drawn from ``(seed, epoch, position)``: the
    pipeline's epoch (each `ferrofeed.PipelineBuilder.build` is the next one; ``build(epoch=
    k)`` sets it) and the item's position in the pipeline's source (0, 1, ...). So every
    epoch gets new crops, the same epoch built again gets the same ones, and neither the
    files' folder nor the threads' timing changes them. So is its mirroring with
    ``flip="random"`` (torchvision's ``RandomHorizontalFlip()``: probability 1/2,
    independent of the crop). Without ``seed`` each op draws a fresh one, so two ops (or
    two runs) crop differently. (The paths of a list the source yields, split by
    ``disaggregate()``, have no position of their own: they are keyed by their name.)
    The training transform ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` is
    ``decode_image(size=224, crop="random", flip="random")``. A corrupt image raises
    `ferrofeed.ImageDecodeError` naming the file (or is skipped with ``on_error="skip"``).

    The keywords become one `ImageSpec` (the same checks and errors as
    `ferrofeed.io.decode_image`); the op shows it as ``.spec``, and ``seed`` as ``.seed``
    (``None`` when not given).

    Example:
        >>> op = decode_image(resize_shorter=256, crop=224)
        >>> op.name, op.spec, op.seed
        ('decode_image', ImageSpec(resize_shorter=256, crop=(224, 224)), None)
    """
    spec = ImageSpec(
        size=size,
        resize_shorter=resize_shorter,
        crop=crop,
        flip=flip,
        scale=scale,
        ratio=ratio,
        mode=mode,
        dct_scaling=dct_scaling,
        crop_decode=crop_decode,
    )
    return _core._op_decode_image(spec, seed=seed)


def collate(
    batch_size: int | None = None,
    /,
    *,
    drop_last: bool = False,
    layout: str = "NHWC",
    dtype: str = "uint8",
    normalize: tuple[list[float], list[float]] | None = None,
    max_batches: int = 16,
    timeout: float | None = 60.0,
) -> NativeOp:
    """Group ``batch_size`` decoded images into one batch Tensor (natively).

    ``layout`` is ``"NHWC"`` or ``"NCHW"``; ``dtype`` ``"uint8"`` or ``"float32"`` (values
    in [0, 1], then ``(x - mean) / std`` per channel with ``normalize=(mean, std)``).
    Images with labels give ``(images, labels)``, labels an int64 Tensor. Batches come
    from a pool of at most ``2 * max_batches`` buffers, reused once the consumer frees
    them; when the consumer holds on to all of them, the next batch waits up to
    ``timeout`` seconds for one to come back (``None``: as long as it takes), then raises
    `PoolExhaustedError`.

    In a `DataLoader`, leave ``batch_size`` out: the loader's own is used (give it, and it
    must match). A pipeline needs it. Leave ``max_batches`` and ``timeout`` out there too:
    a `DataLoader` has batch buffers of its own (as many batches in flight as its threads
    need, plus ``prefetch``; its ``timeout`` bounds a stuck batch), and refuses them.

    ``layout``, ``dtype`` and ``normalize`` become one `BatchLayout`, shown as ``.layout``;
    the group size is ``.group_size`` and ``drop_last`` is ``.drop_last``.

    Example:
        >>> op = collate(32, drop_last=True)
        >>> op.group_size, op.drop_last, op.layout
        (32, True, BatchLayout())
        >>> collate(layout="NCHW").group_size  # the DataLoader's batch size, when used there
        0
    """
    spec = BatchLayout(layout=layout, dtype=dtype, normalize=normalize)
    return _core._op_collate(
        batch_size, layout=spec, drop_last=drop_last, max_batches=max_batches, timeout=timeout
    )
