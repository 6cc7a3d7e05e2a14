"""A `DataLoader`'s arguments, checked: `Config`, what the loader and its source read.

`Config.check` makes one from the arguments as given, with the checks every kind of source
shares (numbers in range, names known, rank and world resolved, defaults filled in); the
checks that depend on the kind of source are `ferrofeed._sources.choose_source`'s, which
the loader runs first.
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypedDict

from . import _core
from ._output import Handoff, Output, Sharding, check_device, default_rank_and_world

__all__ = ["DEFAULT_SHUFFLE_WINDOW", "Arguments", "Config", "StartMethod"]

StartMethod = Literal["fork", "spawn", "forkserver"]

# Samples held for shuffling a sharded source when shuffle_window is not given.
DEFAULT_SHUFFLE_WINDOW = 2048


class Arguments(TypedDict):
    """A `DataLoader`'s arguments as given, but its ``source`` (see `DataLoader`)."""

    batch_size: int | None
    shuffle: bool
    seed: int
    drop_last: bool
    transform: Callable[[Any], Any] | _core.NativeOp | None
    collate: Callable[[list[Any]], Any] | _core.NativeOp | None
    num_threads: int | None
    prefetch: int
    rank: int | None
    world_size: int | None
    batches_per_epoch: int | None
    output: Output
    device: str | None
    sharding: Sharding | None
    device_prefetch: int
    on_error: Literal["raise", "skip"]
    max_failures: int | None
    progress: bool
    num_workers: int
    worker_start_method: StartMethod | None
    persistent_workers: bool
    worker_init_fn: Callable[[int], None] | None
    prefetch_factor: int
    timeout: float | None
    shuffle_window: int | None
    image: str | Sequence[str] | None
    label: str | None
    bucket_by: Callable[[Any], Any] | None
    batch_sampler: Iterable[Sequence[int]] | None


