"""TarShards against the `webdataset` package's own reader, over the same tar bytes.

Every test writes its shard itself (Python's `tarfile`, webdataset's `TarWriter`, the `tar`
binary for sparse members, or tarfile's bytes cut short), reads it with webdataset (the stages that
``webdataset.WebDataset(path, shardshuffle=False)`` chains, and ``.decode()``'s default
decoder) and with ``ferrofeed.TarShards(path)`` iterated directly, and compares the two.
Where the two may legitimately differ (an input ferrofeed refuses), the test says which
outcomes it accepts: the samples webdataset gives, or a `ferrofeed.FerrofeedError` that
names the shard or member.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import shutil
import subprocess
import tarfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest

webdataset = pytest.importorskip("webdataset")

Member = tuple[str, bytes]

# What only one of the two readers adds to a sample: webdataset's ``__url__`` and
# ``__local_path__`` (the shard's URL and local path) and ferrofeed's ``__shard__`` (the
# shard's path, as given). They say where the sample came from, not what it is, so they are
# left out of the comparison; `assert_same` checks ``__shard__`` on its own.
WHERE_FROM = ("__url__", "__local_path__", "__shard__")


# -- writing shards ------------------------------------------------------------------------


def tar_bytes(members: Sequence[Member], *, mode: str = "w") -> bytes:
    """A tar archive of ``members`` (name, content), in order, as bytes (``mode``: w:gz...)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_tar(path: Path, members: Sequence[Member], *, mode: str = "w") -> Path:
    path.write_bytes(tar_bytes(members, mode=mode))
    return path


def baseline_members(n: int = 5) -> list[Member]:
    """An ordinary shard's members: ``n`` samples of jpg, cls, json and txt."""
    members: list[Member] = []
    for i in range(n):
        key = f"part/{i:06d}"
        jpg = b"\xff\xd8\xff\xe0" + bytes((i * 7 + j) % 256 for j in range(300 + 211 * i))
        meta = {"i": i, "name": f"s{i}", "w": [0.5, 1.25], "ok": i % 2 == 0, "none": None}
        members += [
            (f"{key}.jpg", jpg),
            (f"{key}.cls", str(i * 3).encode()),
            (f"{key}.json", json.dumps(meta).encode()),
            (f"{key}.txt", f"caption {i}: déjà vu".encode()),
        ]
    return members


# -- reading them ----------------------------------------------------------------------------


def wds_samples(path: Path, *, decode: bool = False) -> list[dict[str, Any]]:
    """The samples ``webdataset.WebDataset(str(path), shardshuffle=False)`` gives.

    With ``decode``, those of ``.decode()`` (no arguments: `autodecode.Decoder([])`, i.e.
    the gz pre-handler and ``basichandlers``). These are the stages WebDataset chains
    (`cache.StreamingOpen`, then `tariterators.tar_file_expander` and `group_by_keys`),
    run here on a file this function closes: WebDataset's opener leaves the file to the
    garbage collector, a ResourceWarning this suite's ``filterwarnings = error`` would
    fail on. `test_helper_reads_as_webdataset_does` checks that the two agree.
    """
    tariterators = webdataset.tariterators
    with path.open("rb") as stream:
        source = {"url": str(path), "stream": stream, "local_path": str(path)}
        samples = list(tariterators.group_by_keys(tariterators.tar_file_expander([source])))
    if decode:
        decoder = webdataset.autodecode.Decoder([])
        samples = [decoder(s) for s in samples]
    return samples


def ff_samples(path: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """The samples ``ferrofeed.TarShards(str(path))`` yields, iterated directly."""
    return list(ff.TarShards(str(path), **kwargs))


def normalize(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample's ``__key__`` and fields, without `WHERE_FROM` (see there)."""
    return {k: v for k, v in sample.items() if k not in WHERE_FROM}


def assert_same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], path: Path) -> None:
    """Ferrofeed's samples are webdataset's (normalized), each naming its shard."""
    assert [normalize(s) for s in ours] == [normalize(s) for s in theirs]
    assert all(s["__shard__"] == str(path) for s in ours)


def assert_refused(error: BaseException, *names: str) -> None:
    """``error`` is ferrofeed's own and its message names each of ``names``."""
    assert isinstance(error, ff.FerrofeedError), repr(error)
    for name in names:
        assert name in str(error), f"{name!r} not in {str(error)!r}"


