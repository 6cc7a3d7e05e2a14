"""Type stubs of the compiled core. Use the public names of `ferrofeed` instead."""

from collections.abc import Callable, Iterable, Sequence
from os import PathLike
from typing import Any, Literal, Self, final

import numpy as np
import numpy.typing as npt

# The arena, plans, seeds and sharded sources: in a stub of their own, re-exported here.
from ferrofeed._core_sources import (
    Arena as Arena,
    EpochPlan as EpochPlan,
    EpochPlanIterator as EpochPlanIterator,
    MixPlan as MixPlan,
    MixPlanIterator as MixPlanIterator,
    Permutation as Permutation,
    ShardPlan as ShardPlan,
    ShardPlanIterator as ShardPlanIterator,
    _ArenaBuffer as _ArenaBuffer,
    _IndexEntry as _IndexEntry,
    _OpenRequest as _OpenRequest,
    _Packer as _Packer,
    _PlanGroup as _PlanGroup,
    _read_index as _read_index,
    _remote_defaults as _remote_defaults,
    _remote_environment as _remote_environment,
    _remote_get as _remote_get,
    _remote_objects as _remote_objects,
    _remote_stats as _remote_stats,
    _RemoteShards as _RemoteShards,
    _scan_shards as _scan_shards,
    _ShardEpoch as _ShardEpoch,
    _ShardFeed as _ShardFeed,
    _ShardReader as _ShardReader,
    _ShardWindow as _ShardWindow,
    _ShuffleBuffer as _ShuffleBuffer,
    _swap_sample as _swap_sample,
    _write_index as _write_index,
    crop_seed as crop_seed,
    default_arena_dir as default_arena_dir,
    mix_seed as mix_seed,
    sample_seed as sample_seed,
    shuffle_order as shuffle_order,
    sweep as sweep,
)

__version__: str
build_profile: str
FORMAT_VERSION: int
cuda_feature: bool

@final
class NativeOp:
    """A native pipeline stage (see `ferrofeed.ops`)."""

    @property
    def name(self) -> str:
        """The op's name (the default stage name)."""
    @property
    def group_size(self) -> int | None:
        """For a grouping op (`ferrofeed.ops.collate`), the items per group."""
    @property
    def drop_last(self) -> bool | None:
        """For a grouping op, whether a last, short group is dropped."""
    @property
    def spec(self) -> ImageSpec | None:
        """`ferrofeed.ops.decode_image`'s image spec (``None`` for other ops)."""
    @property
    def seed(self) -> int | None:
        """`ferrofeed.ops.decode_image`'s ``seed=`` (``None`` when not given, or another op)."""
    @property
    def layout(self) -> BatchLayout | None:
        """`ferrofeed.ops.collate`'s batch layout (``None`` for other ops)."""