@dataclasses.dataclass(frozen=True)
class Config:
    """A `DataLoader`'s arguments, checked (see `DataLoader` for each).

    ``rank``, ``world_size``, ``num_threads`` and ``shuffle_window`` hold the values in
    effect (defaults resolved); ``transform`` and ``collate`` are as given (the source
    fills in their defaults).
    """

    batch_size: int | None
    shuffle: bool
    seed: int
    drop_last: bool
    transform: Callable[[Any], Any] | _core.NativeOp | None
    collate: Callable[[list[Any]], Any] | _core.NativeOp | None
    num_threads: int
    prefetch: int
    rank: int
    world_size: int
    batches_per_epoch: int | None
    output: Output
    device: str | None
    sharding: Sharding | None
    device_prefetch: int
    on_error: Literal["raise", "skip"]
    max_failures: int | None
    progress: bool
    num_workers: int
    worker_start_method: StartMethod | None
    persistent_workers: bool
    worker_init_fn: Callable[[int], None] | None
    prefetch_factor: int
    timeout: float | None
    shuffle_window: int
    image: str | Sequence[str] | None
    label: str | None
    bucket_by: Callable[[Any], Any] | None
    batch_sampler: Iterable[Sequence[int]] | None

    @property
    def batch(self) -> int:
        """Samples per batch; 1 with ``batch_size=None`` (each sample on its own)."""
        return self.batch_size or 1

    @property
    def skip(self) -> bool:
        """Whether a failing sample is skipped (``on_error="skip"``)."""
        return self.on_error == "skip"

    def plan_args(self) -> dict[str, Any]:
        """The keywords every core plan takes from the loader.

        `_core.EpochPlan` and `_core.ShardPlan` alike: the order's shuffle and seed, this
        rank's place, ``drop_last``.
        """
        return {
            "shuffle": self.shuffle,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }

    def handoff(self) -> Handoff:
        """How the loader hands its batches over (converted, placed on devices)."""
        return Handoff(self.output, self.device, self.sharding, self.device_prefetch)

    @property
    def pinned(self) -> bool:
        """Whether batches go to a CUDA device (their host memory is then page-locked)."""
        return self.device is not None and "cuda" in self.device

    @classmethod
    def check(cls, args: Arguments) -> Config:
        """Return the config of ``args``; refuse, in this order, the first one out of range.

        Raises:
            ValueError: a number out of range, or an unknown name.
            TypeError: a ``seed`` that is not an integer.
            ImportError: ``output``'s framework is not installed.
        """
        batch_size, max_failures = args["batch_size"], args["max_failures"]
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1 or None, not {batch_size!r}")
        if max_failures is not None and (not isinstance(max_failures, int) or max_failures < 0):
            raise ValueError(f"max_failures must be an int >= 0 or None, not {max_failures!r}")
        for name, value, low in (
            ("prefetch", args["prefetch"], 1),
            ("num_workers", args["num_workers"], 0),
            ("prefetch_factor", args["prefetch_factor"], 1),
            ("device_prefetch", args["device_prefetch"], 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, not {value!r}")
        batches_per_epoch = args["batches_per_epoch"]
        if batches_per_epoch is not None and (
            not isinstance(batches_per_epoch, int) or batches_per_epoch < 1
        ):
            raise ValueError(f"batches_per_epoch must be an int >= 1, not {batches_per_epoch!r}")
        seed: Any = args["seed"]
        try:
            seed = operator.index(seed)  # an int, or a NumPy integer
        except TypeError:
            raise TypeError(f"seed must be an int, not {type(seed).__name__}") from None
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), not {seed}")
        output, on_error, timeout = args["output"], args["on_error"], args["timeout"]
        if output not in ("numpy", "torch", "jax"):
            raise ValueError(f"output must be 'numpy', 'torch' or 'jax', not {output!r}")
        if output != "numpy":
            # Now, not at the first batch: without the framework this names the extra to
            # install (pip install 'ferrofeed[torch]').
            importlib.import_module(f"ferrofeed.{output}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if args["worker_start_method"] not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                "worker_start_method must be 'fork', 'spawn', 'forkserver' or None, not "
                f"{args['worker_start_method']!r}"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0 or None, not {timeout!r}")
        default_rank, default_world = default_rank_and_world()
        rank = default_rank if args["rank"] is None else args["rank"]
        world_size = default_world if args["world_size"] is None else args["world_size"]
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if args["device"] is not None:
            check_device(output, args["device"])
        if args["sharding"] is not None:
            _check_sharding(args, rank, world_size)
        return cls(
            batch_size=batch_size,
            shuffle=args["shuffle"],
            seed=seed,
            drop_last=args["drop_last"],
            transform=args["transform"],
            collate=args["collate"],
            num_threads=args["num_threads"] or min(os.cpu_count() or 2, 8),
            prefetch=args["prefetch"],
            rank=rank,
            world_size=world_size,
            batches_per_epoch=batches_per_epoch,
            output=output,
            device=args["device"],
            sharding=args["sharding"],
            device_prefetch=args["device_prefetch"],
            on_error=on_error,
            max_failures=max_failures,
            progress=args["progress"],
            num_workers=args["num_workers"],
            worker_start_method=args["worker_start_method"],
            persistent_workers=args["persistent_workers"],
            worker_init_fn=args["worker_init_fn"],
            prefetch_factor=args["prefetch_factor"],
            timeout=timeout,
            shuffle_window=args["shuffle_window"] or DEFAULT_SHUFFLE_WINDOW,
            image=args["image"],
            label=args["label"],
            bucket_by=args["bucket_by"],
            batch_sampler=args["batch_sampler"],
        )


def _check_sharding(args: Arguments, rank: int, world_size: int) -> None:
    """Refuse a ``sharding`` that the other arguments, or the sharding itself, rule out."""
    if args["output"] != "jax":
        raise ValueError(f"sharding= needs output='jax', not output={args['output']!r}")
    if args["device"] is not None:
        raise ValueError("give sharding= or device=, not both: the sharding names the devices")
    if args["batch_size"] is None:
        raise ValueError(
            "sharding= needs a batch_size: with batch_size=None each sample comes alone, "
            "with no batch axis to lay out over the devices"
        )
    if args["on_error"] == "skip":
        raise ValueError(
            "sharding= cannot take on_error='skip': a skipped sample shortens its batch, so "
            "the processes' parts of one global batch could differ in size"
        )
    from .jax import _check_sharding as check

    check(args["sharding"], args["batch_size"], rank, world_size)
