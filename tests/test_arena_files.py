"""Arena files on disk: the format, the orphan sweep, corrupt files and full directories."""

from __future__ import annotations

import os
import pickle
import resource
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Procs
from ferrofeed import ArenaCorruptError, ArenaError, SharedList

HEADER = struct.Struct("<8sIIQQQQ16s")
assert HEADER.size == 64
MAGIC = b"FFARENA\0"


def align_up(x: int, a: int = 64) -> int:
    return (x + a - 1) // a * a


@dataclass
class Header:
    magic: bytes
    version: int
    flags: int
    n: int
    data_offset: int
    index_offset: int
    file_len: int
    reserved: bytes

    @classmethod
    def parse(cls, data: bytes) -> Header:
        return cls(*HEADER.unpack_from(data, 0))

    def offsets(self, data: bytes) -> list[int]:
        return list(struct.unpack_from(f"<{self.n + 1}Q", data, self.index_offset))


# ------------------------------------------------------------------ the on-disk format


def test_file_format(arena_dir: Path) -> None:
    items: list[Any] = [b"a" * 100, {"x": 1}, "hello", list(range(50)), b"z" * 3000, None]
    with SharedList(items, path=arena_dir) as sl:
        data = Path(sl.path).read_bytes()
        h = Header.parse(data)
        assert h.magic == MAGIC
        assert h.version == 1
        assert h.flags & 1 == 1
        assert h.n == len(items)
        assert h.data_offset >= 64
        assert h.data_offset % 64 == 0
        assert h.index_offset % 8 == 0
        assert h.file_len == len(data) == sl.nbytes
        assert h.reserved == bytes(16)
        off = h.offsets(data)
        assert off[0] == h.data_offset
        assert off[-1] <= h.index_offset
        assert h.index_offset + 8 * (h.n + 1) <= h.file_len
        for i, obj in enumerate(items):
            start, end = align_up(off[i]), off[i + 1]
            assert start <= end, i
            assert data[start:end] == pickle.dumps(obj, protocol=5), i
            assert data[start:end] == sl.raw(i).tobytes(), i


# ------------------------------------------------------------------ sweep

OWNER_SCRIPT = """
import sys, time
from ferrofeed import SharedList
sl = SharedList((b"o" * 1000 for _ in range(1000)), path=sys.argv[1])
print(sl.path, flush=True)
time.sleep(300)
"""

READER_SCRIPT = """
import sys, time
from ferrofeed import SharedList
sl = SharedList.open(sys.argv[1])
print(len(sl), flush=True)
time.sleep(300)
"""

SLOW_BUILD_SCRIPT = """
import sys, time
from ferrofeed import SharedList
def gen():
    for i in range(100_000):
        if i == 200:
            print("building", flush=True)
        if i >= 200:
            time.sleep(0.05)
        yield b"b" * 1000
SharedList(gen(), path=sys.argv[1])
"""


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.timeout(60)
def test_sweep_removes_killed_owners_file(arena_dir: Path, procs: Procs) -> None:
    foreign = arena_dir / "notes.txt"
    foreign.write_text("not ours")
    owner, orphan = procs.start(OWNER_SCRIPT, str(arena_dir))
    assert Path(orphan).parent == arena_dir
    assert os.path.exists(orphan)
    procs.kill9(owner)
    assert os.path.exists(orphan)  # nobody removed it: an orphan
    with SharedList([1, 2, 3], path=arena_dir) as sl:
        assert _names(arena_dir) == sorted([Path(sl.path).name, "notes.txt"])
        assert list(sl) == [1, 2, 3]
    assert _names(arena_dir) == ["notes.txt"]
    foreign.unlink()


