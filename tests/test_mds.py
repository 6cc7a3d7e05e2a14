"""MDSShards against datasets written by mosaicml-streaming's own ``MDSWriter``.

Each dataset is written by the `streaming` package (installed without its pins: it asks for
numpy<2.2, and its writer works on ours) and read back by ferrofeed and by streaming's own
reader (`MDSReader`), column by column: the same values, and for encoded images the very
bytes the writer stored. Then: the native image chain over MDS, object storage (the S3 test
server), and bad datasets.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import ferrofeed as ff
import numpy as np
import pytest
from ferrofeed import ops

zstd = pytest.importorskip("zstd")
Image = pytest.importorskip("PIL.Image")
skimage_data = pytest.importorskip("skimage.data")


def _streaming() -> tuple[Any, Any]:
    """streaming's ``MDSWriter`` and ``MDSReader``, without its package ``__init__``.

    ``import streaming`` imports its whole framework (transformers, cloud SDKs); the MDS
    writer and reader need none of it. Their parent packages are made bare namespace
    packages, so that only the format's modules (and their few imports) load.
    """
    found = importlib.util.find_spec("streaming") if "streaming" not in sys.modules else None
    if found is not None:
        assert found.submodule_search_locations is not None
        root = Path(next(iter(found.submodule_search_locations)))
        for name, path in (("streaming", root), ("streaming.base", root / "base")):
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module
    elif "streaming" not in sys.modules:
        pytest.skip("mosaicml-streaming is not installed", allow_module_level=True)
    from streaming.base.format.mds.reader import MDSReader
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter, MDSReader


MDSWriter, MDSReader = _streaming()

# Every encoding the issue names, and the scalar family: the value each sample gets.
COLUMNS = {
    "raw": "bytes",
    "text": "str",
    "n": "int",
    "x32": "float32",
    "x64": "float64",
    "x16": "float16",
    "u64": "uint64",
    "i8": "int8",
    "u16": "uint16",
    "big": "str_int",
    "dec": "str_float",
    "exact": "str_decimal",
    "meta": "json",
    "jpeg": "jpeg",
    "png": "png",
    "pixels": "pil",
    "grey": "pil",
    "vec": "ndarray",
    "fixed": "ndarray:float32:2,3",
    "dtype_only": "ndarray:int16",
    "label": "int",
}
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "coins", "camera")
N = 24


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """JPEG files of scikit-image's real photos (small, so the module stays quick)."""
    where = tmp_path_factory.mktemp("photos")
    paths = []
    for name in PHOTOS:
        img = Image.fromarray(np.asarray(getattr(skimage_data, name)()))
        img.thumbnail((96, 96))
        path = where / f"{name}.jpg"
        img.convert("RGB").save(path, quality=90)
        paths.append(path)
    return paths


def sample(i: int, photos: list[Path]) -> dict[str, Any]:
    """Sample ``i``: every column, with values that reach each encoding's corners."""
    photo = Image.open(photos[i % len(photos)])  # jpeg: the file's own bytes are stored
    rng = np.random.default_rng(i)
    return {
        "raw": bytes(rng.integers(0, 256, i * 7, dtype=np.uint8)),
        "text": f"sample {i}: déjà vu {'x' * i}",
        "n": -(2**62) + i,
        "x32": i / 3,
        "x64": 1.4000000000000001 + i,
        "x16": i / 7,
        "u64": 2**64 - 1 - i,
        "i8": -128 + i,
        "u16": 65535 - i,
        "big": 10**30 + i,
        "dec": i / 9,
        "exact": Decimal(f"{i}.10"),
        "meta": {"b": i, "a": [1.4000000000000001, None, True], "big": 2**70 + i},
        "jpeg": photo,
        "png": photo.convert("RGB").resize((20 + i, 10)),
        "pixels": photo.convert("RGBA").resize((8, 5 + i % 3)),
        "grey": photo.convert("L").resize((7, 3)),
        "vec": rng.integers(-1000, 1000, (i % 4 + 1, 3)).astype(np.int64),
        "fixed": np.full((2, 3), i, np.float32),
        "dtype_only": np.arange(i + 1, dtype=np.int16).reshape(1, -1),
        "label": i % len(PHOTOS),
    }


def write(out: Path, photos: list[Path], compression: str | None) -> Path:
    """A dataset of ``N`` samples in several shards, by streaming's own writer."""
    with MDSWriter(columns=COLUMNS, out=str(out), compression=compression, size_limit=1 << 14) as w:
        for i in range(N):
            w.write(sample(i, photos))
    return out


