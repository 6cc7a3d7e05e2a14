"""`ferrofeed.default_collate`: structures, dtypes, ferrofeed Tensors, and errors that say where.

Also the module seams of the collate: `collating_into` (what a worker process stacks into),
`describe_entries` (what a loader adds to an error), and that the worker module no longer
imports the loader.
"""

from __future__ import annotations

import ast
import collections
import io
import pickle
import threading
from pathlib import Path
from typing import Any, NamedTuple

import ferrofeed
import numpy as np
import pytest
from ferrofeed import DataLoader, default_collate
from ferrofeed._collate import _dlpack_only, collating_into, describe_entries

POOLED = ("uint8", "int32", "int64", "float16", "float32")
PACKAGE = Path(ferrofeed.__file__).parent


def aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % 64 == 0


class Point(NamedTuple):
    x: float
    label: int
    tag: str


def raised(exc_type: type[BaseException], samples: list[Any]) -> Any:
    """The exception ``default_collate(samples)`` raises, checked to explain itself."""
    with pytest.raises(exc_type) as info:
        default_collate(samples)
    exc = info.value
    # A ferrofeed error that is also the standard one (except FerrofeedError catches it).
    typed = {
        TypeError: ferrofeed.CollateTypeError,
        ValueError: ferrofeed.CollateValueError,
        KeyError: ferrofeed.CollateKeyError,
    }[exc_type]
    assert type(exc) is typed
    assert isinstance(exc, ferrofeed.CollateError)
    assert str(exc).startswith("default_collate: ")
    assert isinstance(exc.path, str)  # type: ignore[attr-defined]
    assert isinstance(exc.entries, tuple)  # type: ignore[attr-defined]
    assert exc.entries == tuple(sorted(set(exc.entries)))  # type: ignore[attr-defined]
    return exc


# --------------------------------------------------------------------------------------
# structures and dtypes


def test_collate_dict_tuple_namedtuple_nested() -> None:
    samples = [
        {
            "img": np.full((2, 2), i, np.uint8),
            "label": i,
            "name": f"n{i}",
            "pair": (np.float32(i), [i, i + 1]),
            "meta": {"score": i / 2, "id": b"id%d" % i},
            "point": Point(float(i), i * 10, f"t{i}"),
        }
        for i in range(3)
    ]
    batch = default_collate(samples)
    assert set(batch) == set(samples[0])
    assert batch["img"].dtype == np.uint8
    assert batch["img"].shape == (3, 2, 2)
    assert batch["img"][:, 0, 0].tolist() == [0, 1, 2]
    assert batch["label"].dtype == np.int64
    assert batch["label"].tolist() == [0, 1, 2]
    assert batch["name"] == ["n0", "n1", "n2"]
    assert isinstance(batch["pair"], tuple)
    assert batch["pair"][0].dtype == np.float32
    assert batch["pair"][0].tolist() == [0.0, 1.0, 2.0]
    assert batch["pair"][1].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert batch["meta"]["score"].tolist() == [0.0, 0.5, 1.0]
    assert batch["meta"]["id"] == [b"id0", b"id1", b"id2"]
    point = batch["point"]
    assert type(point) is Point
    assert point.x.tolist() == [0.0, 1.0, 2.0]
    assert point.label.tolist() == [0, 10, 20]
    assert point.tag == ["t0", "t1", "t2"]


def test_collate_nested_lists_field_by_field() -> None:
    samples = [[np.full(2, i), ["a", "b"], [[i, i], [i, i]]] for i in range(3)]
    batch = default_collate(samples)
    assert isinstance(batch, list)
    assert len(batch) == 3
    assert batch[0].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert batch[1] == [["a", "a", "a"], ["b", "b", "b"]]
    # a list of lists of numbers: its inner lists are stacked
    assert [b.tolist() for b in batch[2]] == [[[0, 0], [1, 1], [2, 2]]] * 2