@pytest.mark.timeout(60)
def test_sweep_keeps_files_held_by_live_processes(arena_dir: Path, procs: Procs) -> None:
    owner_a, path_a = procs.start(OWNER_SCRIPT, str(arena_dir))
    reader_b, n = procs.start(READER_SCRIPT, path_a)
    assert n == "1000"
    owner_c, path_c = procs.start(OWNER_SCRIPT, str(arena_dir))
    procs.kill9(owner_a)  # a's file is still held by reader b; c is alive

    with SharedList(["new1"], path=arena_dir) as sl1:
        assert os.path.exists(path_a), "swept a file a live reader holds"
        assert os.path.exists(path_c), "swept a live owner's file"
        assert sorted(_names(arena_dir)) == sorted(Path(p).name for p in (path_a, path_c, sl1.path))
        procs.kill9(reader_b)  # now nobody holds a's file
        with SharedList(["new2"], path=arena_dir) as sl2:
            assert not os.path.exists(path_a), "orphan not swept"
            assert os.path.exists(path_c)
            assert os.path.exists(sl1.path)  # ours, alive, in this very process
            assert sl1[0] == "new1"
            procs.kill9(owner_c)  # dies without running its cleanup (SIGTERM would run it)
            assert os.path.exists(path_c)
            with SharedList(["new3"], path=arena_dir) as sl3:
                assert not os.path.exists(path_c)
                assert sorted(_names(arena_dir)) == sorted(
                    Path(s.path).name for s in (sl1, sl2, sl3)
                )
    assert _names(arena_dir) == []


@pytest.mark.timeout(60)
def test_sweep_keeps_file_held_by_reader_in_this_process(arena_dir: Path, procs: Procs) -> None:
    owner, orphan = procs.start(OWNER_SCRIPT, str(arena_dir))
    reader = SharedList.open(orphan)
    procs.kill9(owner)
    with SharedList(["x"], path=arena_dir):
        assert os.path.exists(orphan)
        assert reader[0] == b"o" * 1000
    reader.close()
    assert os.path.exists(orphan)  # a reader never removes the file
    with SharedList(["y"], path=arena_dir):
        assert not os.path.exists(orphan)
    assert _names(arena_dir) == []


@pytest.mark.timeout(60)
def test_sweep_removes_partial_file_of_killed_builder(arena_dir: Path, procs: Procs) -> None:
    builder, line = procs.start(SLOW_BUILD_SCRIPT, str(arena_dir))
    assert line == "building"
    partial = _names(arena_dir)
    assert len(partial) <= 1, partial  # the file being built, if it is built in place
    procs.kill9(builder)
    assert _names(arena_dir) == partial  # left behind by the SIGKILL
    for name in partial:
        with pytest.raises(ArenaError):  # an incomplete file is never readable
            SharedList.open(arena_dir / name)
    with SharedList(["z"], path=arena_dir) as sl:
        assert _names(arena_dir) == [Path(sl.path).name]
    assert _names(arena_dir) == []


# ------------------------------------------------------------------ corrupt files

Mutation = Callable[[bytearray, Header], bytes | bytearray | None]


def _set_header(data: bytearray, h: Header, **changes: Any) -> bytearray:
    fields = dict(vars(h))
    fields.update(changes)
    HEADER.pack_into(data, 0, *fields.values())
    return data


def _set_offset(data: bytearray, h: Header, i: int, value: int) -> bytearray:
    struct.pack_into("<Q", data, h.index_offset + 8 * i, value)
    return data


def _item_end_before_aligned_start(data: bytearray, h: Header) -> bytearray | None:
    off = h.offsets(bytes(data))
    for i in range(h.n):
        if align_up(off[i]) > off[i] + 1:  # item i starts after padding
            return _set_offset(data, h, i + 1, off[i] + 1)
    return None


def _item_count_plus_one(data: bytearray, h: Header) -> bytearray | None:
    if h.index_offset + 8 * (h.n + 2) <= h.file_len:
        return None  # the index would still fit: not detectable from the header alone
    return _set_header(data, h, n=h.n + 1)