def outcome(path: Path, **kwargs: Any) -> list[dict[str, Any]] | ff.FerrofeedError:
    """Ferrofeed's samples of ``path``, or the FerrofeedError it raised (when made or read)."""
    try:
        return ff_samples(path, **kwargs)
    except ff.FerrofeedError as e:
        return e


def types(value: Any) -> Any:
    """The nested types of a decoded value (``int`` vs ``float`` vs ``bool``, ...)."""
    if isinstance(value, dict):
        return (dict, [(k, types(v)) for k, v in value.items()])
    if isinstance(value, list):
        return (list, [types(v) for v in value])
    return type(value)


# -- baseline --------------------------------------------------------------------------------


def test_helper_reads_as_webdataset_does(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "base.tar", baseline_members())
    with warnings.catch_warnings():
        # WebDataset leaves the shard's file open for the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        plain = list(webdataset.WebDataset(str(path), shardshuffle=False))
        decoded = list(webdataset.WebDataset(str(path), shardshuffle=False).decode())
        gc.collect()
    assert plain == wds_samples(path)
    assert decoded == wds_samples(path, decode=True)


def test_baseline_shard_matches_webdataset(tmp_path: Path) -> None:
    members = baseline_members()
    path = write_tar(tmp_path / "base.tar", members)
    ours = ff_samples(path)
    theirs = wds_samples(path, decode=True)
    assert len(ours) == len(theirs) == 5
    # cls -> int, txt -> str, json -> the parsed object, jpg stays bytes: in both.
    assert_same(ours, theirs, path)
    for s in ours:
        assert types(s["cls"]) is int
        assert types(s["txt"]) is str
        assert isinstance(s["json"], dict)
        assert isinstance(s["jpg"], bytes)
        assert list(s) == ["__key__", "__shard__", "jpg", "cls", "json", "txt"]
    # The undecoded image is the member's bytes, as webdataset's undecoded sample has it.
    raw = dict(members)
    assert [s["jpg"] for s in ours] == [s["jpg"] for s in wds_samples(path)]
    assert [s["jpg"] for s in ours] == [raw[f"{s['__key__']}.jpg"] for s in ours]


# -- 1. members named like the sample's metadata ------------------------------------------


@pytest.mark.parametrize("first", [False, True], ids=["after", "first"])
def test_key_member_does_not_overwrite_the_key(tmp_path: Path, first: bool) -> None:
    """``a.__key__``: webdataset refuses it (group_by_keys: "duplicate file name").

    Its sample already has ``__key__``, so `group_by_keys` raises ValueError, decoded or
    not. Following webdataset, ferrofeed refuses it too, naming the member.
    """
    members = [("a.jpg", b"x"), ("a.__key__", b"evil")]
    if first:
        members.reverse()
    path = write_tar(tmp_path / "key.tar", [*members, ("b.jpg", b"y")])
    for decode in (False, True):
        with pytest.raises(ValueError, match="duplicate file name"):
            wds_samples(path, decode=decode)
    got = outcome(path)
    assert not isinstance(got, list), f"ferrofeed read {got!r}"
    assert_refused(got, "a.__key__")


def test_shard_member_does_not_overwrite_the_shard(tmp_path: Path) -> None:
    """``a.__shard__``: webdataset has no ``__shard__``, so it keeps the member as a field.

    Ferrofeed's samples carry ``__shard__`` (the shard's path), which the member must not
    overwrite (the issue); keeping the member under that name, as webdataset does, would
    overwrite it (what ferrofeed did), so ferrofeed has to refuse the member, naming it.
    """
    path = write_tar(tmp_path / "shard.tar", [("a.jpg", b"x"), ("a.__shard__", b"evil")])
    theirs = wds_samples(path)
    assert theirs[0]["__shard__"] == b"evil"
    assert wds_samples(path, decode=True)[0]["__shard__"] == "evil"  # "__*" fields: str
    got = outcome(path)
    assert not isinstance(got, list), f"ferrofeed read the member into the sample: {got!r}"
    assert_refused(got, "a.__shard__")


# -- 2. JSON decodes as json.loads --------------------------------------------------------