def test_collate_tuples_and_lists_of_numbers() -> None:
    pairs = default_collate([(np.arange(3, dtype=np.int32) + i, i) for i in range(4)])
    assert isinstance(pairs, tuple)
    assert len(pairs) == 2
    assert pairs[0].dtype == np.int32
    assert pairs[0].shape == (4, 3)
    assert pairs[1].tolist() == [0, 1, 2, 3]

    ints = default_collate([[1, 2, 3], [4, 5, 6]])
    assert isinstance(ints, np.ndarray)
    assert ints.dtype == np.int64
    assert ints.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert aligned(ints)
    floats = default_collate([[0.5, 1.5], [2.5, 3.5]])
    assert floats.dtype == np.float64
    assert floats.tolist() == [[0.5, 1.5], [2.5, 3.5]]
    scalars = default_collate([1.5, 2.5, 3.5])
    assert scalars.tolist() == [1.5, 2.5, 3.5]
    bools = default_collate([True, False])
    assert bools.dtype == np.bool_
    assert bools.tolist() == [True, False]
    # lists of strings are transposed field by field, each field a list
    words = default_collate([["a", "b"], ["c", "d"]])
    assert words == [["a", "c"], ["b", "d"]]
    assert default_collate(["x", "y", "z"]) == ["x", "y", "z"]


def test_collate_mixed_int_and_float_numbers_promote() -> None:
    # np.stack / torch's default_collate promote to a float type; nothing may be lost.
    assert default_collate([1, 2.5]).tolist() == [1.0, 2.5]
    assert default_collate([[1, 2], [3.5, 4]]).tolist() == [[1.0, 2.0], [3.5, 4.0]]
    mixed = default_collate([np.zeros(2, np.uint8), np.ones(2, np.float32)])
    assert mixed.dtype == np.float32
    assert mixed.tolist() == [[0.0, 0.0], [1.0, 1.0]]


@pytest.mark.parametrize(
    "dtype", ["uint8", "int32", "int64", "float16", "float32", "float64", "bool"]
)
def test_collate_numpy_dtypes(dtype: str) -> None:
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 2, size=(3, 5)) * (i + 1)).astype(dtype) for i in range(4)]
    batch = default_collate(samples)
    assert isinstance(batch, np.ndarray)
    assert batch.dtype == np.dtype(dtype)
    assert batch.shape == (4, 3, 5)
    assert batch.flags.c_contiguous
    for i, s in enumerate(samples):
        np.testing.assert_array_equal(batch[i], s)
    if dtype in POOLED:
        assert aligned(batch), f"pooled {dtype} batch not 64-byte aligned"
    # scalars of the dtype too
    scalars = default_collate([np.dtype(dtype).type(i % 2) for i in range(5)])
    assert scalars.dtype == np.dtype(dtype)
    assert scalars.tolist() == [np.dtype(dtype).type(i % 2).item() for i in range(5)]


def test_collate_pooled_buffers_are_not_reused_while_alive() -> None:
    first = default_collate([np.full((64,), 7, np.float32)] * 8)
    ptr = first.ctypes.data
    for k in range(50):
        other = default_collate([np.full((64,), k, np.float32)] * 8)
        assert other.ctypes.data != ptr
        del other
    assert (first == 7).all(), "a live batch was overwritten by a later one"


def test_default_collate_sequences_and_unknown_types() -> None:
    dq = default_collate([collections.deque([1, "a"]), collections.deque([2, "b"])])
    assert isinstance(dq, collections.deque)
    assert dq[0].tolist() == [1, 2]
    assert list(dq[1]) == ["a", "b"]
    with pytest.raises(TypeError, match="default_collate"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="NoneType"):
        default_collate([None, None])
    with pytest.raises(ValueError, match="same length"):
        default_collate([(1, 2), (3,)])


def test_collate_object_arrays_stay_object_arrays() -> None:
    a = np.array([{"k": 1}, None], dtype=object)
    b = np.array([3, "x"], dtype=object)
    batch = default_collate([a, b])
    assert batch.dtype == object
    assert batch.shape == (2, 2)
    assert batch[1, 1] == "x"


# --------------------------------------------------------------------------------------
# ferrofeed Tensors


@pytest.mark.parametrize("dtype", POOLED)
def test_collate_stacks_ferrofeed_tensors(dtype: str) -> None:
    tensors = []
    for i in range(3):
        t = ferrofeed.zeros((2, 3), dtype)
        np.from_dlpack(t)[...] = i + 1  # the pooled buffer is writable through DLPack
        tensors.append(t)
    assert _dlpack_only(tensors[0])  # taken by DLPack (its __array__ is a view too)
    batch = default_collate(tensors)
    assert isinstance(batch, np.ndarray)
    assert batch.dtype == np.dtype(dtype)
    assert batch.shape == (3, 2, 3)
    assert aligned(batch)
    assert [batch[i].tolist() for i in range(3)] == [[[i + 1] * 3] * 2 for i in range(3)]
    # a copy: the batch does not share memory with the samples
    np.from_dlpack(tensors[0])[...] = 9
    assert batch[0, 0, 0] == 1


