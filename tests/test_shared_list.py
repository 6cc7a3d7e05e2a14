"""The Python surface of ``ferrofeed.SharedList`` (single process)."""

from __future__ import annotations

import gc
import os
import pickle
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ferrofeed
import numpy as np
import pytest
from ferrofeed import SharedList

PLAIN: list[Any] = [
    {"a": 1, "b": [1, 2.5, "x"], "c": {"nested": (1, 2)}},
    "hello",
    "",
    "ünïcødé ✓ \x00 snow☃",
    b"",
    b"\x00\xff raw bytes \x01",
    None,
    0,
    -1,
    2**100,
    -(2**64) + 3,
    3.14,
    float("inf"),
    True,
    False,
    [],
    {},
    (),
    [[[[1]]], {"k": {"k2": [None, b"b", (1.5, "t")]}}],
    {1, 2, 3},
    frozenset({"a", "b"}),
    bytearray(b"mutable"),
    complex(1.5, -2.0),
    range(3, 10, 2),
    b"L" * (3 * 1024 * 1024 + 7),  # large in-band bytes
    "s" * 100_000,
]


def _arrays() -> dict[str, np.ndarray]:
    return {
        "f32_2d": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f64": np.linspace(0.0, 1.0, 7),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u16": np.arange(1000, dtype=np.uint16),
        "i64": np.arange(-5, 5, dtype=np.int64),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
        "f16": np.array([0.5, -2.0], dtype=np.float16),
        "zero_d": np.array(3.5),
        "zero_d_i32": np.array(7, dtype=np.int32),
        "empty": np.zeros(0, dtype=np.float64),
        "empty_2d": np.zeros((3, 0), dtype=np.int16),
        "fortran": np.asfortranarray(np.arange(20, dtype=np.float64).reshape(4, 5)),
        "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,
        "strided": np.arange(40, dtype=np.int32)[::3],
        "strided_2d": np.arange(60, dtype=np.float32).reshape(6, 10)[::2, 1::3],
        "reversed": np.arange(10, dtype=np.int16)[::-1],
        "structured": np.array([(1, 2.0), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "datetime": np.array(["2020-01-01", "2024-02-29"], dtype="datetime64[D]"),
        "unicode": np.array(["ab", "c"]),
        "big_endian": np.arange(5, dtype=">i4"),
        "large": np.arange(1_000_000, dtype=np.float32),
        "objects": np.array([1, "a", None], dtype=object),
    }


def _assert_same_array(got: Any, exp: np.ndarray, what: str) -> None:
    assert isinstance(got, np.ndarray), f"{what}: {type(got)}"
    assert got.dtype == exp.dtype, what
    assert got.shape == exp.shape, what
    assert np.array_equal(got, exp), what


def _oob_nbytes(obj: Any) -> int:
    """Total bytes pickle protocol 5 would put out of band for ``obj``."""
    bufs: list[pickle.PickleBuffer] = []
    pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return sum(memoryview(b).nbytes for b in bufs)


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``path`` (from /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            name = parts[5].strip()
            if name == path or name == f"{path} (deleted)":
                lo, hi = parts[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _raw_range(sl: SharedList, i: int) -> tuple[int, int]:
    base = np.frombuffer(sl.raw(i), dtype=np.uint8)
    lo = base.ctypes.data
    return lo, lo + base.size


@pytest.fixture
def plain(arena_dir: Path) -> Iterator[SharedList]:
    sl = SharedList(PLAIN, path=arena_dir)
    yield sl
    sl.close()


# ------------------------------------------------------------------ round trips


def test_plain_objects_round_trip(plain: SharedList) -> None:
    assert len(plain) == len(PLAIN)
    for i, exp in enumerate(PLAIN):
        got = plain[i]
        assert type(got) is type(exp), i
        assert got == exp, i
    assert list(plain) == PLAIN


def test_coco_round_trip(arena_dir: Path, coco: Callable[..., Iterator[dict]]) -> None:
    expected = list(coco(2000))
    sizes = [len(pickle.dumps(a, protocol=5)) for a in expected]
    assert 300 <= sum(sizes) / len(sizes) <= 600  # the helper makes what it promises
    with SharedList(expected, path=arena_dir) as sl:
        assert len(sl) == 2000
        assert sl[0] == expected[0]
        assert sl[1234] == expected[1234]
        assert list(sl) == expected


def test_numpy_arrays_round_trip(arena_dir: Path) -> None:
    arrays = _arrays()
    items: list[Any] = list(arrays.values())
    items.append({"image": arrays["f32_2d"], "meta": {"mask": arrays["bool"]}, "id": 9})
    with SharedList(items, path=arena_dir) as sl:
        assert len(sl) == len(items)
        for i, (name, exp) in enumerate(arrays.items()):
            _assert_same_array(sl[i], exp, name)
        nested = sl[len(arrays)]
        assert nested["id"] == 9
        _assert_same_array(nested["image"], arrays["f32_2d"], "nested image")
        _assert_same_array(nested["meta"]["mask"], arrays["bool"], "nested mask")


def test_numpy_arrays_are_read_only_views_into_the_arena(arena_dir: Path) -> None:
    arrays = _arrays()
    zero_copy = {k: a for k, a in arrays.items() if _oob_nbytes(a) > 0}
    # contiguous arrays of several kinds, 0-d included, do go out of band
    assert {"f32_2d", "u16", "zero_d", "fortran", "transposed", "large"} <= set(zero_copy)
    names = list(zero_copy)
    with SharedList([zero_copy[k] for k in names], path=arena_dir) as sl:
        ranges = _mapped_ranges(sl.path)
        assert ranges, f"{sl.path} is not mapped in this process"
        for i, name in enumerate(names):
            arr = sl[i]
            _assert_same_array(arr, zero_copy[name], name)
            assert arr.flags.writeable is False, name
            with pytest.raises(ValueError):
                arr[(0,) * arr.ndim] = 0
            with pytest.raises(ValueError):
                arr.flags.writeable = True
            start, end = arr.ctypes.data, arr.ctypes.data + arr.nbytes
            lo, hi = _raw_range(sl, i)
            assert lo <= start, f"{name}: data {start:#x}+{arr.nbytes} not in raw {lo:#x}"
            assert end <= hi, f"{name}: data {start:#x}+{arr.nbytes} not in raw ..{hi:#x}"
            assert any(a <= start and end <= b for a, b in ranges), f"{name} not in mapping"


def test_numpy_views_inside_dicts_are_read_only(arena_dir: Path) -> None:
    img = np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)
    with SharedList([{"img": img, "label": 3}] * 3, path=arena_dir) as sl:
        for i in range(3):
            got = sl[i]["img"]
            assert got.flags.writeable is False
            lo, hi = _raw_range(sl, i)
            assert lo <= got.ctypes.data < got.ctypes.data + got.nbytes <= hi
        # two reads of the same item alias the same arena memory
        assert sl[1]["img"].ctypes.data == sl[1]["img"].ctypes.data


# ------------------------------------------------------------------ sequence protocol


def test_len_and_negative_indices(plain: SharedList) -> None:
    n = len(PLAIN)
    assert len(plain) == n
    assert plain[-1] == PLAIN[-1]
    assert plain[-n] == PLAIN[0]
    for i in range(-n, n):
        assert plain[i] == PLAIN[i], i


@pytest.mark.parametrize("index", [len(PLAIN), len(PLAIN) + 1, -len(PLAIN) - 1, 10**6])
def test_index_error(plain: SharedList, index: int) -> None:
    with pytest.raises(IndexError):
        plain[index]


@pytest.mark.parametrize("index", [2**63, 2**70, -(2**70)])
def test_index_error_for_huge_ints(plain: SharedList, index: int) -> None:
    # like list: an index that does not even fit in a machine word is still out of range
    with pytest.raises(IndexError):
        plain[index]


@pytest.mark.parametrize("index", ["0", 1.0, None, [0], (0,), b"\x00"])
def test_type_error_for_non_int(plain: SharedList, index: Any) -> None:
    with pytest.raises(TypeError):
        plain[index]


def test_index_accepts_index_protocol(plain: SharedList) -> None:
    assert plain[np.int64(2)] == PLAIN[2]
    assert plain[np.uint8(1)] == PLAIN[1]


SLICES = [
    slice(None),
    slice(2, 7),
    slice(-5, None),
    slice(None, -3),
    slice(None, None, 2),
    slice(1, None, 3),
    slice(None, None, -1),
    slice(-2, 1, -2),
    slice(100, 200),
    slice(-100, 100, 5),
    slice(5, 2),
    slice(3, 3),
    slice(2**70, None),
    slice(None, None, 2**70),
]


@pytest.mark.parametrize("s", SLICES, ids=str)
def test_slices_match_list(plain: SharedList, s: slice) -> None:
    got = plain[s]
    assert type(got) is list
    assert got == PLAIN[s]


def test_slice_step_zero(plain: SharedList) -> None:
    with pytest.raises(ValueError):
        plain[::0]


def test_iteration_in_and_reversed(arena_dir: Path, coco: Callable[..., Iterator[dict]]) -> None:
    expected = list(coco(300))
    with SharedList(expected, path=arena_dir) as sl:
        assert [x for x in sl] == expected
        it1, it2 = iter(sl), iter(sl)
        assert next(it1) == expected[0]
        assert next(it1) == expected[1]
        assert next(it2) == expected[0]  # independent iterators
        assert list(reversed(sl)) == expected[::-1]
        assert expected[17] in sl
        assert expected[-1] in sl
        assert {"id": -1} not in sl
        assert "nope" not in sl
        assert sum(1 for _ in sl) == 300


def test_generators_and_iterators_as_input(arena_dir: Path) -> None:
    consumed: list[int] = []

    def gen() -> Iterator[dict[str, int]]:
        for i in range(50):
            consumed.append(i)
            yield {"i": i, "sq": i * i}

    with SharedList(gen(), path=arena_dir) as sl:
        assert consumed == list(range(50))  # consumed exactly once
        assert len(sl) == 50
        assert sl[49] == {"i": 49, "sq": 2401}
    with SharedList(range(10), path=arena_dir) as sl:
        assert list(sl) == list(range(10))
    with SharedList(map(str, range(5)), path=arena_dir) as sl:
        assert list(sl) == ["0", "1", "2", "3", "4"]
    with SharedList(iter(()), path=arena_dir) as sl:
        assert len(sl) == 0
    with SharedList({"k1": 1, "k2": 2}, path=arena_dir) as sl:  # iterating a dict: keys
        assert list(sl) == ["k1", "k2"]


def test_empty_list(arena_dir: Path) -> None:
    with SharedList([], path=arena_dir) as sl:
        assert len(sl) == 0
        assert not sl
        assert list(sl) == []
        assert list(reversed(sl)) == []
        assert sl[:] == []
        assert 1 not in sl
        with pytest.raises(IndexError):
            sl[0]
        with pytest.raises(IndexError):
            sl[-1]
        assert os.path.getsize(sl.path) == sl.nbytes >= 64
        again = pickle.loads(pickle.dumps(sl))
        assert len(again) == 0
        again.close()


# ------------------------------------------------------------------ raw


def test_raw_is_the_pickle(plain: SharedList) -> None:
    for i, obj in enumerate(PLAIN):
        mv = plain.raw(i)
        assert isinstance(mv, memoryview)
        assert mv.readonly
        assert mv.tobytes() == pickle.dumps(obj, protocol=5), i
        assert pickle.loads(mv) == obj


def test_raw_is_read_only_and_zero_copy(plain: SharedList) -> None:
    mv = plain.raw(0)
    with pytest.raises(TypeError):
        mv[0] = 0
    view = np.frombuffer(mv, dtype=np.uint8)
    assert view.flags.writeable is False
    with pytest.raises(ValueError):
        view[0] = 1
    # zero copy: two raw() calls of one item point at the same memory, inside the mapping
    assert _raw_range(plain, 3) == _raw_range(plain, 3)
    lo, hi = _raw_range(plain, 3)
    assert any(a <= lo and hi <= b for a, b in _mapped_ranges(plain.path))
    # every item starts 64-byte aligned
    for i in range(len(PLAIN)):
        assert _raw_range(plain, i)[0] % 64 == 0, i


def test_raw_index_errors(plain: SharedList) -> None:
    with pytest.raises(IndexError):
        plain.raw(len(PLAIN))
    with pytest.raises(TypeError):
        plain.raw("0")  # type: ignore[arg-type]


def test_reading_does_not_leak(arena_dir: Path) -> None:
    """Repeated reads must not leave Python objects behind (sys.getallocatedblocks)."""
    n = 3000
    items = [{"i": i, "v": [float(i)] * 4} for i in range(n)]
    with SharedList(items, path=arena_dir) as sl:
        patterns: dict[str, Callable[[], object]] = {
            "sl[i]": lambda: [sl[i] for i in range(n)],
            "sl.raw(i)": lambda: [sl.raw(i) for i in range(n)],
            "iteration": lambda: list(sl),
            "slice": lambda: [sl[i : i + 10] for i in range(0, n, 10)],
            "reversed": lambda: list(reversed(sl)),
        }
        leaks: dict[str, float] = {}
        for what, read in patterns.items():
            read()  # warm up caches
            gc.collect()
            before = sys.getallocatedblocks()
            for _ in range(3):
                read()
            gc.collect()
            per_item = (sys.getallocatedblocks() - before) / (3 * n)
            if per_item > 0.05:
                leaks[what] = per_item
        assert leaks == {}, f"allocated blocks left behind per item read: {leaks}"


# ------------------------------------------------------------------ attributes and lifetime


def test_default_path_and_attributes() -> None:
    sl = SharedList([1, 2, 3])
    try:
        assert isinstance(sl.path, str)
        assert re.fullmatch(rf"/dev/shm/ferrofeed-{os.getpid()}-[^/]+\.arena", sl.path), sl.path
        assert os.path.exists(sl.path)
        assert sl.owner is True
        assert sl.closed is False
        assert isinstance(sl.nbytes, int)
        assert sl.nbytes == os.path.getsize(sl.path)
    finally:
        sl.close()
    assert sl.closed is True
    assert not os.path.exists(sl.path)


@pytest.mark.parametrize("as_path", [False, True], ids=["str", "Path"])
def test_path_is_a_directory(arena_dir: Path, as_path: bool) -> None:
    target: str | Path = arena_dir if as_path else str(arena_dir)
    with SharedList(["x"], path=target) as sl:
        p = Path(sl.path)
        assert p.parent == arena_dir
        assert re.fullmatch(rf"ferrofeed-{os.getpid()}-.+\.arena", p.name), p.name
        assert [q.name for q in arena_dir.iterdir()] == [p.name]
    assert list(arena_dir.iterdir()) == []


@pytest.mark.parametrize("as_path", [False, True], ids=["str", "Path"])
def test_path_is_an_exact_file(arena_dir: Path, as_path: bool) -> None:
    exact = arena_dir / "my-data.arena"
    with SharedList(["x", "y"], path=exact if as_path else str(exact)) as sl:
        assert sl.path == str(exact)
        assert exact.is_file()
        assert sl.nbytes == exact.stat().st_size
        assert sl.owner
    assert not exact.exists()


def test_nbytes_covers_header_items_and_index(arena_dir: Path) -> None:
    items = [b"a" * 1000, b"b" * 5000, "c"]
    with SharedList(items, path=arena_dir) as sl:
        payload = sum(len(pickle.dumps(x, protocol=5)) for x in items)
        assert sl.nbytes >= 64 + payload + 8 * (len(items) + 1)
        assert sl.nbytes == os.path.getsize(sl.path)


def test_close_is_idempotent(arena_dir: Path) -> None:
    sl = SharedList([1], path=arena_dir)
    p = sl.path
    sl.close()
    sl.close()
    assert sl.closed
    assert not os.path.exists(p)
    sl.close()
    assert sl.closed


def test_access_after_close_raises(arena_dir: Path) -> None:
    sl = SharedList([{"a": 1}, {"b": 2}], path=arena_dir)
    it = iter(sl)
    assert next(it) == {"a": 1}
    sl.close()
    accesses: dict[str, Callable[[], Any]] = {
        "sl[0]": lambda: sl[0],
        "sl[-1]": lambda: sl[-1],
        "sl[0:1]": lambda: sl[0:1],
        "sl.raw(0)": lambda: sl.raw(0),
        "len(sl)": lambda: len(sl),
        "list(sl)": lambda: list(sl),
        "list(reversed(sl))": lambda: list(reversed(sl)),
        "x in sl": lambda: {"a": 1} in sl,
        "next(live iterator)": lambda: next(it),
        "pickle.dumps(sl)": lambda: pickle.dumps(sl),
    }
    wrong: dict[str, str] = {}
    for what, access in accesses.items():
        try:
            result = access()
        except ferrofeed.ArenaClosedError:
            continue  # right (and it is a ValueError: see test_error_hierarchy)
        except Exception as e:
            wrong[what] = f"raised {type(e).__name__}: {e}"
        else:
            wrong[what] = f"returned {result!r}"
    assert wrong == {}, "no ArenaClosedError after close()"
    assert sl.closed


def test_values_handed_out_stay_valid_after_close(arena_dir: Path) -> None:
    arr = np.arange(100_000, dtype=np.float64)
    sl = SharedList([{"arr": arr, "name": "x"}, b"payload" * 100], path=arena_dir)
    path = sl.path
    item = sl[0]
    view = item["arr"]
    raw = sl.raw(1)
    raw_np = np.frombuffer(sl.raw(0), dtype=np.uint8)
    checksum = int(raw_np.sum())
    sl.close()
    assert not os.path.exists(path)  # the owner removed the file ...
    gc.collect()
    # ... but the mapping lives on for the views already handed out
    assert view.flags.writeable is False
    assert np.array_equal(view, arr)
    assert float(view.sum()) == float(arr.sum())
    assert raw.tobytes() == pickle.dumps(b"payload" * 100, protocol=5)
    assert int(raw_np.sum()) == checksum
    assert item["name"] == "x"
    del item, view, raw, raw_np
    gc.collect()


def test_context_manager_removes_file(arena_dir: Path) -> None:
    sl = SharedList(["a", "b"], path=arena_dir)
    with sl as entered:
        assert entered is sl
        p = sl.path
        assert os.path.exists(p)
        assert sl[1] == "b"
    assert sl.closed
    assert not os.path.exists(p)


def test_context_manager_closes_on_exception(arena_dir: Path) -> None:
    sl = SharedList(["a"], path=arena_dir)
    p = sl.path

    def body() -> None:
        with sl:
            raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        body()
    assert sl.closed
    assert not os.path.exists(p)


def test_open_is_not_owner_and_keeps_file(arena_dir: Path) -> None:
    with SharedList(PLAIN, path=arena_dir) as owner:
        reader = SharedList.open(owner.path)
        assert reader.owner is False
        assert reader.closed is False
        assert reader.path == owner.path
        assert reader.nbytes == owner.nbytes
        assert list(reader) == PLAIN
        reader.close()
        assert reader.closed
        assert os.path.exists(owner.path)
        with SharedList.open(Path(owner.path)) as reader2:
            assert reader2[0] == PLAIN[0]
        assert os.path.exists(owner.path)
        del reader, reader2
        gc.collect()
        assert os.path.exists(owner.path)  # a GC'd reader does not remove the file
        assert owner[1] == PLAIN[1]


def test_gc_of_owner_removes_file(arena_dir: Path) -> None:
    sl = SharedList(list(range(100)), path=arena_dir)
    p = sl.path
    assert os.path.exists(p)
    del sl
    gc.collect()
    assert not os.path.exists(p)
    assert list(arena_dir.iterdir()) == []


def test_a_finished_arena_is_read_only(arena_dir: Path) -> None:
    """Sealed: no process of the owner's user can open it for writing (and truncate it
    under the readers' mappings); the owner still removes it. Root bypasses permission
    checks, so the refused open is checked only as another user."""
    sl = SharedList(PLAIN, path=arena_dir)
    p = sl.path
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o444
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            open(p, "r+b")  # noqa: SIM115
    with SharedList.open(p) as reader:
        assert list(reader) == PLAIN
    assert os.path.exists(p)
    sl.close()
    assert not os.path.exists(p)
    assert list(arena_dir.iterdir()) == []


def test_the_arena_of_a_killed_owner_is_read_only_and_swept(arena_dir: Path) -> None:
    from conftest import run_python

    proc = run_python(
        """
        import os, signal, sys
        from ferrofeed import SharedList
        sl = SharedList(range(1000), path=sys.argv[1])
        print(sl.path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no cleanup
        """,
        args=[str(arena_dir)],
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    orphan = Path(proc.stdout.split()[0])
    assert stat.S_IMODE(orphan.stat().st_mode) == 0o444
    # Creating an arena in the directory sweeps the orphan, read-only as it is.
    with SharedList([1], path=arena_dir) as sl:
        assert not orphan.exists()
        assert [p.name for p in arena_dir.iterdir()] == [Path(sl.path).name]


# ------------------------------------------------------------------ pickling


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL, 5])
def test_pickle_is_tiny_and_round_trips(arena_dir: Path, protocol: int) -> None:
    big = [b"z" * 100_000 for _ in range(50)]  # a 5 MB arena
    with SharedList(big, path=arena_dir) as sl:
        data = pickle.dumps(sl, protocol=protocol)
        assert len(data) < 300, len(data)
        clone = pickle.loads(data)
        assert isinstance(clone, SharedList)
        assert clone.path == sl.path
        assert clone.owner is False
        assert len(clone) == 50
        assert clone[7] == big[7]
        assert clone.raw(3).tobytes() == sl.raw(3).tobytes()
        # same pages: the clone's item memory lies in a mapping of the same file
        lo, hi = _raw_range(clone, 3)
        assert any(a <= lo and hi <= b for a, b in _mapped_ranges(sl.path))
        clone.close()
        assert os.path.exists(sl.path)
        assert sl[0] == big[0]
        # pickling a clone works too
        clone2 = pickle.loads(pickle.dumps(pickle.loads(data)))
        assert clone2[49] == big[49]
        clone2.close()


def test_unpickle_after_owner_closed(arena_dir: Path) -> None:
    sl = SharedList([1, 2], path=arena_dir)
    data = pickle.dumps(sl)
    sl.close()
    with pytest.raises(ferrofeed.ArenaNotFoundError):
        pickle.loads(data)


# ------------------------------------------------------------------ errors


class Boom(Exception):
    pass


class Unpicklable:
    def __reduce__(self) -> Any:
        raise Boom("cannot pickle me")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


@pytest.mark.parametrize("position", [0, 500, 999])
def test_unpicklable_item_raises_and_leaves_no_file(arena_dir: Path, position: int) -> None:
    items: list[Any] = [b"x" * 1000 for _ in range(1000)]
    items[position] = Unpicklable()
    with pytest.raises(Exception) as info:
        SharedList(items, path=arena_dir)
    assert any(isinstance(e, Boom) for e in _chain(info.value)), repr(info.value)
    gc.collect()
    assert list(arena_dir.iterdir()) == []


def test_unpicklable_lambda_raises_and_leaves_no_file(arena_dir: Path) -> None:
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        SharedList([1, 2, lambda: 3, 4], path=arena_dir)
    gc.collect()
    assert list(arena_dir.iterdir()) == []


def test_failing_generator_leaves_no_file(arena_dir: Path) -> None:
    def gen() -> Iterator[bytes]:
        for i in range(100):
            if i == 60:
                raise Boom("generator failed")
            yield b"y" * 10_000

    with pytest.raises(Exception) as info:
        SharedList(gen(), path=arena_dir)
    assert any(isinstance(e, Boom) for e in _chain(info.value)), repr(info.value)
    gc.collect()
    assert list(arena_dir.iterdir()) == []


def test_failing_item_leaves_no_file_in_default_dir() -> None:
    pid_prefix = f"ferrofeed-{os.getpid()}-"
    before = {n for n in os.listdir("/dev/shm") if n.startswith(pid_prefix)}
    with pytest.raises(Exception) as info:
        SharedList([1, Unpicklable()])
    assert any(isinstance(e, Boom) for e in _chain(info.value))
    gc.collect()
    after = {n for n in os.listdir("/dev/shm") if n.startswith(pid_prefix)}
    assert after == before


def test_explicit_path_that_exists(arena_dir: Path) -> None:
    existing = arena_dir / "taken.arena"
    existing.write_bytes(b"precious")
    with pytest.raises(ferrofeed.ArenaExistsError) as info:
        SharedList([1, 2, 3], path=existing)
    assert isinstance(info.value, FileExistsError)
    assert existing.read_bytes() == b"precious"  # not clobbered
    assert sorted(p.name for p in arena_dir.iterdir()) == ["taken.arena"]
    with pytest.raises(FileExistsError):
        SharedList([1], path=str(existing))
    existing.unlink()


def test_explicit_path_of_a_live_arena(arena_dir: Path) -> None:
    with SharedList([1], path=arena_dir) as sl:
        with pytest.raises(ferrofeed.ArenaExistsError):
            SharedList([2], path=sl.path)
        assert sl[0] == 1
        assert sorted(p.name for p in arena_dir.iterdir()) == [Path(sl.path).name]


def test_open_missing_path(arena_dir: Path) -> None:
    missing = arena_dir / "nope.arena"
    with pytest.raises(ferrofeed.ArenaNotFoundError) as info:
        SharedList.open(missing)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        SharedList.open(str(missing))
    assert not missing.exists()


def test_error_hierarchy() -> None:
    assert issubclass(ferrofeed.FerrofeedError, Exception)
    assert issubclass(ferrofeed.ArenaError, ferrofeed.FerrofeedError)
    expected_bases = {
        ferrofeed.ArenaNotFoundError: FileNotFoundError,
        ferrofeed.ArenaExistsError: FileExistsError,
        ferrofeed.ArenaCorruptError: ValueError,
        ferrofeed.ArenaFullError: OSError,
        ferrofeed.ArenaClosedError: ValueError,
        ferrofeed.ArenaTimeoutError: TimeoutError,
        ferrofeed.ArenaBuilderError: RuntimeError,
    }
    for cls, std in expected_bases.items():
        assert issubclass(cls, ferrofeed.ArenaError), cls
        assert issubclass(cls, ferrofeed.FerrofeedError), cls
        assert issubclass(cls, std), cls
        if hasattr(ferrofeed, "__all__"):
            assert cls.__name__ in ferrofeed.__all__, cls
    assert len(set(expected_bases)) == 7  # distinct classes
    assert not issubclass(ferrofeed.ArenaClosedError, ferrofeed.ArenaCorruptError)
    assert not issubclass(ferrofeed.ArenaCorruptError, ferrofeed.ArenaClosedError)
    assert not issubclass(ferrofeed.ArenaTimeoutError, ferrofeed.ArenaBuilderError)
    assert not issubclass(ferrofeed.ArenaBuilderError, ferrofeed.ArenaTimeoutError)
    with pytest.raises(OSError):
        raise ferrofeed.ArenaNotFoundError("x")