MUTATIONS: dict[str, Mutation] = {
    "bad_magic": lambda d, h: _set_header(d, h, magic=b"NOTARENA"),
    "magic_last_byte": lambda d, h: _set_header(d, h, magic=b"FFARENA1"),
    "version_2": lambda d, h: _set_header(d, h, version=2),
    "version_0": lambda d, h: _set_header(d, h, version=0),
    "complete_flag_cleared": lambda d, h: _set_header(d, h, flags=h.flags & ~1),
    "truncated_by_1": lambda d, h: d[:-1],
    "truncated_to_10": lambda d, h: d[:10],
    "truncated_to_63": lambda d, h: d[:63],
    "truncated_to_header": lambda d, h: d[:64],
    "empty": lambda d, h: b"",
    "file_len_field_too_big": lambda d, h: _set_header(d, h, file_len=h.file_len + 8),
    "file_len_field_too_small": lambda d, h: _set_header(d, h, file_len=h.file_len - 8),
    "file_longer_than_file_len": lambda d, h: d + bytes(8),
    "data_offset_unaligned": lambda d, h: _set_offset(
        _set_header(d, h, data_offset=h.data_offset + 8), h, 0, h.data_offset + 8
    ),
    "data_offset_zero": lambda d, h: _set_offset(_set_header(d, h, data_offset=0), h, 0, 0),
    "off0_not_data_offset": lambda d, h: _set_offset(d, h, 0, h.data_offset + 64),
    "index_offset_unaligned": lambda d, h: _set_header(d, h, index_offset=h.index_offset - 4),
    "index_beyond_file": lambda d, h: _set_header(d, h, index_offset=h.file_len),
    "offsets_decreasing": lambda d, h: _set_offset(d, h, 2, h.offsets(bytes(d))[1] - 1),
    "item_end_before_aligned_start": _item_end_before_aligned_start,
    "off_n_beyond_index_offset": lambda d, h: _set_offset(d, h, h.n, h.index_offset + 8),
    "item_count_huge": lambda d, h: _set_header(d, h, n=2**64 - 1),
    "item_count_wraps": lambda d, h: _set_header(d, h, n=2**61),  # 8 * (n + 1) wraps to 8
    "item_count_plus_one": _item_count_plus_one,
}
# checks a reader may also do lazily, on first access of the item(s) concerned
LAZY_OK = {"offsets_decreasing", "item_end_before_aligned_start"}
CORRUPT_ITEMS: list[Any] = [b"a" * 100, {"x": 1}, "hello", list(range(50)), b"z" * 3000]


@pytest.fixture
def valid_arena_bytes(arena_dir: Path) -> bytes:
    with SharedList(CORRUPT_ITEMS, path=arena_dir) as sl:
        return Path(sl.path).read_bytes()


def test_valid_copy_opens(arena_dir: Path, valid_arena_bytes: bytes) -> None:
    """Control: an unmodified copy (any file name) opens fine, so mutations are what fail."""
    copy = arena_dir / "copy.bin"
    copy.write_bytes(valid_arena_bytes)
    with SharedList.open(copy) as sl:
        assert list(sl) == CORRUPT_ITEMS
    assert copy.exists()
    copy.unlink()


def _open_and_touch(path: Path, *, lazy: bool) -> None:
    """Open ``path``; where lazy checks are allowed, also read every item's bytes."""
    sl = SharedList.open(path)
    try:
        if lazy:
            for i in range(len(sl)):
                sl.raw(i)
    finally:
        sl.close()


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_corrupt_file_refused(arena_dir: Path, valid_arena_bytes: bytes, case: str) -> None:
    h = Header.parse(valid_arena_bytes)
    assert h.n == len(CORRUPT_ITEMS)
    mutated = MUTATIONS[case](bytearray(valid_arena_bytes), h)
    if mutated is None:
        pytest.skip(f"{case}: not applicable to this layout")
    mutated = bytes(mutated)
    assert mutated != valid_arena_bytes
    bad = arena_dir / f"corrupt-{case}.bin"
    bad.write_bytes(mutated)
    try:
        with pytest.raises(ArenaCorruptError) as info:
            _open_and_touch(bad, lazy=case in LAZY_OK)
        err = info.value
        assert isinstance(err, ValueError)
        assert str(bad) in str(err), str(err)
        assert bad.read_bytes() == mutated  # refused, not modified or removed
    finally:
        bad.unlink(missing_ok=True)