def test_collate_tensors_in_structures_and_beside_arrays() -> None:
    samples = [
        {
            "image": ferrofeed.zeros((4, 4, 3), "uint8"),
            "label": i,
            "pair": (ferrofeed.zeros((2,), "float32"), "t"),
        }
        for i in range(2)
    ]
    batch = default_collate(samples)
    assert batch["image"].shape == (2, 4, 4, 3)
    assert batch["image"].dtype == np.uint8
    assert batch["label"].tolist() == [0, 1]
    assert batch["pair"][0].shape == (2, 2)
    assert batch["pair"][1] == ["t", "t"]
    # a Tensor beside NumPy arrays, in either order
    ones = np.ones((2, 2), np.float32)
    for pair in (
        [ones, ferrofeed.zeros((2, 2), "float32")],
        [ferrofeed.zeros((2, 2), "float32"), ones],
    ):
        mixed = default_collate(pair)
        assert mixed.shape == (2, 2, 2)
        assert sorted(mixed.sum(axis=(1, 2)).tolist()) == [0.0, 4.0]


def test_collate_decoded_images() -> None:
    pil = pytest.importorskip("PIL.Image")
    images = []
    for color in ((255, 0, 0), (0, 0, 255)):
        buf = io.BytesIO()
        pil.new("RGB", (16, 12), color).save(buf, format="PNG")
        images.append(ferrofeed.io.decode_image(buf.getvalue()))
    assert isinstance(images[0], ferrofeed.Tensor)
    batch = default_collate([{"image": im, "label": k} for k, im in enumerate(images)])
    assert batch["image"].shape == (2, 12, 16, 3)
    assert batch["image"].dtype == np.uint8
    assert batch["image"][0, 0, 0].tolist() == [255, 0, 0]
    assert batch["image"][1, 5, 7].tolist() == [0, 0, 255]


def test_collate_tensor_shapes_that_differ_are_named() -> None:
    exc = raised(
        ValueError,
        [{"image": ferrofeed.zeros((3, 4), "uint8")}, {"image": ferrofeed.zeros((3, 5), "uint8")}],
    )
    assert "sample['image']" in str(exc)
    assert "(3, 4) at entry 0" in str(exc)
    assert "(3, 5) at entry 1" in str(exc)


def test_collate_bfloat16_tensors_are_refused_clearly() -> None:
    exc = raised(TypeError, [ferrofeed.empty((2,), "bfloat16")] * 2)
    assert "bfloat16" in str(exc)
    assert "ferrofeed.Tensor at entry 0" in str(exc)
    assert exc.entries == (0,)


# --------------------------------------------------------------------------------------
# errors that explain themselves


def test_shapes_that_differ_name_the_path_shapes_and_entries() -> None:
    samples = [
        {"image": [np.zeros((3, 4)), np.zeros((3, 4))]},
        {"image": [np.zeros((3, 4)), np.zeros((3, 5))]},
    ]
    exc = raised(ValueError, samples)
    message = str(exc)
    assert "sample['image'][1]" in message
    assert "(3, 4) at entry 0" in message
    assert "(3, 5) at entry 1" in message
    assert "all input arrays" not in message  # not NumPy's words alone
    assert exc.path == "sample['image'][1]"
    assert exc.entries == (0, 1)


def test_one_odd_shape_in_a_large_batch() -> None:
    samples = [np.zeros(3)] * 200
    samples[117] = np.zeros(4)
    exc = raised(ValueError, samples)
    message = str(exc)
    assert "(3,) at entries 0, 1, 2, 3 and 195 more" in message
    assert "(4,) at entry 117" in message
    assert exc.path == "sample"
    assert exc.entries == (0, 1, 2, 3, 117)


def test_many_distinct_shapes_are_summed_up() -> None:
    exc = raised(ValueError, [np.zeros(k) for k in range(10)])
    assert (
        "(0,) at entry 0; (1,) at entry 1; (2,) at entry 2; (3,) at entry 3; and 6 others"
        in str(exc)
    )
    assert exc.entries == (0, 1, 2, 3)


