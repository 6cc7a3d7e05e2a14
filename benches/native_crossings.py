"""Count the crossings between Python and Rust per batch on the DataLoader's native path.

Runs the training job's native chain (RandomResizedCrop 224 + flip, batches of 32) for an
epoch over generated JPEGs, with a profile hook on every thread that counts, per batch:

- calls from Python into ``ferrofeed._core`` (functions and methods of its classes), by
  name: where a batch (or a group of files) goes into Rust or comes back out;
- the Python functions of ferrofeed that ran, by name, to show where the time in Python
  goes.

Usage: ``python benches/native_crossings.py [--images N] [--output numpy|torch]``. It prints
one table; BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
from typing import Any

import ferrofeed
from ferrofeed import DataLoader, ops
from ferrofeed.samples import image_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--output", choices=["numpy", "torch"], default="numpy")
    args = parser.parse_args()

    root = tempfile.mkdtemp()
    image_folder(root, args.images, classes=4)
    loader = DataLoader(
        root,
        batch_size=args.batch_size,
        shuffle=True,
        seed=0,
        num_threads=2,
        transform=ops.decode_image(size=224, crop="random", flip="random"),
        output=args.output,
    )
    core_calls: collections.Counter[str] = collections.Counter()
    py_calls: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    core = ferrofeed._core

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            module = getattr(arg, "__module__", None) or getattr(type(owner), "__module__", None)
            if module == core.__name__:
                name = getattr(arg, "__qualname__", None) or arg.__name__
                if owner is not None and not isinstance(owner, type(core)):
                    name = f"{type(owner).__name__}.{arg.__name__}"
                with lock:
                    core_calls[name] += 1
        elif event == "call" and "ferrofeed" in frame.f_code.co_filename:
            with lock:
                py_calls[frame.f_code.co_qualname] += 1

    # What goes into the pipeline (its source's items: each crosses into Rust) and what
    # comes out of it (each crosses back), counted around the executor's own pipeline.
    crossed = collections.Counter[str]()
    real_builder = ferrofeed._executors.PipelineBuilder

    class CountingBuilder(real_builder):  # type: ignore[misc,valid-type]
        def add_source(self, source: Any, /) -> Any:
            def counted() -> Any:
                for item in source:
                    crossed["into Rust (source items)"] += 1
                    yield item

            return super().add_source(counted())

        def build(self, *a: Any, **kw: Any) -> Any:
            pipeline = super().build(*a, **kw)

            class Out:
                def __iter__(self) -> Any:
                    for item in pipeline:
                        crossed["out of Rust (sink items)"] += 1
                        yield item

                def __getattr__(self, name: str) -> Any:
                    return getattr(pipeline, name)

            return Out()

    ferrofeed._executors.PipelineBuilder = CountingBuilder  # type: ignore[misc]
    list(loader.epoch_batches(0))  # warm: threads and pools made
    crossed.clear()
    threading.setprofile(hook)
    sys.setprofile(hook)
    batches = 0
    for batch in loader.epoch_batches(1):
        batches += 1
        del batch
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]

    print(f"{batches} batches of {args.batch_size}, output={args.output}")
    print("Python objects crossing per batch:")
    for name, n in crossed.most_common():
        print(f"  {n / batches:6.2f}  {name}")
    print("calls into ferrofeed._core per batch (from the consumer's thread):")
    for name, n in core_calls.most_common():
        print(f"  {n / batches:6.2f}  {name}")
    print("ferrofeed's Python functions run per batch:")
    for name, n in py_calls.most_common(25):
        print(f"  {n / batches:6.2f}  {name}")


if __name__ == "__main__":
    main()
