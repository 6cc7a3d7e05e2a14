"""The one sample-seed rule: every random draw of a sample comes from (seed, epoch, index).

A `DataLoader` runs each sample's ``dataset[i]`` and ``transform`` inside `sample_scope`,
on whichever thread or worker process loads it. Inside:

- `sample_rng` returns a NumPy ``Generator`` seeded for the sample;
- ``ferrofeed.io.decode_image(..., crop="random", flip="random")`` without ``seed=`` draws
  the crop and flip the native image chain draws for the same sample;
- where one thread loads at a time (a worker process, or ``num_threads=1``), Python's
  `random`, NumPy's global generator and torch's are seeded for the sample too.

The global generators are one per process: with several loading threads they cannot hold
one sample's state each, so there the loader leaves them alone; `sample_rng` works on any
number of threads.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

from . import _core

__all__ = ["sample_rng"]


class _Sample:
    """The sample being loaded on this thread: the loader's seed, the epoch, its index."""

    __slots__ = ("epoch", "index", "rng", "seed")

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        self.seed = seed
        self.epoch = epoch
        self.index = index
        self.rng: Any = None


_local = threading.local()


def _current() -> _Sample | None:
    sample: _Sample | None = getattr(_local, "sample", None)
    return sample


@contextlib.contextmanager
def sample_scope(seed: int, epoch: int, index: int, *, seed_globals: bool) -> Iterator[None]:
    """Load sample ``index`` of ``epoch`` under the loader's ``seed`` on this thread.

    ``seed_globals``: also seed `random`, NumPy's global generator and torch's (only where
    this thread is the only one loading samples in its process).
    """
    if seed_globals:
        seed_generators(_core.sample_seed(seed, epoch, index))
    outer = _current()
    _local.sample = _Sample(seed, epoch, index)
    # io.decode_image without seed= reads this thread's sample in Rust, and draws the
    # crop and flip of `_core.crop_seed(seed, epoch, index)`: the native chain's.
    outer_native = _core._swap_sample((seed, epoch, index))
    try:
        yield
    finally:
        _local.sample = outer
        _core._swap_sample(outer_native)


def seed_generators(seed: int) -> None:
    """Seed `random`, NumPy's global generator and torch's (when imported) with ``seed``."""
    random.seed(seed)
    # Only modules already imported (or being imported: `import` then waits until another
    # thread's import of it is complete, where sys.modules would give it half made).
    if "numpy" in sys.modules:
        import numpy as np

        # NumPy's legacy global generator takes 32-bit seeds (a longer one costs 6x more).
        np.random.seed(seed >> 32)
    if "torch" in sys.modules:
        import torch

        # The CPU generator only: torch.manual_seed also reseeds every accelerator
        # backend, 100x the cost (and a forked worker must not touch CUDA).
        torch.default_generator.manual_seed(seed)


def sample_rng() -> Any:
    """Return a NumPy random ``Generator`` seeded for the sample being loaded.

    Call it in a `DataLoader`'s ``dataset[i]`` or ``transform``: the generator is seeded
    from the loader's ``seed``, the epoch and the sample's dataset index, so a sample
    draws the same numbers on any number of threads or worker processes, and in a
    resumed run; the next epoch draws others. Within one sample every call returns the
    same generator (its draws go on from one call to the next).

    Python's `random` and NumPy's global generator are one per process: a loader seeds
    them per sample only where one thread loads at a time (worker processes, or
    ``num_threads=1``); `sample_rng` is what works on several threads.

    Raises:
        RuntimeError: called outside a sample being loaded by a `DataLoader`.

    Example:
        >>> import ferrofeed
        >>> def jitter(x):
        ...     return x + ferrofeed.sample_rng().normal()
        >>> loader = ferrofeed.DataLoader([0.0] * 4, batch_size=2, transform=jitter, seed=1)
        >>> first = [b.tolist() for b in loader.epoch_batches(0)]
        >>> first == [b.tolist() for b in loader.epoch_batches(0)]
        True
    """
    sample = _current()
    if sample is None:
        raise RuntimeError(
            "sample_rng() gives the generator of the sample a DataLoader is loading: call it "
            "inside the DataLoader's dataset[i] or transform"
        )
    if sample.rng is None:
        import numpy as np

        seed = _core.sample_seed(sample.seed, sample.epoch, sample.index)
        sample.rng = np.random.Generator(np.random.PCG64(seed))
    return sample.rng
