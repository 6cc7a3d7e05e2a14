"""Collation: a list of samples to one batch of NumPy arrays, with errors that say where.

`default_collate` walks the samples of a batch field by field. Its errors name the *field
path* inside a sample (``sample['image'][1]``, ``sample.label``), what disagrees there (the
shapes, the types, a missing key, the lengths) and the batch *entries* each came from,
where NumPy alone says "all input arrays must have the same shape". Every such error (a
`TypeError`, `ValueError` or `KeyError`) carries two attributes:

* ``path``: the field path, e.g. ``"sample['image']"`` (``"sample"`` for the samples
  themselves);
* ``entries``: the positions in the batch (the list passed to `default_collate`) that the
  message names, sorted.

`describe_entries` turns those positions into dataset indices with a note on the exception,
for a loader that knows which sample each entry is. The checks that build the messages run
only once stacking has failed: the happy path pays nothing for them.

`collating_into` makes stacking write into memory of the caller's choice (a worker process's
shared slot, see `ferrofeed._workers`); elsewhere the batch goes to a pooled, 64-byte
aligned buffer for the common dtypes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from . import _core
from ._errors import CollateError, CollateKeyError, CollateTypeError, CollateValueError

__all__ = ["collating_into", "default_collate", "describe_entries"]

# dtypes a pooled, 64-byte aligned batch buffer can hold (what DLPack consumers take).
_POOLED_DTYPES = {"uint8", "int32", "int64", "float16", "float32"}

Alloc = Callable[[tuple[int, ...], Any], Any]
"""``alloc(shape, dtype)``: a new, writable NumPy array of that shape and dtype."""

# While a worker process's collate runs: allocates an array of (shape, dtype) in the shared
# slot the batch goes back in (see _workers), so stacking writes straight into it. A context
# variable: each thread sees its own (a new thread starts with the default, None).
_alloc: contextvars.ContextVar[Alloc | None] = contextvars.ContextVar(
    "ferrofeed_collate_alloc", default=None
)

_Tensor = _core.Tensor

# How many entries, and how many distinct values, one error message lists.
_MAX_ENTRIES = 4
_MAX_GROUPS = 4

# A field path: ("key", k) for sample[k] of a mapping, ("index", i) for sample[i] of a
# sequence, ("attr", name) for a named tuple's field. Rendered only for an error.
_Path = tuple[tuple[str, Any], ...]

_E = TypeVar("_E", bound=CollateError)


@contextlib.contextmanager
def collating_into(alloc: Alloc | None) -> Iterator[None]:
    """Within the block, `default_collate` stacks numeric arrays into ``alloc(shape, dtype)``.

    The setting is per thread (a `contextvars.ContextVar`): other threads collating at the
    same time keep the pooled buffers. Blocks nest; leaving one restores the setting before.

    Args:
        alloc: returns a new, writable NumPy array of the given shape and dtype (a worker's
            shared slot); ``None`` for the default, pooled buffers.

    Example:
        >>> import numpy as np
        >>> made = []
        >>> def alloc(shape, dtype):
        ...     made.append(np.empty(shape, dtype))
        ...     return made[-1]
        >>> with collating_into(alloc):
        ...     batch = default_collate([np.zeros(3), np.ones(3)])
        >>> batch is made[0]
        True
    """
    token = _alloc.set(alloc)
    try:
        yield
    finally:
        _alloc.reset(token)


def default_collate(samples: Sequence[Any]) -> Any:
    """Combine a list of samples into a batch, recursively, as NumPy arrays.

    Arrays, numbers and ferrofeed `Tensor` objects (what `ferrofeed.io.decode_image`
    returns; viewed by DLPack, without a copy) are stacked along a new first axis, into a pooled,
    64-byte aligned buffer for the common dtypes (or, in a worker process, straight into the
    shared slot the batch goes back in). Dicts, named tuples, tuples, lists and other
    sequences are collated field by field (a list of numbers is stacked like an array);
    strings and bytes are returned as a list.

    Args:
        samples: the samples of one batch (at least one); entry ``k`` of the batch is
            ``samples[k]``.

    Returns:
        The batch: the structure of the first sample, with a stacked array (or a list of
        strings) at each leaf.

    Raises:
        CollateTypeError: (a `TypeError`) a field of a type that cannot be collated
            (``None``, an arbitrary object), as PyTorch's ``default_collate`` does (pass
            your own ``collate`` for those); or entries whose types disagree at one field
            (an int beside a str, a dict beside a list), or dtypes that do not combine.
        CollateValueError: (a `ValueError`) arrays of different shapes at one field,
            sequences of different lengths, or no samples at all.
        CollateKeyError: (a `KeyError`) a dict sample without a key that the first sample
            has.

        All three are `CollateError`, and so `FerrofeedError`. Each (but the empty batch)
        names the field path, what disagrees and the batch entries, and has the attributes
        ``path`` (a str, e.g. ``"sample['image']"``) and ``entries`` (a tuple of the batch
        positions it names); see `describe_entries`.

    Example:
        >>> batch = default_collate([{"x": [1.0, 2.0], "y": 0}, {"x": [3.0, 4.0], "y": 1}])
        >>> batch["x"].shape, batch["y"].tolist()
        ((2, 2), [0, 1])
        >>> import numpy as np
        >>> try:
        ...     default_collate([{"x": np.zeros(2)}, {"x": np.zeros(3)}])
        ... except ValueError as e:
        ...     print(e)
        ...     print(e.path, e.entries)
        default_collate: cannot stack sample['x']: shapes differ: (2,) at entry 0; (3,) at entry 1
        sample['x'] (0, 1)
    """
    if len(samples) == 0:
        raise CollateValueError("default_collate: no samples to collate (an empty batch)")
    return _collate(samples, ())


def describe_entries(exc: BaseException, indices: Sequence[int]) -> None:
    """Add a note to a collate error saying which dataset index each entry it names is.

    For a loader that caught an error of `default_collate`: ``indices[k]`` is the dataset
    index of the batch's entry ``k`` (the samples passed to collate, after any skipped
    ones were left out). An exception without an ``entries`` attribute (from a collate of
    the user's own) is left as it is.

    Args:
        exc: the exception raised by the collate.
        indices: the dataset index of each sample given to the collate, in order.

    Example:
        >>> try:
        ...     default_collate([[1, 2], [3]])
        ... except ValueError as e:
        ...     describe_entries(e, [17, 4711])
        ...     print(e.__notes__[-1])
        in this batch, entry 0 is dataset[17] and entry 1 is dataset[4711]
    """
    entries = getattr(exc, "entries", None)
    if not isinstance(entries, tuple) or not entries:
        return
    named = [f"entry {k} is dataset[{indices[k]}]" for k in entries if 0 <= k < len(indices)]
    if named:
        exc.add_note(f"in this batch, {_join(named)}")


# -- the happy path -------------------------------------------------------------------------


def _collate(samples: Sequence[Any], path: _Path) -> Any:
    import numpy as np

    first = samples[0]
    if isinstance(first, Mapping):
        try:
            columns = {key: [s[key] for s in samples] for key in first}
        except Exception as e:
            _raise_explained(e, _mapping_error(samples, path))
        return {key: _collate(col, (*path, ("key", key))) for key, col in columns.items()}
    if isinstance(first, str | bytes):
        kind = str if isinstance(first, str) else bytes
        for s in samples:
            if not isinstance(s, kind):
                raise _mixed_types_error(samples, path)
        return list(samples)
    if (
        isinstance(first, np.ndarray | np.generic | int | float | complex | _Tensor)
        or hasattr(first, "__array__")
        or hasattr(first, "__dlpack__")
    ):
        return _stack(samples, path)
    if isinstance(first, Sequence):
        if isinstance(first, list) and all(isinstance(v, int | float) for v in first):
            return _stack(samples, path)
        n = len(first)
        try:
            same = all(len(s) == n for s in samples)
        except TypeError:  # an entry without a length
            same = False
        if not same:
            raise _sequence_error(samples, path)
        named = isinstance(first, tuple) and hasattr(type(first), "_fields")
        names: Sequence[str] = getattr(type(first), "_fields", ()) if named else ()
        fields = [
            _collate(list(column), (*path, ("attr", names[i]) if named else ("index", i)))
            for i, column in enumerate(zip(*samples, strict=True))
        ]
        if named:
            return type(first)(*fields)
        kind_: Any = type(first)
        if kind_ in (tuple, list):
            return kind_(fields)
        try:
            return kind_(fields)  # e.g. a deque
        except TypeError:  # a sequence type that cannot be built from a list
            return fields
    raise _unsupported_error(samples, path)


def _dlpack_only(x: Any) -> bool:
    """Whether ``x`` is an array to take by DLPack (a ferrofeed Tensor always is)."""
    return isinstance(x, _Tensor) or (hasattr(x, "__dlpack__") and not hasattr(x, "__array__"))


def _stack(samples: Sequence[Any], path: _Path) -> Any:
    import numpy as np

    try:
        convert = np.from_dlpack if _dlpack_only(samples[0]) else np.asarray
        return _stack_arrays([convert(a) for a in samples])
    except (TypeError, ValueError, RuntimeError, BufferError):
        pass
    # Something disagrees (or the entries are arrays of different kinds): look at each
    # entry on its own, and either explain what is wrong or stack what that gives.
    return _stack_arrays(_checked_arrays(samples, path))


class _MixedKinds(TypeError):
    """Entries of different kinds (numbers and strings) that NumPy would turn into text."""


def _stack_arrays(parts: list[Any]) -> Any:
    import numpy as np

    dtype = np.result_type(*parts)  # promotes as np.stack would: [1, 2.5] -> float64
    if dtype.kind not in "biufc" and any(p.dtype.kind != dtype.kind for p in parts):
        # np.stack would silently make [1, "a"] text, or [1, None] an object array.
        raise _MixedKinds
    shape = (len(parts), *parts[0].shape)
    alloc = _alloc.get()
    if alloc is not None and dtype.kind in "biufc" and parts[0].size > 0:
        out = alloc(shape, dtype)
        np.stack(parts, out=out)
        return out
    if dtype.name in _POOLED_DTYPES and parts[0].size > 0:
        # Straight into a 64-byte aligned, pooled buffer: JAX and torch then take the
        # batch by DLPack without a copy, and the buffer is reused once freed.
        out = np.from_dlpack(_core.empty(shape, dtype.name))
        np.stack(parts, out=out)
        return out
    return np.stack(parts).astype(dtype, copy=False)


# -- diagnosis, once something failed --------------------------------------------------------


def _raise_explained(original: BaseException, explained: BaseException | None) -> NoReturn:
    if explained is None:
        raise original
    raise explained from None


def _checked_arrays(samples: Sequence[Any], path: _Path) -> list[Any]:
    """Each entry as an array, or an error that says which entry and field disagree."""
    import numpy as np

    where = _render(path)
    arrays = []
    for k, s in enumerate(samples):
        try:
            arrays.append(np.from_dlpack(s) if _dlpack_only(s) else np.asarray(s))
        except Exception as e:
            cls: type[CollateError] = (
                CollateValueError if isinstance(e, ValueError) else CollateTypeError
            )
            hint = ""
            if isinstance(s, _Tensor) and s.dtype == "bfloat16":
                hint = " (NumPy has no bfloat16: pass collate= to batch these your own way)"
            raise _error(
                cls,
                f"cannot stack {where}: the {_type_name(s)} at entry {k} is not an array "
                f"NumPy can hold: {e}{hint}",
                where,
                [k],
            ) from e
    categories = ["number" if a.dtype.kind in "biufc" else a.dtype.kind for a in arrays]
    if len(set(categories)) > 1:
        raise _mixed_types_error(samples, path, arrays)
    shapes = [a.shape for a in arrays]
    if len(set(shapes)) > 1:
        text, entries = _groups([str(shape) for shape in shapes])
        raise _error(
            CollateValueError, f"cannot stack {where}: shapes differ: {text}", where, entries
        )
    try:
        np.result_type(*arrays)
    except TypeError:
        text, entries = _groups([str(a.dtype) for a in arrays])
        raise _error(
            CollateTypeError, f"cannot stack {where}: dtypes do not combine: {text}", where, entries
        ) from None
    return arrays


def _mapping_error(samples: Sequence[Any], path: _Path) -> BaseException | None:
    if not all(isinstance(s, Mapping) for s in samples):
        return _mixed_types_error(samples, path)
    where = _render(path)
    for key in samples[0]:
        missing = [k for k, s in enumerate(samples) if key not in s]
        if missing:
            text = _entries_text(missing)
            shown = _shown(missing)
            return _error(
                CollateKeyError,
                f"{where} has no key {key!r} at {text} (entry 0 has it)",
                where,
                [0, *shown],
            )
    return None


def _sequence_error(samples: Sequence[Any], path: _Path) -> BaseException:
    if not all(isinstance(s, Sequence) and not isinstance(s, str | bytes) for s in samples):
        return _mixed_types_error(samples, path)
    where = _render(path)
    text, entries = _groups([str(len(s)) for s in samples])
    return _error(
        CollateValueError,
        f"the sequences at {where} must have the same length in one batch, not: {text}",
        where,
        entries,
    )


def _unsupported_error(samples: Sequence[Any], path: _Path) -> CollateTypeError:
    where = _render(path)
    text, entries = _groups([_type_name(s) for s in samples])
    return _error(
        CollateTypeError,
        f"cannot collate {where}: {text}; samples must be arrays, numbers, strings, dicts or "
        "sequences of these (pass collate= to batch them your own way)",
        where,
        entries,
    )


def _mixed_types_error(
    samples: Sequence[Any], path: _Path, arrays: Sequence[Any] | None = None
) -> CollateTypeError:
    where = _render(path)
    if arrays is None:
        labels = [_type_name(s) for s in samples]
    else:
        labels = [_leaf_label(s, a) for s, a in zip(samples, arrays, strict=True)]
    text, entries = _groups(labels)
    return _error(CollateTypeError, f"{where} mixes types: {text}", where, entries)


def _error(cls: type[_E], message: str, where: str, entries: Sequence[int]) -> _E:
    exc = cls(f"default_collate: {message}")
    # Plain attributes of the instance (they travel with it when pickled, from a worker).
    vars(exc).update(path=where, entries=tuple(sorted(set(entries))))
    return exc


# -- wording --------------------------------------------------------------------------------


def _render(path: _Path) -> str:
    parts = ["sample"]
    for kind, value in path:
        parts.append(f".{value}" if kind == "attr" else f"[{value!r}]")
    return "".join(parts)


def _type_name(x: Any) -> str:
    cls = type(x)
    module = cls.__module__
    if module == "builtins":
        return str(cls.__qualname__)
    if module.startswith("ferrofeed."):
        module = "ferrofeed"
    return f"{module}.{cls.__qualname__}"


def _leaf_label(x: Any, array: Any) -> str:
    """A leaf's type, with the dtype of an array (``numpy.ndarray of float32``)."""
    if isinstance(x, int | float | complex | str | bytes) or x is None:
        return _type_name(x)
    return f"{_type_name(x)} of {array.dtype}"


def _shown(entries: Sequence[int]) -> list[int]:
    return list(entries[:_MAX_ENTRIES])


def _entries_text(entries: Sequence[int]) -> str:
    if len(entries) == 1:
        return f"entry {entries[0]}"
    if len(entries) <= _MAX_ENTRIES:
        return f"entries {_join([str(k) for k in entries])}"
    shown = ", ".join(str(k) for k in entries[:_MAX_ENTRIES])
    return f"entries {shown} and {len(entries) - _MAX_ENTRIES} more"


def _groups(labels: Sequence[str]) -> tuple[str, list[int]]:
    """``"A at entries 0, 1; B at entry 2"`` and the entries it names, for each entry's label."""
    groups: dict[str, list[int]] = {}
    for k, label in enumerate(labels):
        groups.setdefault(label, []).append(k)
    items = list(groups.items())
    texts = [f"{label} at {_entries_text(ks)}" for label, ks in items[:_MAX_GROUPS]]
    if len(items) > _MAX_GROUPS:
        texts.append(f"and {len(items) - _MAX_GROUPS} others")
    entries = [k for _, ks in items[:_MAX_GROUPS] for k in _shown(ks)]
    return "; ".join(texts), entries


def _join(words: Sequence[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"
