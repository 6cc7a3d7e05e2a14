"""Fault and hostile-input tests (issue 12): nothing a file or another process does may
abort the process, leak an arena, or delete someone else's file.

Every test that could crash the interpreter runs its probe in a subprocess (``run_python``),
so a crash fails one test instead of taking the suite down.
"""

from __future__ import annotations

import io
import os
import signal
import struct
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import last_json_line, run_python

Image = pytest.importorskip("PIL.Image")

# --------------------------------------------------------------------------------------
# hostile images: tiny files whose headers claim 13000 x 13000 pixels

BIG = 13000


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    )


def huge_png(width: int = BIG, height: int = BIG, depth: int = 8, color: int = 2) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``width`` x ``height`` pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 8))
        + _png_chunk(b"IEND", b"")
    )


def _pil(img: Any, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def huge_jpeg(progressive: bool = False) -> bytes:
    """A small JPEG with its frame header (SOF) patched to claim 13000 x 13000."""
    data = bytearray(
        _pil(Image.new("RGB", (16, 16), (90, 20, 200)), "JPEG", progressive=progressive)
    )
    sof = b"\xff\xc2" if progressive else b"\xff\xc0"
    at = data.index(sof)
    # FF Cn, length (2), precision (1), height (2), width (2).
    data[at + 5 : at + 9] = struct.pack(">HH", BIG, BIG)
    return bytes(data)


def huge_webp_lossless() -> bytes:
    """A 1x1 lossless WebP whose VP8L header claims 13000 x 13000."""
    data = bytearray(_pil(Image.new("RGB", (1, 1), (1, 2, 3)), "WEBP", lossless=True))
    at = data.index(b"VP8L") + 8  # chunk tag, chunk size
    assert data[at] == 0x2F
    bits = int.from_bytes(data[at + 1 : at + 5], "little")
    bits = (bits & ~((1 << 28) - 1)) | (BIG - 1) | ((BIG - 1) << 14)
    data[at + 1 : at + 5] = bits.to_bytes(4, "little")
    return bytes(data)


def huge_webp_lossy() -> bytes:
    """A 16x16 lossy WebP whose VP8 frame header claims 13000 x 13000."""
    data = bytearray(_pil(Image.new("RGB", (16, 16), (1, 2, 3)), "WEBP", quality=50))
    at = data.index(b"VP8 ") + 8
    # 3-byte frame tag, start code 9d 01 2a, then 14-bit width and height (+2 scale bits).
    assert data[at + 3 : at + 6] == b"\x9d\x01\x2a"
    data[at + 6 : at + 10] = struct.pack("<HH", BIG, BIG)
    return bytes(data)


def huge_bmp_rle8() -> bytes:
    """An 8-bit RLE BMP of 13000 x 13000 pixels whose data is one end-of-bitmap code."""
    palette = b"\x00\x00\x00\x00" * 256
    pixels = b"\x00\x01"
    offset = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, BIG, BIG, 1, 8, 1, 0, 2835, 2835, 256, 0)
    head = b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset)
    return head + info + palette + pixels


HOSTILE = {
    "png": huge_png,
    "png16": lambda: huge_png(depth=16, color=6),
    "jpeg": huge_jpeg,
    "jpeg_progressive": lambda: huge_jpeg(progressive=True),
    "webp_lossless": huge_webp_lossless,
    "webp_lossy": huge_webp_lossy,
    "bmp_rle8": huge_bmp_rle8,
}