def test_corrupt_file_with_our_name_is_refused(arena_dir: Path, valid_arena_bytes: bytes) -> None:
    data = bytearray(valid_arena_bytes)
    struct.pack_into("<I", data, 8, 2)
    bad = arena_dir / f"ferrofeed-{os.getpid()}-corrupt.arena"
    bad.write_bytes(data)
    with pytest.raises(ArenaCorruptError, match=r"(?i)version"):
        SharedList.open(str(bad))
    bad.unlink()


# ------------------------------------------------------------------ full directories

FULL_SCRIPT = """
import json, sys
import numpy as np
from ferrofeed import ArenaFullError, SharedList

target, kind = sys.argv[1], sys.argv[2]
if kind == "many":
    items = (b"x" * 10_000 for _ in range(1000))  # ~10 MB
elif kind == "one_big":
    items = [b"y" * (10 << 20)]
else:
    items = ({"a": np.ones(1 << 18, dtype=np.float32)} for _ in range(10))  # ~10 MB
try:
    sl = SharedList(items, path=target)
    out = {"result": "ok", "nbytes": sl.nbytes}
    sl.close()
except ArenaFullError as e:
    out = {"result": "ArenaFullError", "msg": str(e), "oserror": isinstance(e, OSError)}
except Exception as e:
    out = {"result": type(e).__name__, "msg": str(e)}
print(json.dumps(out), flush=True)
"""


def _limit_fsize() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _check_full(proc: subprocess.CompletedProcess[str], d: Path, out: dict[str, Any]) -> None:
    assert proc.returncode == 0, f"crashed: rc={proc.returncode}\n{proc.stderr}"
    assert out["result"] == "ArenaFullError", out
    assert out["oserror"] is True
    msg = out["msg"]
    assert str(d) in msg, msg
    assert "path=" in msg, msg
    assert any(ch.isdigit() for ch in msg), msg  # the byte counts
    assert _names(d) == []  # no file left behind


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["many", "one_big", "numpy"])
@pytest.mark.parametrize("exact", [False, True], ids=["dir", "exact-path"])
def test_full_directory_rlimit(
    arena_dir: Path,
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    last_json_line: Callable[[str], Any],
    kind: str,
    exact: bool,
) -> None:
    target = arena_dir / "exact.arena" if exact else arena_dir
    proc = run_python(FULL_SCRIPT, args=[str(target), kind], check=False, preexec_fn=_limit_fsize)
    _check_full(proc, arena_dir, last_json_line(proc.stdout))


@pytest.fixture
def tiny_tmpfs() -> Iterator[Path]:
    """A genuinely full-able 1 MiB tmpfs (needs root and mount rights; skipped otherwise)."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount")
    d = Path(tempfile.mkdtemp(prefix="ff-tmpfs-"))
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(d)], capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.25)
        d.rmdir()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["many", "one_big", "numpy"])
def test_full_tmpfs(
    tiny_tmpfs: Path,
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    last_json_line: Callable[[str], Any],
    kind: str,
) -> None:
    proc = run_python(FULL_SCRIPT, args=[str(tiny_tmpfs), kind], check=False)
    _check_full(proc, tiny_tmpfs, last_json_line(proc.stdout))
    st = os.statvfs(tiny_tmpfs)
    assert st.f_bfree * st.f_frsize >= (1 << 20) - (64 << 10)  # the space came back
    # control: a small arena does fit
    with SharedList([b"s" * 1000 for _ in range(100)], path=tiny_tmpfs) as sl:
        assert len(sl) == 100
    assert _names(tiny_tmpfs) == []
