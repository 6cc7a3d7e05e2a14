"""Writing shards: `ferrofeed.write_shards` and ``ferrofeed pack`` on local folders.

What the issue asks of a pack, each against real readers: an image folder, ferrofeed sources
and dict samples in; WebDataset tar (read by webdataset and `TarShards`) and Parquet in the
Hugging Face layout (read by pyarrow, `ParquetShards` and `datasets` when installed) out;
byte-identical shards whatever the workers; a pack killed with SIGKILL and run again keeps
its finished shards and duplicates no sample; bad files stop the pack naming them, or are
skipped and counted; a destination that cannot be written fails at once.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest
from conftest import run_python

PHOTOS = Path(__file__).parent / "fixtures" / "photos"
PY = sys.executable


def photos() -> list[Path]:
    return sorted(PHOTOS.glob("*.jpg"))


def make_folder(root: Path, per_class: int = 4, classes: tuple[str, ...] = ("cat", "dog")) -> Path:
    """An image folder of the fixture photos (real JPEGs): ``root/<class>/<n>.jpg``."""
    src = photos()
    n = 0
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            shutil.copy(src[n % len(src)], root / c / f"{i:03d}.jpg")
            n += 1
    return root


def shard_bytes(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dest.glob("*.tar"))} | {
        p.name: p.read_bytes() for p in sorted(dest.glob("*.parquet"))
    }


def wds_samples(url: str, *, decode: bool = False) -> list[dict[str, Any]]:
    """webdataset's samples of ``url`` (its reader leaves files to the garbage collector)."""
    import webdataset as wds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        ds = wds.WebDataset(url, shardshuffle=False)
        out = list(ds.decode() if decode else ds)
        del ds
        gc.collect()
    return out


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(ff.__file__).parent.parent))
    return subprocess.run(
        [PY, "-m", "ferrofeed", "pack", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


# -- an image folder into tar ------------------------------------------------------------------


def test_a_folder_packs_into_webdataset_shards_both_readers_read(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=5)
    summary = ff.write_shards(root, tmp_path / "out", samples_per_shard=4, workers=2)
    assert (summary.samples, summary.shards, summary.skipped, summary.resumed) == (10, 3, 0, 0)
    assert summary.bytes == sum(len(b) for b in shard_bytes(tmp_path / "out").values())
    assert summary.index.endswith("_ferrofeed-index.json")

    folder = ff.ImageFolder(root)
    expected = [(Path(p).read_bytes(), label) for p, label in folder]

    ds = wds_samples(str(tmp_path / "out" / "shard-{000000..000002}.tar"))
    got = [(s["jpg"], int(s["cls"])) for s in ds]
    assert got == expected, "webdataset reads every image's bytes unchanged, with its class"

    shards = ff.TarShards(str(tmp_path / "out" / "*.tar"))
    assert [(s["jpg"], s["cls"]) for s in shards] == expected
    assert [s["__key__"] for s in shards] == [f"{i:08d}" for i in range(10)]

    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as t:
        members = t.getmembers()
    assert [m.name for m in members[:2]] == ["00000000.jpg", "00000000.cls"]
    assert {(m.mtime, m.uid, m.gid, m.mode) for m in members} == {(0, 0, 0, 0o444)}


def test_shards_are_byte_identical_for_any_number_of_workers(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=6)
    runs = []
    for workers in (1, 2, 5):
        out = tmp_path / f"w{workers}"
        ff.write_shards(root, out, shard_size="300KB", workers=workers)
        runs.append(shard_bytes(out))
    assert len(runs[0]) > 1
    assert runs[0] == runs[1] == runs[2]
    proc = cli(str(root), str(tmp_path / "cli"), "--shard-size", "300KB", "--workers", "3")
    assert proc.returncode == 0, proc.stderr
    assert shard_bytes(tmp_path / "cli") == runs[0]
    assert "packed 12 samples into" in proc.stdout


def test_the_cli_summary_and_a_pack_run_again(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=2)
    proc = cli(str(root), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "packed 4 samples into 1 shard" in proc.stdout
    before = shard_bytes(tmp_path / "out")
    again = cli(str(root), str(tmp_path / "out"))
    assert again.returncode == 0, again.stderr
    assert "resumed: 1 shards" in again.stdout
    assert shard_bytes(tmp_path / "out") == before
    assert sorted(os.listdir(tmp_path / "out")) == ["_ferrofeed-index.json", "shard-000000.tar"]


def test_the_progress_bar_is_drawn_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_folder(tmp_path / "images", per_class=40)
    monkeypatch.setattr("ferrofeed._pack.time.monotonic", iter(range(0, 10_000)).__next__)
    ff.write_shards(root, tmp_path / "out", progress=True, workers=1)
    err = capsys.readouterr().err
    assert "packing" in err
    assert "/80 samples" in err
    ff.write_shards(root, tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


# -- resume after SIGKILL ----------------------------------------------------------------------

KILL_AFTER_SHARDS = """
import os, signal, sys
import ferrofeed as ff
from ferrofeed import _pack

def kill(self, done, samples, nbytes, skipped, shards):
    if shards >= 3:
        os.kill(os.getpid(), signal.SIGKILL)

_pack._Bar.__call__ = kill
src, dest = sys.argv[1], sys.argv[2]
if src == "samples":
    src = [{"txt": "x" * (i * 37 % 500), "cls": i % 7} for i in range(300)]
ff.write_shards(src, dest, samples_per_shard=10, workers=2, progress=True)
"""


@pytest.mark.parametrize("kind", ["folder", "samples"])
def test_a_pack_killed_midway_resumes_without_rewriting_or_duplicating(
    tmp_path: Path, kind: str
) -> None:
    if kind == "folder":
        src: Any = make_folder(tmp_path / "images", per_class=60)
        arg = str(src)
    else:
        src = [{"txt": "x" * (i * 37 % 500), "cls": i % 7} for i in range(300)]
        arg = "samples"
    dest = tmp_path / "out"
    proc = run_python(KILL_AFTER_SHARDS, args=[arg, str(dest)], check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    finished = sorted(dest.glob("*.tar"))
    assert len(finished) >= 3
    assert any(p.name.endswith(".tmp") for p in dest.iterdir()), "killed with a shard half done"
    stamps = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished}

    summary = ff.write_shards(src, dest, samples_per_shard=10, workers=2)
    n = 120 if kind == "folder" else 300
    assert (summary.samples, summary.resumed) == (n, len(finished))
    for p in finished:
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == stamps[p.name], "not rewritten"
    assert not [p for p in dest.iterdir() if p.name.startswith(".")], "no temporary file left"

    fresh = tmp_path / "fresh"
    ff.write_shards(src, fresh, samples_per_shard=10, workers=1)
    assert shard_bytes(dest) == shard_bytes(fresh)
    keys = [s["__key__"] for s in ff.TarShards(str(dest / "*.tar"))]
    assert keys == [f"{i:08d}" for i in range(n)], "every sample once, in order"


# -- bad input ---------------------------------------------------------------------------------


def bad_folder(root: Path) -> tuple[Path, Path]:
    make_folder(root, per_class=3)
    text = root / "cat" / "001.jpg"
    text.write_bytes(b"this is not an image, only its name says so")
    truncated = root / "dog" / "002.jpg"
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    return text, truncated


def test_a_bad_file_stops_the_pack_naming_it_and_leaves_no_partial_shard(tmp_path: Path) -> None:
    text, truncated = bad_folder(tmp_path / "images")
    proc = cli(str(tmp_path / "images"), str(tmp_path / "out"))
    assert proc.returncode == 1
    assert f"{text}: not a JPEG, PNG, WebP or BMP image" in proc.stderr, proc.stderr
    out = tmp_path / "out"
    assert not list(out.glob("*.tar"))
    assert not list(out.glob(".*.tmp"))

    # The truncated one alone.
    text.unlink()
    with pytest.raises(ff.PackInputError, match="truncated") as e:
        ff.write_shards(tmp_path / "images", tmp_path / "out2")
    assert e.value.sample == str(truncated)
    assert isinstance(e.value, ValueError)
    assert not list((tmp_path / "out2").glob("*.tar"))


def test_on_error_skip_skips_and_counts(tmp_path: Path) -> None:
    text, truncated = bad_folder(tmp_path / "images")
    proc = cli(str(tmp_path / "images"), str(tmp_path / "out"), "--on-error", "skip")
    assert proc.returncode == 0, proc.stderr
    assert "packed 4 samples" in proc.stdout
    assert "skipped 2 samples" in proc.stdout
    assert str(text) in proc.stdout
    assert str(truncated) in proc.stdout
    assert len(list(ff.TarShards(str(tmp_path / "out" / "*.tar")))) == 4

    summary = ff.write_shards(tmp_path / "images", tmp_path / "out2", on_error="skip")
    assert summary.skipped == 2
    assert [k.name for k in summary.skipped_samples] == [str(text), str(truncated)]
    index = json.loads((tmp_path / "out2" / "_ferrofeed-index.json").read_text())
    assert len(index["pack"]["skipped"]) == 2


def test_a_destination_that_cannot_be_written_fails_at_once(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=1)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with pytest.raises(ff.PackDestinationError, match="cannot make the folder") as e:
        ff.write_shards(root, blocker / "out")
    assert isinstance(e.value, OSError)
    assert e.value.filename == str(blocker / "out")
    proc = cli(str(root), str(blocker))
    assert proc.returncode == 1
    assert str(blocker) in proc.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("someone else's")
    with pytest.raises(ff.PackConflictError, match="not empty"):
        ff.write_shards(root, busy)
    ff.write_shards(root, tmp_path / "one", samples_per_shard=1)
    with pytest.raises(ff.PackConflictError, match="other input or options"):
        ff.write_shards(root, tmp_path / "one", samples_per_shard=2)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=1)
    for kw, err in [
        ({"format": "zip"}, ValueError),
        ({"on_error": "ignore"}, ValueError),
        ({"samples_per_shard": 0}, ValueError),
        ({"workers": 0}, ValueError),
        ({"shard_size": "lots"}, ValueError),
        ({"shard_size": -1}, ValueError),
        ({"resize": 0}, ValueError),
        ({"quality": 101, "resize": 32}, ValueError),
        ({"prefix": "a/b"}, ValueError),
        ({"storage_options": {"region": "x"}}, ValueError),
    ]:
        with pytest.raises(err):
            ff.write_shards(root, tmp_path / "out", **kw)
    with pytest.raises(TypeError, match="source must be"):
        ff.write_shards({"jpg": b""}, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="is neither an image folder"):
        ff.write_shards(tmp_path / "missing", tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.tar")) if (tmp_path / "out").exists() else True
    assert ff._pack.parse_size("1.5k") == 1500


# -- other sources -----------------------------------------------------------------------------


def test_dict_samples_pack_as_webdataset_encodes_them(tmp_path: Path) -> None:
    jpeg = photos()[0].read_bytes()
    samples = [
        {
            "__key__": f"s/{i}",
            "jpg": jpeg,
            "cls": i,
            "txt": f"caption {i}",
            "json": {"i": i, "tags": ["a", "b"]},
            "score": i / 4,
            "__url__": "ignored",
        }
        for i in range(5)
    ]
    ff.write_shards(samples, tmp_path / "out", samples_per_shard=2)
    got = wds_samples(str(tmp_path / "out" / "shard-{000000..000002}.tar"), decode=True)
    assert [s["__key__"] for s in got] == [f"s/{i}" for i in range(5)]
    assert [s["cls"] for s in got] == list(range(5))
    assert got[3]["txt"] == "caption 3"
    assert got[3]["json"] == {"i": 3, "tags": ["a", "b"]}
    assert float(got[2]["score"]) == 0.5
    assert all(s["jpg"] == jpeg for s in ff.TarShards(str(tmp_path / "out" / "*.tar")))

    def gen() -> Any:
        yield from ({"txt": str(i)} for i in range(3))

    assert ff.write_shards(gen(), tmp_path / "gen").samples == 3
    with pytest.raises(TypeError, match="field 'arr'"):
        ff.write_shards([{"arr": object()}], tmp_path / "bad")


def test_tar_shards_reshard_and_convert_to_parquet_and_back(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=4)
    ff.write_shards(root, tmp_path / "tar", samples_per_shard=3)
    original = list(ff.TarShards(str(tmp_path / "tar" / "*.tar")))

    # Re-shard from a source (decoded or not, the members' bytes are kept).
    summary = ff.write_shards(ff.TarShards(str(tmp_path / "tar" / "*.tar")), tmp_path / "re")
    assert (summary.samples, summary.shards) == (8, 1)
    assert list(ff.TarShards(str(tmp_path / "re" / "*.tar"))) == [
        {**s, "__shard__": str(tmp_path / "re" / "shard-000000.tar")} for s in original
    ]

    # tar -> Parquet -> tar, through the CLI's pattern source.
    proc = cli(str(tmp_path / "tar" / "*.tar"), str(tmp_path / "pq"), "--format", "parquet")
    assert proc.returncode == 0, proc.stderr
    rows = list(ff.ParquetShards(str(tmp_path / "pq" / "*.parquet")))
    assert [(r["image"], r["label"]) for r in rows] == [(s["jpg"], s["cls"]) for s in original]
    back = ff.write_shards(str(tmp_path / "pq" / "*.parquet"), tmp_path / "back")
    assert back.samples == 8
    again = list(ff.TarShards(str(tmp_path / "back" / "*.tar")))
    assert [(s["jpg"], s["cls"]) for s in again] == [(s["jpg"], s["cls"]) for s in original]


# -- Parquet -----------------------------------------------------------------------------------


def test_parquet_output_is_the_hugging_face_image_layout(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_folder(tmp_path / "images", per_class=3, classes=("ant", "bee", "cow"))
    summary = ff.write_shards(root, tmp_path / "pq", format="parquet", samples_per_shard=4)
    assert (summary.samples, summary.shards) == (9, 3)
    table = pq.read_table(tmp_path / "pq" / "shard-000000.parquet")
    assert table.schema.field("image").type == pa.struct(
        [pa.field("bytes", pa.binary()), pa.field("path", pa.string())]
    )
    assert table.schema.field("label").type == pa.int64()
    meta = json.loads(table.schema.metadata[b"huggingface"])
    assert meta["info"]["features"] == {
        "image": {"_type": "Image"},
        "label": {"names": ["ant", "bee", "cow"], "_type": "ClassLabel"},
    }
    folder = ff.ImageFolder(root)
    rows = pq.read_table(tmp_path / "pq").to_pylist()
    assert [(r["image"]["bytes"], r["label"]) for r in rows] == [
        (Path(p).read_bytes(), label) for p, label in folder
    ]
    assert rows[0]["image"]["path"] == os.path.join("ant", "000.jpg")
    shards = ff.ParquetShards(str(tmp_path / "pq" / "*.parquet"))
    assert [r["label"] for r in shards] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    again = tmp_path / "pq2"
    ff.write_shards(root, again, format="parquet", samples_per_shard=4, workers=1)
    assert shard_bytes(again) == shard_bytes(tmp_path / "pq")


def test_datasets_reads_the_parquet_output(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    root = make_folder(tmp_path / "images", per_class=2)
    ff.write_shards(root, tmp_path / "pq", format="parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "pq" / "*.parquet"), split="train"
    )
    assert ds.features["label"].names == ["cat", "dog"]
    assert ds[0]["image"].size == ff.io.decode_image(photos()[0].read_bytes()).shape[1::-1]
    assert ds["label"] == [0, 0, 1, 1]


def test_the_docstring_examples_run() -> None:
    import doctest

    from ferrofeed import _pack

    res = doctest.testmod(_pack)
    assert res.failed == 0
    assert res.attempted > 0


# -- re-encoding -------------------------------------------------------------------------------


def test_resize_reencodes_every_image_in_rust(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=3)
    summary = ff.write_shards(root, tmp_path / "out", resize=64, quality=85, workers=2)
    assert summary.samples == 6
    folder = ff.ImageFolder(root)
    for sample, (path, label) in zip(
        ff.TarShards(str(tmp_path / "out" / "*.tar")), folder, strict=True
    ):
        assert sample["cls"] == label
        original = ff.io.decode_image(Path(path).read_bytes())
        small = ff.io.decode_image(sample["jpg"])
        h, w = original.shape[:2]
        assert min(small.shape[:2]) == 64, "the shorter side (EXIF orientation applied)"
        assert small.shape[2] == 3
        assert abs(small.shape[0] / small.shape[1] - h / w) < 0.05
    proc = cli(str(root), str(tmp_path / "cli"), "--resize", "64", "--quality", "85")
    assert proc.returncode == 0, proc.stderr
    assert shard_bytes(tmp_path / "cli") == shard_bytes(tmp_path / "out"), "any workers"
    # A different quality is another pack: smaller files here.
    low = ff.write_shards(root, tmp_path / "low", resize=64, quality=20)
    assert low.bytes < summary.bytes

    bad = make_folder(tmp_path / "bad", per_class=1)
    (bad / "cat" / "000.jpg").write_bytes((bad / "dog" / "000.jpg").read_bytes()[:5000])
    with pytest.raises(ff.PackInputError) as e:
        ff.write_shards(bad, tmp_path / "bad-out", resize=64)
    assert e.value.sample == str(bad / "cat" / "000.jpg")


INTERRUPTED = """
import os, signal, sys
from ferrofeed import _pack, cli

def interrupt(self, done, samples, nbytes, skipped, shards):
    if shards >= 2:
        os.kill(os.getpid(), signal.SIGINT)

_pack._Bar.__call__ = interrupt
_pack.sys.stderr.isatty = lambda: True  # the progress callback is the bar's
sys.exit(cli.main(["pack", sys.argv[1], sys.argv[2], "--samples-per-shard", "8"]))
"""


def test_ctrl_c_stops_the_pack_and_a_second_run_finishes_it(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=60)
    dest = tmp_path / "out"
    proc = run_python(INTERRUPTED, args=[str(root), str(dest)], check=False)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted (run it again to resume)" in proc.stderr
    assert not list(dest.glob(".*.tmp")), "the shard being written is removed"
    kept = len(list(dest.glob("*.tar")))
    assert 2 <= kept < 15
    summary = ff.write_shards(root, dest, samples_per_shard=8)
    assert (summary.samples, summary.resumed) == (120, kept)