@pytest.fixture(scope="module", params=[None, "zstd", "gz"])
def dataset(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, photos: list[Path]
) -> Path:
    return write(tmp_path_factory.mktemp(f"mds-{request.param}"), photos, request.param)


def reference(root: Path) -> list[dict[str, Any]]:
    """The samples as streaming's ``MDSReader`` decodes them (compressed shards unpacked)."""
    index = json.loads((root / "index.json").read_text())
    plain = root.parent / (root.name + "-plain")
    plain.mkdir(exist_ok=True)
    out = []
    for entry in index["shards"]:
        raw = plain / entry["raw_data"]["basename"]
        if entry["compression"] is None:
            shutil.copy(root / entry["raw_data"]["basename"], raw)
        else:
            data = (root / entry["zip_data"]["basename"]).read_bytes()
            unpack = zstd.decompress if entry["compression"].startswith("zstd") else gzip.decompress
            raw.write_bytes(unpack(data))
        # The raw file is in `plain`: read as a shard written without compression.
        reader = MDSReader.from_json(
            str(plain), "", {**entry, "compression": None, "zip_data": None}
        )
        out += [reader.decode_sample(reader.get_sample_data(k)) for k in range(entry["samples"])]
    return out


def assert_same_sample(
    ours: dict[str, Any], theirs: dict[str, Any], written: dict[str, Any]
) -> None:
    """ferrofeed's decoded sample against streaming's (and what was written)."""
    assert list(ours) == sorted(COLUMNS)  # MDSWriter stores columns by name
    for name, value in ours.items():
        ref = theirs[name]
        encoding = COLUMNS[name]
        if encoding in ("jpeg", "png"):
            # The stored file, bytes for bytes; it decodes as streaming's image does.
            assert isinstance(value, bytes)
            if encoding == "jpeg":
                assert value == Path(written[name].filename).read_bytes()
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(value))), np.asarray(ref))
        elif encoding == "pil":
            assert isinstance(value, np.ndarray)
            assert value.flags.writeable
            assert value.dtype == np.asarray(ref).dtype
            assert np.array_equal(value, np.asarray(ref))
        elif encoding.startswith("ndarray"):
            assert isinstance(value, np.ndarray)
            assert value.flags.writeable
            assert value.dtype == ref.dtype
            assert value.shape == ref.shape
            assert np.array_equal(value, ref)
        elif encoding == "str_decimal":
            assert Decimal(value) == ref  # its text (streaming gives a Decimal)
        elif encoding == "json":
            assert value == ref
            assert repr(value) == repr(ref)  # key order, float digits, big ints
        else:
            # Numbers as Python's own (streaming gives numpy scalars), text as str.
            python = {np.integer: int, np.floating: float}
            same = next((t for base, t in python.items() if isinstance(ref, base)), type(ref))
            assert type(value) is same, (name, type(value), type(ref))
            assert value == ref, name


def test_samples_equal_streamings_own_reader(dataset: Path, photos: list[Path]) -> None:
    src = ff.MDSShards(dataset)
    index = json.loads((dataset / "index.json").read_text())
    assert len(index["shards"]) > 2
    assert [n for _, n in src.shards] == [e["samples"] for e in index["shards"]]
    assert len(src) == N
    theirs = reference(dataset)
    ours = list(src)
    assert len(ours) == len(theirs) == N
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_same_sample(a, b, sample(i, photos))


def test_index_json_path_and_a_loader_over_it(dataset: Path) -> None:
    """The index itself may be given; a DataLoader shuffles, shards and resumes MDS as any
    sharded source (every sample once an epoch, on each of 2 ranks' halves)."""
    src = ff.MDSShards(dataset / "index.json")
    assert src.shards == ff.MDSShards(dataset).shards
    labels = [s["n"] for s in src]
    seen = []
    for rank in range(2):
        dl = ff.DataLoader(
            src, 4, shuffle=True, seed=3, rank=rank, world_size=2, transform=lambda s: s["n"]
        )
        seen += [int(x) for batch in dl for x in batch]
    assert sorted(seen) == sorted(labels)