@final
class MapSpec:
    """A map stage handed to `Pipeline`: ``op`` applied to each item (internal)."""

    def __new__(
        cls,
        name: str,
        op: Callable[[Any], Any] | NativeOp,
        *,
        kind: Literal["sync", "async", "native"] = "sync",
        concurrency: int = 1,
        on_error: Literal["raise", "skip"] = "raise",
        max_failures: int | None = None,
        ordered: bool = True,
        timeout: float | None = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def op(self) -> Callable[[Any], Any] | NativeOp: ...
    @property
    def kind(self) -> Literal["sync", "async", "native"]: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def on_error(self) -> Literal["raise", "skip"]: ...
    @property
    def max_failures(self) -> int | None: ...
    @property
    def ordered(self) -> bool: ...
    @property
    def timeout(self) -> float | None: ...

@final
class AggregateSpec:
    """An aggregate stage handed to `Pipeline`: every ``size`` items become one (internal).

    ``combine`` is ``None`` (a list), a grouping `NativeOp` (``ops.collate``) or a callable
    given the group's list.
    """

    def __new__(
        cls,
        name: str,
        size: int,
        *,
        drop_last: bool = False,
        combine: NativeOp | Callable[[list[Any]], Any] | None = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def combine(self) -> NativeOp | Callable[[list[Any]], Any] | None: ...

@final
class AccumulateSpec:
    """A custom aggregation handed to `Pipeline` (SPDL's ``Aggregator``) (internal)."""

    def __new__(
        cls,
        name: str,
        accumulate: Callable[[Any], Any],
        flush: Callable[[], Any] | None = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def accumulate(self) -> Callable[[Any], Any]: ...
    @property
    def flush(self) -> Callable[[], Any] | None: ...

@final
class DisaggregateSpec:
    """A stage handed to `Pipeline` that sends on the elements of each item (internal)."""

    def __new__(cls, name: str) -> Self: ...
    @property
    def name(self) -> str: ...

@final
class ImageSpec:
    """What is done to every decoded image: one description, checked once.

    The keywords are those of `ferrofeed.io.decode_image` (without ``seed``, which is not
    part of the spec); every image entry point (`ferrofeed.io.decode_image`,
    `ferrofeed.io.load_images`, `ferrofeed.ops.decode_image`, the `DataLoader`'s image
    chain) turns its keywords into one, with the same errors. Specs compare and hash by
    value; the repr lists the keywords that differ from the defaults.

    Example:
        >>> from ferrofeed.ops import ImageSpec, decode_image
        >>> spec = ImageSpec(size=224, crop="random", flip="random")
        >>> spec
        ImageSpec(size=(224, 224), crop='random', flip='random')
        >>> spec.size, spec.crop, spec.scale
        ((224, 224), 'random', (0.08, 1.0))
        >>> decode_image(size=224, crop="random", flip="random").spec == spec
        True
    """

    def __new__(
        cls,
        *,
        size: int | tuple[int, int] | None = None,
        resize_shorter: int | None = None,
        crop: int | tuple[int, int] | str | None = None,
        flip: bool | Literal["random"] = False,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (0.75, 1.3333333333333333),
        mode: str = "RGB",
        dct_scaling: bool = True,
        crop_decode: bool = True,
    ) -> Self:
        """Check the options (``ValueError``; ``TypeError`` for a ``size`` of another type)."""
    @property
    def size(self) -> tuple[int, int] | None:
        """The output ``(height, width)``, or ``None``."""
    @property
    def resize_shorter(self) -> int | None:
        """The shorter side's length after the first resize, or ``None``."""
    @property
    def crop(self) -> tuple[int, int] | Literal["random"] | None:
        """A center crop's ``(height, width)``, ``"random"``, or ``None``."""
    @property
    def flip(self) -> bool | Literal["random"]:
        """``False``, ``True`` or ``"random"``."""
    @property
    def scale(self) -> tuple[float, float]:
        """Area fraction bounds of a random crop."""
    @property
    def ratio(self) -> tuple[float, float]:
        """Aspect ratio bounds of a random crop."""
    @property
    def mode(self) -> Literal["RGB", "L"]:
        """``"RGB"`` or ``"L"`` (``"gray"`` is read as ``"L"``)."""
    @property
    def dct_scaling(self) -> bool:
        """Whether a JPEG may be decoded at a reduced n/8 scale."""
    @property
    def crop_decode(self) -> bool:
        """Whether only the part of an image that the output reads is decoded."""
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        """The keywords that rebuild the spec (for `pickle` and `copy`)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class BatchLayout:
    """How a batch of images is laid out: `ferrofeed.ops.collate`'s keywords, checked once.

    ``layout`` is ``"NHWC"`` or ``"NCHW"``; ``dtype`` ``"uint8"`` or ``"float32"`` (values in
    [0, 1], then ``(x - mean) / std`` per channel with ``normalize=(mean, std)``, 1 or 3
    values each). Layouts compare and hash by value.

    Example:
        >>> from ferrofeed.ops import BatchLayout, collate
        >>> layout = BatchLayout(layout="NCHW", dtype="float32", normalize=([0.5], [0.25]))
        >>> layout
        BatchLayout(layout='NCHW', dtype='float32', normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
        >>> collate(layout="NCHW", dtype="float32", normalize=([0.5], [0.25])).layout == layout
        True
    """

    def __new__(
        cls,
        *,
        layout: str = "NHWC",
        dtype: str = "uint8",
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> Self:
        """Check the options (``ValueError``)."""
    @property
    def layout(self) -> Literal["NHWC", "NCHW"]:
        """``"NHWC"`` or ``"NCHW"``."""
    @property
    def dtype(self) -> Literal["uint8", "float32"]:
        """``"uint8"`` or ``"float32"``."""
    @property
    def normalize(
        self,
    ) -> tuple[tuple[float, float, float], tuple[float, float, float]] | None:
        """``(mean, std)``, three values each, or ``None``."""
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        """The keywords that rebuild the layout (for `pickle` and `copy`)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def _after_fork_in_child() -> None:
    """Mark pipelines built before a fork as the parent's (internal)."""

def _native_threads() -> tuple[int, int, int]:
    """(runtime threads, runtime tasks not finished, CPU pool threads) (internal).

    The runtime is the process's one: pipelines' stage tasks and remote fetches share it.
    """

def _cpu_pool_size() -> int:
    """The threads of the process's CPU pool, made if need be (internal)."""

def _op_read_file() -> NativeOp:
    """Return a native op that reads each path's bytes."""

def _op_decode_image(spec: ImageSpec, /, *, seed: int | None = None) -> NativeOp:
    """Return a native op that decodes images as ``spec`` says."""

def _op_collate(
    batch_size: int | None = None,
    /,
    *,
    layout: BatchLayout | None = None,
    drop_last: bool = False,
    max_batches: int = 16,
    timeout: float | None = 60.0,
) -> NativeOp:
    """Return a native op that collates images into batch tensors laid out as ``layout``."""

@final
class _Lanes:
    """A loader's decode threads, and their busy and idle time per pass (internal).

    The threads are the process's pool of ``threads`` threads.
    """

    def __new__(cls, threads: int) -> _Lanes: ...
    @property
    def threads(self) -> int: ...
    def start_pass(self) -> None:
        """Start a pass: the figures count from now."""
    def end_pass(self) -> None:
        """End the pass: the figures stop growing."""
    def stats(self) -> dict[str, Any]:
        """The pass's figures.

        ``threads``, ``wall_s``, ``busy_s``, ``idle_s``, ``busy``, ``batches``,
        ``in_flight`` and ``max_in_flight``.
        """

def _op_load_batch(
    decode: NativeOp,
    collate: NativeOp | None = None,
    *,
    seed: int,
    epoch: int,
    lanes: _Lanes,
    skip: bool,
    pool: BufferPool,
    batch_size: int,
    drop_last: bool,
) -> NativeOp:
    """Return DataLoader's batch op: a group of the epoch plan becomes one batch.

    Each item in is a `_PlanGroup` ``(batch_no, indices, files)``; each item out is
    ``(batch_no, indices, images, labels, skipped)``, ``skipped`` listing ``(dataset index,
    reason)``. Refuses
    (``ValueError``) a ``decode`` with a seed of its own, and a ``collate`` whose batch
    size or ``drop_last`` disagrees with ``batch_size`` and ``drop_last``.
    """

def _synthetic_jpeg(width: int, height: int, *, seed: int, quality: int = 85) -> bytes:
    """Return a synthetic photo-like JPEG (see `ferrofeed.samples.synthetic_jpeg`)."""

def _op_identity() -> NativeOp:
    """Return a native op that passes items through."""

@final
class _SlotRing:
    """Shared-memory batch slots (memfd) of the DataLoader's worker processes."""

    def __new__(cls) -> Self: ...
    def create(self) -> int:
        """Create a new free slot; return its number."""
    def acquire(self) -> int | None:
        """Take the lowest free slot for a worker, or None when all are in use."""
    def release(self, id: int) -> None:
        """Give back a dispatched slot that came back without a batch to lease."""
    def fd(self, id: int) -> int:
        """Return the slot's descriptor, owned by the ring."""
    def lease(self, id: int, nbytes: int) -> _SlotLease:
        """Lease the first ``nbytes`` of a dispatched slot to the consumer."""
    def pin_for_cuda(self) -> str | None:
        """Page-lock slots for CUDA from now on; None, or why it is unavailable."""
    def stats(self) -> dict[str, int | str | None]:
        """Return the counters (slots, free, dispatched, leased, bytes, leases, pinned...).

        ``pinned``: slots page-locked for CUDA; ``pin_error``: why one could not be, or None.
        """

@final
class _SlotLease:
    """A consumer's writable view of one slot's batch bytes (buffer protocol)."""

    @property
    def pinned(self) -> bool: ...
    @property
    def slot(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class Pipeline:
    """A built pipeline; iterate it, or use ``with pipeline.auto_stop():``."""

    def __new__(
        cls,
        source: Iterable[Any],
        stages: Iterable[MapSpec | AggregateSpec | AccumulateSpec | DisaggregateSpec],
        *,
        sink_buffer: int = 3,
        num_threads: int | None = None,
        runner: Any = None,
        report_interval: float | None = None,
        stall_warning: float | None = None,
        stage_hooks: Any = None,
        epoch: int = 0,
    ) -> Self: ...
    def start(self) -> None:
        """Start the pipeline's threads (iteration starts it too).

        A pipeline runs once: starting one that was started already raises `RuntimeError`.
        """
    @property
    def epoch(self) -> int:
        """The epoch the pipeline was built for (see `ferrofeed.PipelineBuilder.build`)."""
    def stop(self) -> None:
        """Stop every stage and join every thread; idempotent; returns within about 0.25 s.

        A thread still inside a call of user code (a stage function, the source's
        ``next``) after 0.25 s cannot be interrupted (a Python ``time.sleep`` cannot be):
        it is left to finish on its own, its result discarded, and ends when the call
        returns (logged at INFO on ``ferrofeed.pipeline``, naming the threads). Every
        other thread the pipeline owns is joined before ``stop`` returns. Ctrl-C while
        iterating stops the pipeline this way before `KeyboardInterrupt` reaches you.

        The finished items the consumer has not read yet (those in the sink's buffer) stay
        readable: iterating yields them, then ends. In a forked child it touches nothing of
        the parent's (runtime, threads, event loop): they are forgotten.
        """
    def __iter__(self) -> Self: ...
    def __next__(self) -> Any:
        """Return the next item; waits in short GIL-free slices, so Ctrl-C works.

        When a stage or the source fails, every item before the failing one (in output
        order) comes first, then `ferrofeed.PipelineError`.
        """
    @property
    def finished(self) -> bool:
        """Whether every item was delivered, or the pipeline stopped or failed."""
    def stats(self) -> dict[str, dict[str, float]]:
        """Return per-stage figures, keyed by stage name (source first, sink last)."""
    def stats_table(self) -> str:
        """Return the per-stage figures as a printable table."""
    def auto_stop(self) -> Self:
        """Return a context manager that starts on entry, stops and joins on exit."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class Tensor:
    """A tensor in a pooled, 64-byte aligned host buffer, exported by DLPack.

    Hand it to any framework without a copy: ``np.from_dlpack(t)``, ``torch.from_dlpack(t)``,
    ``jax.dlpack.from_dlpack(t)``, or `ferrofeed.to_numpy` / `ferrofeed.to_torch` /
    `ferrofeed.to_jax`. The memory stays valid for as long as any of those views lives, and
    goes back to its pool when the last one (and the tensor) is gone.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """Extents."""
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (as in DLPack and PyTorch, not bytes as in NumPy)."""
    @property
    def dtype(self) -> str:
        """``"uint8"``, ``"int32"``, ``"int64"``, ``"float16"``, ``"bfloat16"`` or ``"float32"``."""
    @property
    def device(self) -> str:
        """``"cpu"`` (pinned memory is host memory too)."""
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def pinned(self) -> bool:
        """Whether the memory is page-locked (CUDA pinned), for fast copies to the GPU."""
    @property
    def data_ptr(self) -> int:
        """Address of the first element (64-byte aligned)."""
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of this tensor, as the array API standard specifies.

        Versioned (``"dltensor_versioned"``) when ``max_version >= (1, 0)``, legacy
        (``"dltensor"``) otherwise. ``copy=True`` exports a fresh copy; ``copy=False`` or
        ``None`` shares the memory. ``dl_device`` may be the CPU (or CUDA host memory, for a
        pinned tensor); host memory has no stream, so ``stream`` must be None or -1.

        Raises:
            DLPackError: (a `BufferError`) the request cannot be met.
        """
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: ``(1, 0)``, kDLCPU."""
    def numpy(self) -> npt.NDArray[np.generic]:
        """A NumPy array viewing the same memory (imports NumPy)."""
    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        """NumPy's array protocol: ``np.asarray(t)`` views the same memory.

        NumPy 2's ``copy``: None copies only to convert to ``dtype``, True always copies,
        False never does (a ValueError when ``dtype`` would need a copy). ``np.array(t)``
        copies, as it does for any array.

        Example:
            >>> import numpy as np
            >>> import ferrofeed
            >>> t = ferrofeed.zeros((2, 3), "uint8", pool=ferrofeed.BufferPool(1, pinned=False))
            >>> a = np.asarray(t)
            >>> a.ctypes.data == t.data_ptr, a.shape, a.dtype
            (True, (2, 3), dtype('uint8'))
            >>> np.asarray(t, dtype="float32").dtype
            dtype('float32')
        """

@final
class BufferPool:
    """A bounded pool of 64-byte aligned host buffers, pinned when a CUDA driver is present.

    At most ``max_buffers`` buffers exist at once (None: no bound). When all are in use,
    making a tensor waits (releasing the GIL, Ctrl-C works) for one to be freed, up to
    ``timeout`` seconds (None: for ever), then raises `PoolExhaustedError`. ``pinned``:
    None pins when a CUDA driver can be loaded (and so initializes CUDA: create the pool
    after forking worker processes), True requires it (`PinnedMemoryError` otherwise),
    False never pins.
    """

    def __new__(
        cls,
        max_buffers: int | None = 64,
        *,
        max_idle: int | None = None,
        pinned: bool | None = None,
        timeout: float | None = 30.0,
    ) -> BufferPool: ...
    def empty(self, shape: int | Sequence[int], dtype: str = "float32") -> Tensor:
        """An uninitialized tensor (a reused buffer keeps its old bytes)."""
    def zeros(self, shape: int | Sequence[int], dtype: str = "float32") -> Tensor:
        """A tensor of zeros."""
    def stats(self) -> dict[str, int]:
        """Counters and gauges of the pool.

        ``allocated``, ``in_use``, ``idle``, ``bytes``, ``pinned`` (buffers now);
        ``allocations``, ``reuses``, ``releases``, ``evictions`` (counts so far).
        """
    def clear(self) -> None:
        """Free every idle buffer."""
    @property
    def max_buffers(self) -> int | None: ...
    @property
    def max_idle(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def pinned(self) -> bool | None:
        """The ``pinned`` setting (None: when available)."""

def default_pool() -> BufferPool:
    """The pool of `empty` and `zeros`: unbounded, 16 idle buffers kept, never pinned."""

def empty(
    shape: int | Sequence[int], dtype: str = "float32", *, pool: BufferPool | None = None
) -> Tensor:
    """An uninitialized tensor from ``pool`` (default: `default_pool`)."""

def zeros(
    shape: int | Sequence[int], dtype: str = "float32", *, pool: BufferPool | None = None
) -> Tensor:
    """A tensor of zeros from ``pool`` (default: `default_pool`)."""

def pinned_memory_status() -> tuple[bool | None, str | None]:
    """(available, reason): None while no pool has asked for pinned memory yet."""

ImageSource = bytes | bytearray | memoryview | str | PathLike[str]

def set_max_image_pixels(pixels: int) -> int:
    """Set the pixel budget per image (width x height); return the previous one.

    The budget holds for every later decode in this process. An image whose header
    announces more pixels fails with `ImageDecodeError` (naming the file) before anything
    is allocated for it. The default, 178956970, is Pillow's decompression-bomb limit; at
    most ``2**32``.

    Example:
        >>> import ferrofeed.io
        >>> old = ferrofeed.io.set_max_image_pixels(4096 * 4096)
        >>> ferrofeed.io.get_max_image_pixels()
        16777216
        >>> _ = ferrofeed.io.set_max_image_pixels(old)
    """

def get_max_image_pixels() -> int:
    """The pixel budget per image (see `set_max_image_pixels`)."""

def decode_image(
    src: ImageSource,
    /,
    *,
    size: int | tuple[int, int] | None = None,
    mode: Literal["RGB", "L", "gray"] = "RGB",
    resize_shorter: int | None = None,
    crop: int | tuple[int, int] | Literal["random"] | None = None,
    flip: bool | Literal["random"] = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (0.75, 1.3333333333333333),
    seed: int | None = None,
    dct_scaling: bool = True,
    crop_decode: bool = True,
    pool: BufferPool | None = None,
) -> Tensor:
    """Decode one JPEG, PNG, WebP or BMP image into a ``(H, W, C)`` uint8 tensor.

    The file is read and the image decoded with the GIL released. The format is recognized
    from the bytes, never from the file name. Steps, in order: JPEG EXIF orientation,
    ``resize_shorter``, ``crop``, ``size``, ``flip``, all done as one resample into the
    output (antialiased bilinear, as Pillow's ``BILINEAR``).

    Args:
        src: Encoded bytes (``bytes``, ``bytearray``, ``memoryview``) or a path.
        size: The output ``(height, width)`` (an int for a square); ``None`` keeps the size.
        mode: ``"RGB"`` (3 channels; alpha dropped) or ``"L"`` (1 channel of luma).
        resize_shorter: Resize so the shorter side has this length first (torchvision's
            ``Resize(int)``).
        crop: ``(height, width)`` (or an int) for torchvision's ``CenterCrop`` (padding with
            zeros when larger than the image), or ``"random"`` for ``RandomResizedCrop``
            (needs ``size``; bounds ``scale`` and ``ratio``; reproducible with ``seed``).
        flip: Mirror left-right: ``True``, or ``"random"`` for torchvision's
            ``RandomHorizontalFlip()`` (each image mirrored with probability 1/2, drawn
            from ``seed`` independently of the crop).
        scale: Area fraction bounds of the random crop.
        ratio: Aspect ratio bounds of the random crop.
        seed: Seed of the random crop and flip. ``None``: inside a `DataLoader`'s
            ``dataset[i]`` or ``transform``, the sample's own (from the loader's seed, the
            epoch and the sample's index: the crop and flip the native image chain draws
            for that sample); elsewhere a fresh one.
        dct_scaling: Let libjpeg-turbo decode a JPEG at a reduced n/8 scale that still
            covers the output (much faster for large photos, slightly different pixels).
        crop_decode: Decode only the part of a JPEG that the output reads (the rows and
            8- to 32-pixel columns under the crop; faster for crops, the same pixels as a
            full decode in the tests on real photos), and of a non-interlaced PNG only the
            rows down to the crop's last (the same pixels exactly). ``False`` decodes every
            pixel. WebP and BMP images are always decoded whole.
        pool: The `BufferPool` of the tensor (default: `default_pool`).

    Returns:
        A `Tensor` of shape ``(H, W, 3)`` or ``(H, W, 1)``, dtype uint8.

    Raises:
        ImageDecodeError: Empty, truncated, corrupt or unsupported data; the message names
            the file (or ``<bytes>``).
        ImageReadError: The file cannot be read.
        ValueError: Invalid arguments.

    Example:
        >>> import ferrofeed.io, numpy as np
        >>> t = ferrofeed.io.decode_image(
        ...     "photo.jpg", resize_shorter=256, crop=224
        ... )  # doctest: +SKIP
        >>> np.from_dlpack(t).shape  # doctest: +SKIP
        (224, 224, 3)
    """

def load_images(
    sources: Iterable[ImageSource],
    /,
    *,
    size: int | tuple[int, int],
    mode: Literal["RGB", "L", "gray"] = "RGB",
    resize_shorter: int | None = None,
    crop: int | tuple[int, int] | Literal["random"] | None = None,
    flip: bool | Literal["random"] = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (0.75, 1.3333333333333333),
    seed: int | None = None,
    dct_scaling: bool = True,
    crop_decode: bool = True,
    threads: int | None = None,
    pool: BufferPool | None = None,
) -> Tensor:
    """Decode images in parallel into one ``(N, H, W, C)`` uint8 batch.

    Each image is decoded, transformed (as `decode_image`, with the same arguments) and
    written straight into its slot of one pooled buffer, by up to ``threads`` threads (the
    calling one and threads of ferrofeed's CPU pool, made once per process; default: one
    per CPU), with the GIL released. With ``crop="random"`` or ``flip="random"``, item ``i``
    gets the seed ``mix_seed(seed, 0, i, "crop")`` (its flip draws from it through the
    ``"flip"`` stream), so a seeded batch is reproducible.

    Args:
        sources: Paths or encoded bytes.
        size: The output ``(height, width)`` of every image (an int for a square).
        mode: ``"RGB"`` or ``"L"``.
        resize_shorter: As in `decode_image`.
        crop: As in `decode_image`.
        flip: As in `decode_image`.
        scale: As in `decode_image`.
        ratio: As in `decode_image`.
        seed: As in `decode_image`.
        dct_scaling: As in `decode_image`.
        crop_decode: As in `decode_image`.
        threads: Images decoded at once (default: the number of CPUs; at most one per
            image, and at most the CPU pool's threads).
        pool: The `BufferPool` of the batch (default: `default_pool`).

    Returns:
        A `Tensor` of shape ``(N, H, W, C)``, dtype uint8.

    Raises:
        ImageDecodeError: An image cannot be decoded; the message names its path (or
            ``item i``). The first failing item is raised; no partial batch is returned.
        ImageReadError: A file cannot be read.
        ValueError: Invalid arguments.

    Example:
        >>> import ferrofeed.io, torch
        >>> batch = ferrofeed.io.load_images(["a.jpg", "b.png"], size=224)  # doctest: +SKIP
        >>> torch.from_dlpack(batch).permute(0, 3, 1, 2).shape  # doctest: +SKIP
        torch.Size([2, 3, 224, 224])
    """