# Caps the child's address space a little above what it uses once ferrofeed is imported,
# so that a decoder allocating what the header claims (0.5 to 1.4 GB) fails to allocate:
# the situation of a loader on a machine (or in a container) short of memory. Each image is
# decoded on the calling thread (no new thread stacks or malloc arenas under the cap).
_LIMITED_DECODE = """
import json, resource, sys
import ferrofeed.io as fio

def vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")

fio.decode_image(sys.argv[2], size=8)  # warm up: first-use allocations before the cap
limit = vm_bytes() + 256 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    fio.decode_image(sys.argv[1], size=64)
    print(json.dumps({"result": "decoded"}))
except fio.ImageDecodeError as e:
    print(json.dumps({"result": "ImageDecodeError", "message": str(e)}))
except MemoryError as e:
    print(json.dumps({"result": "MemoryError", "message": str(e)}))
"""


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_tiny_file_claiming_huge_size_is_an_error_not_an_abort(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"bomb-{kind}.img"
    path.write_bytes(HOSTILE[kind]())
    ok = tmp_path / "ok.png"
    ok.write_bytes(_pil(Image.new("RGB", (4, 4)), "PNG"))
    proc = run_python(_LIMITED_DECODE, args=[str(path), str(ok)], check=False)
    died = signal.Signals(-proc.returncode).name if proc.returncode < 0 else proc.returncode
    assert proc.returncode == 0, f"the process died ({died})\n{proc.stderr[-2000:]}"
    out = last_json_line(proc.stdout)
    assert out["result"] == "ImageDecodeError", out
    assert str(path) in out["message"]


def test_pixel_budget_is_settable_and_names_the_file(tmp_path: Path) -> None:
    import ferrofeed.io as fio

    path = tmp_path / "wide.png"
    path.write_bytes(_pil(Image.new("RGB", (300, 200), (5, 6, 7)), "PNG"))
    default = fio.get_max_image_pixels()
    assert default >= 2**27
    try:
        fio.set_max_image_pixels(300 * 200)
        assert fio.decode_image(path).shape == (200, 300, 3)
        fio.set_max_image_pixels(300 * 200 - 1)
        assert fio.get_max_image_pixels() == 300 * 200 - 1
        with pytest.raises(fio.ImageDecodeError, match=r"wide\.png.*300x200.*59999"):
            fio.decode_image(path)
        with pytest.raises(fio.ImageDecodeError, match=r"wide\.png"):
            fio.load_images([path], size=8)
        with pytest.raises(ValueError, match="positive"):
            fio.set_max_image_pixels(0)
    finally:
        fio.set_max_image_pixels(default)
    assert fio.decode_image(path).shape == (200, 300, 3)


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("fault tests use /dev/shm and Linux signals", allow_module_level=True)


# --------------------------------------------------------------------------------------
# arenas: unknown flags, truncation, close() after a rename, SIGTERM, `ferrofeed clean`


def test_unknown_arena_flag_bits_are_refused(arena_dir: Path) -> None:
    import ferrofeed
    from ferrofeed import SharedList

    with SharedList([1, 2, 3], path=arena_dir / "a.arena") as sl:
        data = bytearray(Path(sl.path).read_bytes())
    data[12:16] = (1 | 1 << 7).to_bytes(4, "little")  # complete + an unknown bit
    bad = arena_dir / "flags.arena"
    bad.write_bytes(bytes(data))
    with pytest.raises(ferrofeed.ArenaCorruptError, match=r"unknown flag bits 0x80"):
        SharedList.open(bad)
    bad.unlink()


def test_truncated_arena_is_refused_at_open_and_unpickle(arena_dir: Path) -> None:
    import pickle

    import ferrofeed
    from ferrofeed import SharedList

    sl = SharedList([b"x" * 1000] * 50, path=arena_dir / "t.arena")
    blob = pickle.dumps(sl)
    copy = arena_dir / "copy.arena"
    copy.write_bytes(Path(sl.path).read_bytes())
    sl.close()
    with open(copy, "r+b") as f:
        f.truncate(copy.stat().st_size - 4096)
    with pytest.raises(ferrofeed.ArenaCorruptError, match="truncated"):
        SharedList.open(copy)
    # An unpickled handle opens (and checks) the file: truncate the original path too.
    Path(sl.path).write_bytes(copy.read_bytes())
    with pytest.raises(ferrofeed.ArenaCorruptError, match="truncated"):
        pickle.loads(blob)
    copy.unlink()
    Path(sl.path).unlink()


def test_close_leaves_a_file_renamed_over_its_path(arena_dir: Path) -> None:
    from ferrofeed import SharedList

    sl = SharedList(["mine"], path=arena_dir / "x.arena")
    newer = SharedList(["newer"], path=arena_dir / "y.arena")
    # Someone renames another arena over the owner's path.
    Path(newer.path).rename(sl.path)
    sl.close()
    assert Path(sl.path).exists(), "close() removed a file that is not its own"
    assert SharedList.open(sl.path)[0] == "newer"
    Path(sl.path).unlink()
    newer.close()  # its own path is gone: nothing to remove, no error


_OWN_ARENA_THEN_WAIT = """
import os, signal, sys, time
from ferrofeed import SharedList
if sys.argv[2] == "handler":
    def on_term(signum, frame):
        print("previous handler ran, arena file exists:", os.path.exists(sl.path), flush=True)
        print("still readable:", sl[1], flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, on_term)
sl = SharedList(["a", "b"], path=sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def _owner_after_sigterm(path: Path, mode: str) -> tuple[int, str]:
    """Start a process owning an arena at ``path``, SIGTERM it; its status and output."""
    import subprocess

    with subprocess.Popen(
        [sys.executable, "-c", _OWN_ARENA_THEN_WAIT, str(path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            pytest.fail(f"the owner did not start: {line!r} {proc.communicate()[1]}")
        assert path.exists()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out + err


def test_sigterm_of_the_owner_removes_its_arena(arena_dir: Path) -> None:
    path = arena_dir / "owned.arena"
    status, out = _owner_after_sigterm(path, "default")
    assert status == -signal.SIGTERM, out  # still dies of SIGTERM
    assert not path.exists()


def test_sigterm_chains_the_handler_already_installed(arena_dir: Path) -> None:
    path = arena_dir / "owned.arena"
    status, out = _owner_after_sigterm(path, "handler")
    assert status == 3, out
    assert "previous handler ran, arena file exists: False" in out
    assert "still readable: b" in out
    assert not path.exists()


def test_ferrofeed_clean_removes_orphans_only(arena_dir: Path) -> None:
    from ferrofeed import SharedList

    orphan = arena_dir / "orphan.arena"
    code = f"""
        import os, signal
        from ferrofeed import SharedList
        sl = SharedList([1, 2], path={str(orphan)!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """
    # The live arena first: creating an arena sweeps its directory.
    with SharedList([3], path=arena_dir / "live.arena") as live:
        proc = run_python(code, check=False)
        assert proc.returncode == -signal.SIGKILL
        assert orphan.exists()
        out = run_python(
            "import sys; from ferrofeed.cli import main; sys.exit(main())",
            args=["clean", str(arena_dir)],
        ).stdout
        assert f"removed {orphan}" in out
        assert "removed 1 orphaned arena file\n" in out
        assert not orphan.exists()
        assert Path(live.path).exists()
        # python -m ferrofeed clean, on a clean directory, says so.
        import subprocess

        proc2 = subprocess.run(
            [sys.executable, "-m", "ferrofeed", "clean", str(arena_dir)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert "removed 0 orphaned arena files" in proc2.stdout
        assert Path(live.path).exists()


# --------------------------------------------------------------------------------------
# ImageFolder and symbolic-link loops


def test_image_folder_visits_each_folder_once(tmp_path: Path) -> None:
    from ferrofeed import ImageFolder

    for rel in ("cat/a.jpg", "dog/b.jpg", "dog/sub/c.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    (tmp_path / "cat" / "loop").symlink_to(tmp_path / "cat")
    (tmp_path / "dog" / "sub" / "up").symlink_to(tmp_path / "dog")
    (tmp_path / "dog" / "again").symlink_to(tmp_path / "dog" / "sub")
    folder = ImageFolder(tmp_path)
    names = [(Path(p).relative_to(tmp_path).as_posix(), label) for p, label in folder]
    assert names == [("cat/a.jpg", 0), ("dog/again/c.jpg", 1), ("dog/b.jpg", 1)]


# --------------------------------------------------------------------------------------
# named pipes, sockets and devices among the images

# The rescuer's delay: past it, a reader stuck on one of the test's pipes is set free.
RESCUE_AFTER_S = 20.0


class Fifos:
    """Named pipes made for a test, and a hang guard for them.

    Opening a FIFO for reading waits for a writer, forever if none comes: the hole these
    tests cover. Should a reader get stuck there all the same, the rescuer thread (from
    ``RESCUE_AFTER_S`` on) keeps opening each pipe's write end without blocking and closing
    it at once, so that the reader gets end-of-file, and the test fails on its asserts
    instead of hanging (``rescued`` counts it). A reader that refuses the pipe, as it must,
    never notices the rescuer, however slow the machine.
    """

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.rescued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._rescue, daemon=True)
        self._thread.start()

    def make(self, path: Path) -> Path:
        os.mkfifo(path)
        self.paths.append(path)
        return path

    def _rescue(self) -> None:
        if self._stop.wait(RESCUE_AFTER_S):
            return
        while not self._stop.wait(0.2):
            for p in list(self.paths):
                try:
                    fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:  # ENXIO: nobody is reading it
                    continue
                os.close(fd)
                self.rescued += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    guard = Fifos()
    yield guard
    guard.close()
    assert guard.rescued == 0, "a reader was stuck on a named pipe"


def _jpeg_file(path: Path, shade: int) -> str:
    path.write_bytes(_pil(Image.new("RGB", (20, 16), (shade, 40, 90)), "JPEG"))
    return str(path)


@pytest.mark.timeout(60)
def test_image_folder_lists_regular_files_and_links_to_them_only(
    tmp_path: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from ferrofeed import DataLoader, ImageFolder, ops

    cat = tmp_path / "cat"
    cat.mkdir()
    _jpeg_file(cat / "a.jpg", 10)
    (cat / "link.jpg").symlink_to(cat / "a.jpg")
    fifos.make(cat / "pipe.jpg")
    (cat / "pipelink.jpg").symlink_to(cat / "pipe.jpg")
    (cat / "broken.jpg").symlink_to(cat / "missing.jpg")
    (cat / "null.jpg").symlink_to("/dev/null")
    (cat / "sub.jpg").mkdir()  # a folder with an image's name: searched, not listed
    _jpeg_file(cat / "sub.jpg" / "b.jpg", 20)
    monkeypatch.chdir(cat)  # a short name: Unix socket paths are limited to 108 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock.jpg")
        folder = ImageFolder(tmp_path)
        names = [Path(p).relative_to(tmp_path).as_posix() for p in folder.paths]
        assert names == ["cat/a.jpg", "cat/link.jpg", "cat/sub.jpg/b.jpg"]
        # And a whole epoch goes through.
        loader = DataLoader(folder, batch_size=2, transform=ops.decode_image(size=8))
        assert [len(labels) for _, labels in loader] == [2, 1]


@pytest.mark.timeout(60)
def test_a_named_pipe_given_as_a_path_fails_at_once_naming_it(tmp_path: Path, fifos: Fifos) -> None:
    import ferrofeed.io as fio
    from ferrofeed import (
        ArenaError,
        ImageReadError,
        PipelineBuilder,
        PipelineError,
        SharedList,
        ops,
    )

    fifo = fifos.make(tmp_path / "pipe.jpg")
    good = _jpeg_file(tmp_path / "good.jpg", 30)
    with pytest.raises(ImageReadError, match="not a regular file: a named pipe") as info:
        fio.decode_image(fifo, size=8)
    assert isinstance(info.value, OSError)
    assert info.value.filename == str(fifo)
    assert str(fifo) in str(info.value)
    with pytest.raises(ImageReadError, match="named pipe"):
        fio.load_images([good, str(fifo)], size=8)
    # A device reads as empty; it is refused as what it is.
    with pytest.raises(ImageReadError, match="a character device"):
        fio.decode_image("/dev/null")
    # So is a pipe given as an arena to open.
    with pytest.raises(ArenaError, match="not a regular file") as aerr:
        SharedList.open(fifo)
    assert isinstance(aerr.value, OSError)

    def pipeline(on_error: str) -> Any:
        return (
            PipelineBuilder()
            .add_source([good, str(fifo), good])
            .pipe(ops.read_file(), on_error=on_error)
            .add_sink()
            .build()
        )

    p = pipeline("raise")
    with pytest.raises(PipelineError) as perr:
        list(p)
    (inner,) = perr.value.exceptions
    assert isinstance(inner, OSError)
    assert str(fifo) in str(inner)
    assert "named pipe" in str(inner)
    p = pipeline("skip")
    assert len(list(p)) == 2
    assert p.stats()["read_file"]["failures"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("native", [True, False], ids=["native", "python_transform"])
def test_a_named_pipe_in_a_loader_fails_fast_or_is_skipped(
    tmp_path: Path, fifos: Fifos, native: bool
) -> None:
    import ferrofeed.io as fio
    import numpy as np
    from ferrofeed import DataLoader, ImageFiles, ImageReadError, ops

    fifo = fifos.make(tmp_path / "pipe.jpg")
    paths = [_jpeg_file(tmp_path / f"{i}.jpg", 40 * i) for i in range(3)]
    paths.insert(2, str(fifo))
    files = ImageFiles(paths, labels=list(range(4)))

    def decode(item: tuple[str, int]) -> tuple[np.ndarray, int]:
        return fio.decode_image(item[0], size=8).numpy(), item[1]

    def make(**kw: Any) -> DataLoader:
        transform: Any = ops.decode_image(size=8) if native else decode
        return DataLoader(files, batch_size=2, transform=transform, num_threads=2, **kw)

    with pytest.raises(ImageReadError, match="named pipe") as info:
        list(make())
    assert str(fifo) in str(info.value)
    loader = make(on_error="skip")
    labels = [np.asarray(batch[1]).tolist() for batch in loader]
    assert labels == [[0, 1], [3]]
    assert loader.epoch == 1
    stats = loader.stats()
    assert stats["skipped_count"] == 1
    ((index, message),) = stats["skipped"]
    assert index == 2
    assert message.startswith("ImageReadError: ")
    assert str(fifo) in message
    assert "named pipe" in message