def test_native_image_chain_reads_the_jpeg_column(dataset: Path, photos: list[Path]) -> None:
    src = ff.MDSShards(dataset)
    dl = ff.DataLoader(
        src, 8, transform=ops.decode_image(size=(32, 32)), image="jpeg", label="label"
    )
    images, labels = [], []
    for x, y in dl:
        images.append(np.asarray(x))
        labels += np.asarray(y).tolist()
    assert labels == [i % len(PHOTOS) for i in range(N)]
    got = np.concatenate(images)
    assert got.shape == (N, 32, 32, 3)
    # The same decode of the same files, outside the loader.
    want = np.stack(
        [
            np.asarray(ff.io.decode_image(photos[i % len(photos)].read_bytes(), size=(32, 32)))
            for i in range(N)
        ]
    )
    assert np.array_equal(got, want)


def test_an_int_column_is_a_label_and_a_missing_field_is_named(dataset: Path) -> None:
    src = ff.MDSShards(dataset)
    dl = ff.DataLoader(src, 8, transform=ops.decode_image(size=16), image="png", label="nope")
    with pytest.raises(ff.ShardFieldError, match="nope"):
        next(iter(dl))


# -- bad datasets ----------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path: Path, photos: list[Path]) -> Path:
    return write(tmp_path / "ds", photos, None)


def _edit_index(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    index = json.loads((root / "index.json").read_text())
    change(index)
    (root / "index.json").write_text(json.dumps(index))


def test_a_missing_index_or_shard_is_named(small: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"index\.json"):
        ff.MDSShards(tmp_path / "nothing-here")
    (small / "shard.00001.mds").unlink()
    with pytest.raises(FileNotFoundError, match=r"shard\.00001\.mds"):
        ff.MDSShards(small)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda ix: ix["shards"][0].update(format="jsonl"), "format 'jsonl'"),
        (lambda ix: ix["shards"][1].update(compression="br:5"), "compressed with 'br:5'"),
        (lambda ix: ix["shards"][0].pop("samples"), "no file name or sample count"),
        (lambda ix: ix.update(shards=[]), "not an MDS index"),
    ],
)
def test_an_index_that_is_not_mds_is_refused(
    small: Path, change: Callable[[dict[str, Any]], None], match: str
) -> None:
    _edit_index(small, change)
    with pytest.raises(ValueError, match=match):
        ff.MDSShards(small)


def test_a_truncated_shard_names_the_shard_and_loses_no_other(small: Path) -> None:
    shard = small / "shard.00001.mds"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 40])
    src = ff.MDSShards(small)  # counts come from the index: not read yet
    with pytest.raises(ff.ShardCorruptError, match=r"shard\.00001\.mds") as e:
        list(src)
    assert e.value.shard == str(shard)
    # Under skip, the loader delivers every other shard's samples.
    dl = ff.DataLoader(src, 4, on_error="skip", transform=lambda s: s["n"])
    got = [int(x) for batch in dl for x in batch]
    lost = src.shards[1][1]
    assert len(got) == N - lost
    assert dl.stats()["skipped_count"] == lost


def test_a_corrupt_header_is_refused_at_header(small: Path) -> None:
    shard = small / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[4:8] = (10**9).to_bytes(4, "little")  # the first offset, far past the file
    shard.write_bytes(bytes(data))
    with pytest.raises(ff.ShardCorruptError, match="header") as e:
        next(iter(ff.MDSShards(small)))
    assert e.value.at == "header"


# -- object storage --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    objstore = pytest.importorskip("objstore")
    with objstore.S3Server() as server:
        server.create_bucket("mds")
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_from_the_s3_server_as_locally(
    s3: Any,
    tmp_path: Path,
    photos: list[Path],
    compression: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = write(tmp_path / "ds", photos, compression)
    for path in root.iterdir():
        s3.put_file("mds", f"{compression}/ds/{path.name}", path)
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FERROFEED_CACHE_DIR", str(tmp_path / "cache"))
    remote = ff.MDSShards(f"s3://mds/{compression}/ds")
    here = ff.MDSShards(root)
    assert [n for _, n in remote.shards] == [n for _, n in here.shards]
    theirs = reference(root)
    for i, (a, b) in enumerate(zip(list(remote), theirs, strict=True)):
        assert_same_sample(a, b, sample(i, photos))
    kw: dict[str, Any] = {"shuffle": True, "seed": 5, "transform": lambda s: s["n"]}
    assert [list(b) for b in ff.DataLoader(remote, 4, **kw)] == [
        list(b) for b in ff.DataLoader(here, 4, **kw)
    ]
    with pytest.raises(ff.ShardNotFoundError, match=r"s3://mds/nope/index\.json"):
        ff.MDSShards("s3://mds/nope")