def test_named_tuple_fields_are_named_in_the_path() -> None:
    samples = [Point(1.0, 0, "a"), Point(np.zeros(2), 1, "b")]  # type: ignore[arg-type]
    exc = raised(ValueError, samples)
    assert exc.path == "sample.x"
    assert "sample.x" in str(exc)
    assert "() at entry 0" in str(exc)
    assert "(2,) at entry 1" in str(exc)


def test_missing_key_names_the_key_and_the_entries() -> None:
    samples = [{"a": 1, "boxes": 2}, {"a": 1}, {"a": 1, "boxes": 3}, {"a": 2}]
    exc = raised(KeyError, samples)
    message = str(exc)
    assert "no key 'boxes'" in message
    assert "entries 1 and 3" in message
    assert "entry 0 has it" in message
    assert exc.path == "sample"
    assert exc.entries == (0, 1, 3)


def test_missing_key_in_a_nested_dict() -> None:
    samples = [{"meta": {"id": 1, "score": 0.5}}, {"meta": {"id": 2}}]
    exc = raised(KeyError, samples)
    assert "sample['meta'] has no key 'score' at entry 1" in str(exc)
    assert exc.path == "sample['meta']"


def test_sequences_of_different_lengths_name_the_path_and_entries() -> None:
    samples = [{"boxes": [1, 2, "x"]}, {"boxes": [1, 2, "y"]}, {"boxes": [1, "z"]}]
    exc = raised(ValueError, samples)
    message = str(exc)
    assert "sample['boxes']" in message
    assert "same length" in message
    assert "3 at entries 0 and 1" in message
    assert "2 at entry 2" in message
    assert exc.entries == (0, 1, 2)


@pytest.mark.parametrize(
    ("values", "first", "second"),
    [
        ([1, "a"], "int at entry 0", "str at entry 1"),
        (["a", 1], "str at entry 0", "int at entry 1"),
        ([1.5, None], "float at entry 0", "NoneType at entry 1"),
        (["a", b"b"], "str at entry 0", "bytes at entry 1"),
        ([np.zeros(2), "ab"], "numpy.ndarray of float64 at entry 0", "str at entry 1"),
    ],
)
def test_mixed_types_at_one_field_name_both(values: list[Any], first: str, second: str) -> None:
    exc = raised(TypeError, [{"label": v} for v in values])
    message = str(exc)
    assert "sample['label'] mixes types" in message
    assert first in message
    assert second in message
    assert exc.entries == (0, 1)


def test_a_dict_beside_a_list_or_a_number() -> None:
    exc = raised(TypeError, [{"a": 1}, [1]])
    assert "dict at entry 0" in str(exc)
    assert "list at entry 1" in str(exc)
    exc = raised(TypeError, [{"m": {"a": 1}}, {"m": 3}])
    assert exc.path == "sample['m']"
    assert "dict at entry 0; int at entry 1" in str(exc)
    exc = raised(TypeError, [(1, 2), 3])
    assert "tuple at entry 0; int at entry 1" in str(exc)


def test_unsupported_types_name_the_path_and_type() -> None:
    exc = raised(TypeError, [{"x": {"y": object()}}] * 2)
    assert "cannot collate sample['x']['y']: object at entries 0 and 1" in str(exc)
    assert "collate=" in str(exc)
    exc = raised(TypeError, [None, 1])
    assert "NoneType at entry 0; int at entry 1" in str(exc)


def test_ragged_and_incompatible_leaves() -> None:
    exc = raised(ValueError, [[1, 2], [3, [4]]])
    assert "the list at entry 1 is not an array" in str(exc)
    assert exc.entries == (1,)
    a = np.zeros(2, dtype=[("a", "i4")])
    b = np.zeros(2, dtype=[("b", "f8")])
    exc = raised(TypeError, [a, b])
    assert "dtypes do not combine" in str(exc)
    assert "at entry 0" in str(exc)
    assert "at entry 1" in str(exc)


def test_empty_batch() -> None:
    with pytest.raises(ferrofeed.CollateValueError, match="no samples"):
        default_collate([])


def test_collate_errors_pickle_with_their_attributes() -> None:
    # A worker process sends its collate error to the main process pickled.
    exc = raised(ValueError, [{"x": np.zeros(1)}, {"x": np.zeros(2)}])
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is ferrofeed.CollateValueError
    assert str(back) == str(exc)
    assert back.path == "sample['x']"
    assert back.entries == (0, 1)