JSON_TEXTS = {
    "key-order": b'{"b": 1, "a": 2, "c": {"z": 0, "y": [1, 2], "x": {}}, "A": 3}',
    "floats": (
        b"[1.4000000000000001, 0.1, 0.30000000000000004, 5e-324, 1.7976931348623157e308,"
        b" 2.2250738585072014e-308, -0.0, 1e22, 123456789.123456789, 1.0, 1E2, 2.5e-3]"
    ),
    "non-finite": b'{"x": NaN, "y": Infinity, "z": -Infinity, "w": [NaN]}',
    "big-ints": (
        b"[9223372036854775807, -9223372036854775808, 9223372036854775808,"
        b" 18446744073709551615, 18446744073709551616, -9223372036854775809,"
        b" 123456789012345678901234567890, -99999999999999999999999]"
    ),
    "repeated-key": b'{"a": 1, "b": 0, "a": 2}',
    "scalars": b'[true, false, null, "s\\u00e9\\ud83d\\ude00", 0, -1, 1.5]',
}


def json_as_json_loads(path: Path, text: bytes, what: str) -> tuple[Any, Any]:
    """Check that webdataset and ferrofeed read the ``json`` field of ``path``'s one sample
    as ``json.loads(text)`` does; return the sample as ferrofeed and webdataset read it.

    Compared by repr (NaN is not equal to itself, and repr shows key order, 1 vs 1.0 and all
    digits) and, for ferrofeed, by `types` too. ``what`` names the JSON in the failure of a
    ferrofeed that refuses it.
    """
    expected = json.loads(text)
    (theirs,) = wds_samples(path, decode=True)
    assert repr(theirs["json"]) == repr(expected)
    got = outcome(path)
    assert isinstance(got, list), f"ferrofeed refused {what}: {got}"
    (ours,) = got
    assert repr(ours["json"]) == repr(expected)
    assert types(ours["json"]) == types(expected)
    return ours, theirs


@pytest.mark.parametrize("text", JSON_TEXTS.values(), ids=JSON_TEXTS.keys())
def test_json_decodes_as_json_loads(tmp_path: Path, text: bytes) -> None:
    path = write_tar(tmp_path / "json.tar", [("a.json", text), ("a.cls", b"1")])
    ours, _ = json_as_json_loads(path, text, "valid JSON (json.loads reads it)")
    expected = json.loads(text)
    if isinstance(expected, dict):
        assert list(ours["json"]) == list(expected)


def test_json_written_by_webdataset_reads_back(tmp_path: Path) -> None:
    """webdataset's TarWriter writes ``json.dumps`` (NaN/Infinity, all digits, big ints)."""
    value = {
        "z": 1.4000000000000001,
        "nan": float("nan"),
        "inf": float("inf"),
        "big": 2**70,
        "order": {"b": 1, "a": 2},
    }
    path = tmp_path / "written.tar"
    with path.open("wb") as f, webdataset.TarWriter(f) as sink:
        sink.write({"__key__": "a", "json": value, "cls": 7})
    with tarfile.open(path) as tar:
        text = tar.extractfile("a.json").read()  # type: ignore[union-attr]
    for written in (b"NaN", b"Infinity", b"1.4000000000000001", str(2**70).encode()):
        assert written in text
    ours, theirs = json_as_json_loads(path, text, "webdataset's own JSON")
    assert ours["cls"] == theirs["cls"] == 7


# -- 3. raw bytes for any field -------------------------------------------------------------


def test_decode_false_gives_every_field_as_its_bytes(tmp_path: Path) -> None:
    """``TarShards(path, decode=False)``: every field is the member's bytes, cls included.

    As webdataset's undecoded samples: ``__key__`` (and ``__shard__``) stay str. Fields that
    the default decoding would refuse (a cls that is no integer, JSON that is no JSON, text
    that is no UTF-8) read too.
    """
    members = [
        *baseline_members(3),
        ("odd/000.cls", b" 12\n"),
        ("odd/000.cls.txt", b"4"),
        ("odd/000.index", b"5"),
        ("odd/000.json", b'{"b": 1.4000000000000001, "a": NaN}'),
        ("odd/000.txt", "é".encode()),
        ("bad/000.cls", b"not an int"),
        ("bad/000.json", b"{not json"),
        ("bad/000.txt", b"\xff\xfe"),
    ]
    path = write_tar(tmp_path / "raw.tar", members)
    raw = dict(members)
    got = ff_samples(path, decode=False)
    assert_same(got, wds_samples(path), path)
    assert len(got) == 5
    for s in got:
        assert isinstance(s["__key__"], str)
        for field, value in normalize(s).items():
            if field != "__key__":
                assert type(value) is bytes, (s["__key__"], field, value)
                assert value == raw[f"{s['__key__']}.{field}"]