def test_describe_entries_names_dataset_indices() -> None:
    exc = raised(ValueError, [np.zeros(3), np.zeros(3), np.zeros(4)])
    describe_entries(exc, [40, 41, 4711])
    assert exc.__notes__ == [
        "in this batch, entry 0 is dataset[40], entry 1 is dataset[41] and entry 2 is dataset[4711]"
    ]
    # an error without entries (a collate of the user's own) is left alone
    plain = ValueError("mine")
    describe_entries(plain, [1, 2])
    assert not hasattr(plain, "__notes__")


def test_loader_collate_errors_explain_themselves() -> None:
    data = [{"x": np.zeros(3)} for _ in range(4)]
    data[2] = {"x": np.zeros(5)}
    for kw in ({"num_threads": 1}, {"num_threads": 2}, {"num_workers": 1}):
        with pytest.raises(ValueError, match=r"sample\['x'\]: shapes differ") as info:
            list(DataLoader(data, 4, timeout=60, **kw))  # type: ignore[arg-type]
        assert "(5,) at entry 2" in str(info.value), kw
        assert isinstance(info.value, ferrofeed.CollateValueError), kw


# --------------------------------------------------------------------------------------
# collating_into: where a worker's batch goes


def test_collating_into_allocates_numeric_leaves_only() -> None:
    made: list[tuple[tuple[int, ...], np.dtype[Any]]] = []

    def alloc(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        made.append((shape, np.dtype(dtype)))
        return np.empty(shape, dtype)

    samples = [
        {"x": np.full(3, i, np.float64), "name": "n", "t": ferrofeed.zeros((2,), "uint8")}
        for i in range(2)
    ]
    with collating_into(alloc):
        batch = default_collate(samples)
    assert made == [((2, 3), np.dtype(np.float64)), ((2, 2), np.dtype(np.uint8))]
    assert batch["x"].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert batch["name"] == ["n", "n"]
    # outside the block: the pooled buffers again
    default_collate(samples)
    assert len(made) == 2


def test_collating_into_nests_restores_and_is_per_thread() -> None:
    calls: list[str] = []

    def tagged(tag: str) -> Any:
        def alloc(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            calls.append(tag)
            return np.empty(shape, dtype)

        return alloc

    seen_in_thread: list[int] = []

    def other_thread() -> None:
        before = len(calls)
        default_collate([np.zeros(2)] * 2)
        seen_in_thread.append(len(calls) - before)

    with collating_into(tagged("outer")):
        with collating_into(tagged("inner")):
            default_collate([1, 2])
            t = threading.Thread(target=other_thread)
            t.start()
            t.join(timeout=60)
        default_collate([1, 2])
        with pytest.raises(ValueError), collating_into(tagged("failed")):
            default_collate([np.zeros(1), np.zeros(2)])
        default_collate([1, 2])
    default_collate([1, 2])
    # (the failed collate may have allocated before it found the shapes differ)
    assert calls[:2] == ["inner", "outer"]
    assert set(calls[2:-1]) <= {"failed"}
    assert calls[-1] == "outer"
    assert seen_in_thread == [0], "another thread used this thread's allocator"


# --------------------------------------------------------------------------------------
# module seams


def _imports_of(module: str) -> set[str]:
    """The ferrofeed modules ``module`` imports (``from . import x``, ``from .x import y``)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("ferrofeed."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.split(".")[1]
                for alias in node.names
                if alias.name.startswith("ferrofeed.")
            )
    return found


def test_workers_do_not_import_the_loader() -> None:
    # Everything _workers reaches, directly or through the modules it imports.
    seen: set[str] = set()
    todo = ["_workers"]
    while todo:
        module = todo.pop()
        if module in seen or not (PACKAGE / f"{module}.py").exists():
            continue  # _core is the extension
        seen.add(module)
        todo.extend(_imports_of(module))
    assert "_collate" in seen
    assert "_slot_writer" in seen
    assert "_loader" not in seen, sorted(seen)


def test_collate_and_slot_writer_modules_stand_alone() -> None:
    assert _imports_of("_collate") <= {"_core", "_errors"}
    assert _imports_of("_errors") == set()
    assert _imports_of("_slot_writer") == set()
    assert ferrofeed.default_collate is default_collate