# -- 4. sparse members ------------------------------------------------------------------------


SPARSE_FORMATS = {
    "pax-1.0": ["--format=posix", "--sparse-version=1.0"],
    "pax-0.1": ["--format=posix", "--sparse-version=0.1"],
    "pax-0.0": ["--format=posix", "--sparse-version=0.0"],
    "gnu": ["--format=gnu"],
}


@pytest.mark.parametrize("flags", SPARSE_FORMATS.values(), ids=SPARSE_FORMATS.keys())
def test_sparse_members_read_or_refused(tmp_path: Path, flags: list[str]) -> None:
    """``tar --sparse``: the file's bytes (as webdataset reads them), or a refusal naming it.

    PAX sparse members (``--format=posix``) keep their map in pax records (0.0, 0.1) or at
    the start of the member's data (1.0, whose header name is ``GNUSparseFile.N/...``); a
    reader that ignores the records reads the wrong name or data, silently.
    """
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("no tar binary")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        with (src / f"{i:03d}.bin").open("wb") as f:
            f.write(b"head" * 100)
            f.seek(1 << 20)
            f.write(f"middle {i}".encode())
            f.seek(3 << 20)
            f.write(b"end")
        (src / f"{i:03d}.cls").write_bytes(str(i + 3).encode())
    names = ["000.bin", "000.cls", "001.bin", "001.cls"]
    path = tmp_path / "sparse.tar"
    subprocess.run(
        [tar, "--sparse", *flags, "-cf", str(path), "-C", str(src), *names],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with tarfile.open(path) as archive:
        if not any(m.issparse() for m in archive):
            pytest.skip("tar wrote no sparse member (the file system keeps no holes?)")
    theirs = wds_samples(path, decode=True)
    assert [s["bin"] for s in theirs] == [(src / n).read_bytes() for n in ("000.bin", "001.bin")]
    got = outcome(path)
    if isinstance(got, list):
        assert_same(got, theirs, path)
    else:
        assert_refused(got, "000.bin")


# -- 5. bzip2 and xz shards -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["bz2", "xz"])
def test_bz2_and_xz_shards_read_or_refused_by_name(tmp_path: Path, suffix: str) -> None:
    """Webdataset reads them (``tarfile.open(mode="r|*")``); ferrofeed refuses them with an
    error naming the shard and the compression (not calling them truncated), and reads the
    same samples once recompressed as gzip."""
    members = baseline_members()
    path = write_tar(tmp_path / f"shard.tar.{suffix}", members, mode=f"w:{suffix}")
    theirs = wds_samples(path, decode=True)
    assert len(theirs) == 5
    got = outcome(path)
    assert not isinstance(got, list)
    assert_refused(got, path.name, {"bz2": "bzip2", "xz": "xz"}[suffix] + "-compressed")
    assert "truncated" not in str(got)
    gz = write_tar(tmp_path / "shard.tar.gz", members, mode="w:gz")
    assert [normalize(s) for s in ff_samples(gz)] == [normalize(s) for s in theirs]


# -- 6. hidden and __MACOSX members ---------------------------------------------------------


def test_hidden_and_macosx_members_follow_the_documented_rule(tmp_path: Path) -> None:
    """ferrofeed passes over hidden names and ``__MACOSX/`` (TarShards' docstring); its
    samples are webdataset's without those that such names make.

    What webdataset does with them, checked first:

    `tar_file_iterator` skips a name matching ``skip_meta = r"__[^/]*__($|/)"`` (a
    top-level ``__name__`` entry or one under it: not ``__MACOSX/``), and `group_by_keys`
    one that ``base_plus_ext``'s ``^((?:.*/|)[^.]+)[.]([^/]*)$`` does not split (a
    top-level ``.DS_Store`` or ``._a.jpg``, a base name without a dot). A hidden name
    in a folder does split: ``dir/.hidden.jpg`` is key ``dir/``, field ``hidden.jpg``;
    ``__MACOSX/._a.jpg`` is key ``__MACOSX/``, field ``_a.jpg``.
    """
    members = [
        ("._000.jpg", b"appledouble 000"),
        ("000.jpg", b"j0"),
        ("000.cls", b"0"),
        (".DS_Store", b"ds top"),
        ("dir/000.jpg", b"dj0"),
        ("dir/000.cls", b"1"),
        ("dir/.DS_Store", b"ds dir"),
        ("dir/.hidden.jpg", b"hidden"),
        ("dir/001.jpg", b"dj1"),
        ("dir/001.cls", b"2"),
        ("dir/README", b"no dot"),
        ("__meta__/x.json", b"{}"),
        ("__index__", b"index"),
        ("__MACOSX/dir/._000.jpg", b"mac 000"),
        ("__MACOSX/dir/._001.jpg", b"mac 001"),
        ("__MACOSX/._a.jpg", b"mac a"),
        ("__MACOSX/.DS_Store", b"mac ds"),
    ]
    path = write_tar(tmp_path / "hidden.tar", members)
    theirs = wds_samples(path)
    assert [(s["__key__"], set(normalize(s)) - {"__key__"}) for s in theirs] == [
        ("000", {"cls", "jpg"}),
        ("dir/000", {"cls", "jpg"}),
        ("dir/", {"ds_store", "hidden.jpg"}),
        ("dir/001", {"cls", "jpg"}),
        ("__MACOSX/dir/", {"_000.jpg", "_001.jpg"}),
        ("__MACOSX/", {"_a.jpg", "ds_store"}),
    ]
    assert_same(ff_samples(path), meant(wds_samples(path, decode=True)), path)
    assert_same(ff_samples(path, decode=False), meant(theirs), path)


def meant(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """webdataset's samples without those made of hidden names or ``__MACOSX/`` members:
    keyed by a folder (``dir/``) or under ``__MACOSX/``."""
    return [
        s
        for s in samples
        if not s["__key__"].endswith("/") and not s["__key__"].startswith("__MACOSX/")
    ]


def test_a_macos_tar_with_resource_forks_reads_its_samples(tmp_path: Path) -> None:
    """macOS's tar writes ``dir/._NAME`` (AppleDouble) before each ``dir/NAME``: webdataset
    makes a ``dir/`` sample of each; ferrofeed passes them over, as if they were not
    there."""
    members = []
    for i in range(3):
        members += [
            (f"dir/._{i:03d}.jpg", b"\x00\x05\x16\x07appledouble"),
            (f"dir/{i:03d}.jpg", b"j%d" % i),
            (f"dir/._{i:03d}.cls", b"\x00\x05\x16\x07appledouble"),
            (f"dir/{i:03d}.cls", b"%d" % i),
        ]
    path = write_tar(tmp_path / "macos.tar", members)
    theirs = wds_samples(path)  # undecoded: webdataset's .decode() fails on "dir/" samples
    assert [s["__key__"] for s in theirs].count("dir/") == 6
    # The forks end webdataset's samples too (dir/000's jpg and cls come apart). ferrofeed
    # reads the tar as webdataset reads it without them.
    assert len(meant(theirs)) == 6
    clean = write_tar(tmp_path / "clean.tar", [m for m in members if "/._" not in m[0]])
    ours = ff_samples(path, decode=False)
    assert [normalize(s) for s in ours] == [normalize(s) for s in wds_samples(clean)]
    assert [(s["__key__"], s["cls"]) for s in ff_samples(path)] == [
        ("dir/000", 0),
        ("dir/001", 1),
        ("dir/002", 2),
    ]


# -- 7. no end-of-archive blocks ------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_tar_without_end_of_archive_blocks(tmp_path: Path, gz: bool) -> None:
    """The archive ends right after its last member's data (no zero blocks): webdataset
    (Python's tarfile) reads every sample; so must ferrofeed."""
    data = tar_bytes(baseline_members())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    assert end < len(data)
    assert not data[end:].strip(b"\0"), "only zero blocks are cut off"
    path = tmp_path / ("noeof.tar.gz" if gz else "noeof.tar")
    path.write_bytes(gzip.compress(data[:end]) if gz else data[:end])
    theirs = wds_samples(path, decode=True)
    assert len(theirs) == 5
    got = outcome(path)
    assert isinstance(got, list), f"ferrofeed refused a tar webdataset reads whole: {got}"
    assert_same(got, theirs, path)
