"""Sharded sources: TarShards, ParquetShards and JsonLines, alone and in the DataLoader.

The order rule itself (ranks, windows, resume, elastic resume) is tested exhaustively in
Rust (src/plan/sharded.rs); here, that the loader honours it end to end on real shard files,
on threads, worker processes and the native image chain, and that bad input gets a clear
error that names the shard and loses nothing else.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import os
import re
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ferrofeed as ff
import numpy as np
import pytest
from ferrofeed import _core, ops
from ferrofeed._shards import expand_shards

Member = tuple[str, bytes]


# -- writing shards ------------------------------------------------------------------------


def write_tar(path: Path, members: Sequence[Member], *, gz: bool = False) -> Path:
    """A tar file of ``members`` (name, content), in order; gzip-compressed with ``gz``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def labelled_members(ids: range, *, extra: bool = True) -> list[Member]:
    """WebDataset members of samples ``ids``: a payload, a class, and text and JSON."""
    members: list[Member] = []
    for i in ids:
        key = f"s{i:06d}"
        members.append((f"{key}.bin", i.to_bytes(4, "little")))
        members.append((f"{key}.cls", str(i).encode()))
        if extra:
            members.append((f"{key}.txt", f"sample {i}".encode()))
            members.append((f"{key}.json", json.dumps({"id": i, "even": i % 2 == 0}).encode()))
    return members


def tar_dataset(root: Path, sizes: Sequence[int], *, extra: bool = False) -> list[Path]:
    """Tar shards of ``sizes`` samples each; sample ``i`` (stored order) has ``cls == i``."""
    paths, start = [], 0
    for k, n in enumerate(sizes):
        members = labelled_members(range(start, start + n), extra=extra)
        paths.append(write_tar(root / f"train-{k:04d}.tar", members))
        start += n
    return paths


def ids_of(batch: Any) -> list[int]:
    """The ``cls`` of each sample of a batch of `default_collate`d tar samples."""
    return [int(c) for c in np.asarray(batch["cls"])]


def to_ids(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform that keeps what the tests compare (bytes do not collate)."""
    return {"cls": sample["cls"]}


def jpeg(rng: np.random.Generator, h: int = 40, w: int = 56) -> bytes:
    from PIL import Image

    base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    pixels = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))[:h, :w]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture
def tars(tmp_path: Path) -> list[Path]:
    return tar_dataset(tmp_path, [7, 12, 3, 9, 15, 1, 8])


# -- shard lists ----------------------------------------------------------------------------


def test_brace_ranges_lists_and_globs_name_shards_in_order(tmp_path: Path) -> None:
    for name in ["a-008.tar", "a-009.tar", "a-010.tar", "b-1.tar", "c.tar"]:
        (tmp_path / name).write_bytes(b"")
    t = str(tmp_path)
    assert expand_shards(f"{t}/a-{{008..010}}.tar") == [
        f"{t}/a-00{8}.tar",
        f"{t}/a-009.tar",
        f"{t}/a-010.tar",
    ]
    assert expand_shards(f"{t}/{{b-1,c}}.tar") == [f"{t}/b-1.tar", f"{t}/c.tar"]
    assert expand_shards(f"{t}/a-*.tar") == [f"{t}/a-008.tar", f"{t}/a-009.tar", f"{t}/a-010.tar"]
    assert expand_shards([Path(t) / "c.tar", f"{t}/b-?.tar"]) == [f"{t}/c.tar", f"{t}/b-1.tar"]
    with pytest.raises(FileNotFoundError, match=r"a-011\.tar"):
        expand_shards(f"{t}/a-{{010..011}}.tar")
    with pytest.raises(FileNotFoundError, match=r"z-\*"):
        expand_shards(f"{t}/z-*.tar")
    with pytest.raises(ValueError, match="backwards"):
        expand_shards(f"{t}/a-{{010..008}}.tar")
    # URLs are read from object storage (tests/test_remote.py); other schemes are refused,
    # and a source is all URLs or all local paths.
    with pytest.raises(ValueError, match=r"ftp://host/a\.tar: not a URL of object storage"):
        expand_shards("ftp://host/a.tar")
    with pytest.raises(ValueError, match="all URLs or all local paths"):
        expand_shards([f"{t}/c.tar", "s3://bucket/a.tar"])
    with pytest.raises(ValueError, match="no shards"):
        expand_shards([])


# -- TarShards ------------------------------------------------------------------------------


def test_tar_samples_in_the_webdataset_layout(tmp_path: Path) -> None:
    members = [*labelled_members(range(3)), ("dir/x.y.seg.png", b"\x89PNG...")]
    path = write_tar(tmp_path / "one.tar", members)
    shards = ff.TarShards(path)
    assert len(shards) == 4
    assert shards.shards == [(str(path), 4)]
    samples = list(shards)
    assert samples[1] == {
        "__key__": "s000001",
        "__shard__": str(path),
        "bin": (1).to_bytes(4, "little"),
        "cls": 1,
        "txt": "sample 1",
        "json": {"id": 1, "even": False},
    }
    assert samples[3]["__key__"] == "dir/x"
    assert samples[3]["y.seg.png"] == b"\x89PNG..."
    assert repr(shards) == "TarShards(1 shards, 4 samples)"


def test_gzipped_tars_give_the_same_samples(tmp_path: Path) -> None:
    members = labelled_members(range(5))
    plain = ff.TarShards(write_tar(tmp_path / "a.tar", members))
    packed = ff.TarShards(write_tar(tmp_path / "a.tar.gz", members, gz=True))
    strip = lambda s: {k: v for k, v in s.items() if k != "__shard__"}  # noqa: E731
    assert [strip(s) for s in plain] == [strip(s) for s in packed]


def test_a_sample_split_across_two_shards_is_refused(tmp_path: Path) -> None:
    a = write_tar(tmp_path / "a.tar", labelled_members(range(3)))
    b = write_tar(tmp_path / "b.tar", [("s000002.png", b"x"), *labelled_members(range(3, 5))])
    with pytest.raises(ff.ShardCorruptError, match=r"s000002 is split across shards") as e:
        ff.TarShards([a, b])
    assert e.value.shard == str(b)
    assert str(a) in str(e.value)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_tar_is_refused_without_skip_and_read_up_to_the_damage_with_it(
    tmp_path: Path, gz: bool, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    first = write_tar(tmp_path / "a.tar", labelled_members(range(20)))
    cut = write_tar(
        tmp_path / ("b.tar.gz" if gz else "b.tar"), labelled_members(range(20, 40)), gz=gz
    )
    last = write_tar(tmp_path / "c.tar", labelled_members(range(40, 60)))
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 100])
    src = ff.TarShards([first, cut, last])  # made: the damage is counted, not raised
    [damage] = src.damaged
    assert isinstance(damage, ff.ShardCorruptError)
    assert damage.shard == str(cut)
    assert str(cut) in str(damage)
    assert damage.at is not None
    assert "truncated" in str(damage)
    before = src.shards[1][1]  # the samples complete before the damage
    assert 0 < before < 20
    assert len(src) == 40 + before

    # Without skip: the loader refuses the source, naming the shard and where.
    with pytest.raises(ff.ShardCorruptError) as e:
        ff.DataLoader(src, 4)
    assert e.value.shard == str(cut)
    assert e.value.at == damage.at
    # On its own, the source yields what comes before the damage, then raises it.
    got: list[int] = []
    samples = iter(src)
    with pytest.raises(ff.ShardCorruptError, match=re.escape(str(cut))):
        got.extend(int(sample["cls"]) for sample in samples)
    assert got == list(range(20 + before))

    # Under skip: every other shard, and the damaged one's samples before the damage.
    with caplog.at_level(logging.WARNING, logger="ferrofeed.loader"):
        dl = ff.DataLoader(
            src,
            4,
            on_error="skip",
            shuffle=True,
            num_workers=workers,
            transform=to_ids,
            collate=list,
        )
    warned = [r for r in caplog.records if str(cut) in r.getMessage()]
    assert len(warned) == 1
    for _ in range(2):  # logged once, not per epoch
        ids = sorted(int(s["cls"]) for batch in dl for s in batch)
        assert ids == [*range(20 + before), *range(40, 60)]
    assert dl.stats()["skipped_shards"] == [(str(cut), str(damage))]
    assert len([r for r in caplog.records if str(cut) in r.getMessage()]) == 1


def test_a_missing_file_and_a_non_tar_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive at all" * 40)
    with pytest.raises(ff.ShardError, match=r"bad\.tar"):
        ff.TarShards(bad)


def test_shards_pickle_without_counting_again(tars: list[Path]) -> None:
    import pickle

    shards = ff.TarShards(tars)
    again = pickle.loads(pickle.dumps(shards))
    assert again.shards == shards.shards
    assert list(again)[5]["cls"] == 5


# -- the DataLoader over shards --------------------------------------------------------------


def loader(tars: Sequence[Path], batch_size: int = 4, **kw: Any) -> ff.DataLoader:
    kw.setdefault("transform", to_ids)
    return ff.DataLoader(ff.TarShards(tars), batch_size, **kw)


def epoch_ids(dl: ff.DataLoader) -> list[list[int]]:
    return [ids_of(b) for b in dl]


def test_every_sample_once_per_epoch_and_the_order_changes_by_epoch(tars: list[Path]) -> None:
    dl = loader(tars, shuffle=True, seed=3, shuffle_window=16)
    e0, e1 = epoch_ids(dl), epoch_ids(dl)
    for e in (e0, e1):
        assert sorted(i for b in e for i in b) == list(range(55))
        assert all(len(b) == 4 for b in e[:-1])
    assert e0 != e1
    assert len(dl) == len(e0) == 14


def test_without_shuffle_the_order_is_stored_order(tars: list[Path]) -> None:
    flat = [i for b in epoch_ids(loader(tars)) for i in b]
    assert flat == list(range(55))


def test_a_batch_mixes_several_shards(tmp_path: Path) -> None:
    paths = tar_dataset(tmp_path, [16] * 8)
    starts = [0, 16, 32, 48, 64, 80, 96, 112, 128]
    shard_of = lambda i: max(k for k, s in enumerate(starts) if s <= i)  # noqa: E731
    batches = epoch_ids(loader(paths, 16, shuffle=True, seed=1, shuffle_window=64))
    mixed = [len({shard_of(i) for i in b}) for b in batches]
    assert min(mixed) >= 2, mixed
    assert max(mixed) >= 3, mixed


def test_a_windows_shards_are_read_side_by_side_each_keeping_its_samples_and_errors(
    tmp_path: Path,
) -> None:
    # One window of 12 shards (read on threads of their own): the samples come back in
    # the plan's order, and a shard gone since counting fails its own samples alone.
    paths = tar_dataset(tmp_path, [5] * 12)
    source = ff.TarShards(paths)
    paths[7].unlink()
    dl = ff.DataLoader(
        source, 6, shuffle_window=60, on_error="skip", transform=to_ids, max_failures=None
    )
    expected = [[i for i in range(k, k + 6) if not 35 <= i < 40] for k in range(0, 60, 6)]
    assert epoch_ids(dl) == expected
    assert sorted(i for i, _ in dl.stats()["skipped"]) == list(range(35, 40))


@pytest.mark.parametrize(
    "kw",
    [
        {"num_threads": 1},
        {"num_threads": 3},
        {"num_workers": 2},
        {"num_workers": 3, "worker_start_method": "spawn"},
        {"num_workers": 1, "worker_start_method": "forkserver"},
    ],
)
def test_the_order_does_not_depend_on_threads_or_workers(
    tars: list[Path], kw: dict[str, Any]
) -> None:
    reference = epoch_ids(loader(tars, shuffle=True, seed=5, shuffle_window=8, num_threads=2))
    assert epoch_ids(loader(tars, shuffle=True, seed=5, shuffle_window=8, **kw)) == reference


@pytest.mark.parametrize(
    "kw", [{"num_threads": 2}, {"num_workers": 2, "worker_start_method": "spawn"}]
)
def test_a_large_shard_read_by_small_windows_from_its_marks_gives_what_gzip_gives(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    # Windows of 24 start inside shards of 300 and 450 samples: the plain shards' reads
    # start at their marks (where every 128th sample starts: found by counting, or in a
    # spawned worker by its first reads), the gzip ones' from the start. Same batches.
    members = labelled_members(range(750), extra=True)
    plain = [
        write_tar(tmp_path / "a.tar", members[: 4 * 300]),
        write_tar(tmp_path / "b.tar", members[4 * 300 :]),
    ]
    gz = [
        write_tar(tmp_path / "a.tar.gz", members[: 4 * 300], gz=True),
        write_tar(tmp_path / "b.tar.gz", members[4 * 300 :], gz=True),
    ]
    opts = {"shuffle": True, "seed": 2, "shuffle_window": 24, **kw}
    for epoch in range(2):
        got = [loader(p, 8, **opts) for p in (plain, gz)]
        for dl in got:
            dl.set_epoch(epoch)
        from_marks, from_start = (epoch_ids(dl) for dl in got)
        assert from_marks == from_start
        assert sorted(i for b in from_marks for i in b) == list(range(750))


@pytest.mark.parametrize("world", [2, 3, 5, 9])
def test_ranks_read_every_sample_once_in_lockstep(tars: list[Path], world: int) -> None:
    # 7 shards of uneven sizes: fewer shards than ranks x workers for world >= 4.
    per_rank = [
        epoch_ids(loader(tars, 3, shuffle=True, seed=2, rank=r, world_size=world, shuffle_window=6))
        for r in range(world)
    ]
    assert len({len(r) for r in per_rank}) == 1, [len(r) for r in per_rank]
    assert sorted(i for r in per_rank for b in r for i in b) == list(range(55))


def test_drop_last_gives_every_rank_full_batches(tars: list[Path]) -> None:
    per_rank = [
        epoch_ids(loader(tars, 4, shuffle=True, rank=r, world_size=3, drop_last=True))
        for r in range(3)
    ]
    assert {len(r) for r in per_rank} == {(55 // 3) // 4}
    assert all(len(b) == 4 for r in per_rank for b in r)
    seen = [i for r in per_rank for b in r for i in b]
    assert len(seen) == len(set(seen))


def test_batches_of_one_over_uneven_ranks_are_refused_with_the_way_out(tars: list[Path]) -> None:
    with pytest.raises(ValueError, match="drop_last=True"):
        loader(tars, 1, rank=0, world_size=2)
    assert len(loader(tars, 1, rank=0, world_size=2, drop_last=True)) == 55 // 2


def test_resume_mid_epoch_is_exact(tars: list[Path]) -> None:
    full = epoch_ids(loader(tars, shuffle=True, seed=4, shuffle_window=8))
    dl = loader(tars, shuffle=True, seed=4, shuffle_window=8)
    it = iter(dl)
    head = [ids_of(next(it)) for _ in range(5)]
    state = dl.state_dict()
    del it
    resumed = loader(tars, shuffle=True, seed=4, shuffle_window=8, num_workers=2)
    resumed.load_state_dict(state)
    assert head + epoch_ids(resumed) == full
    assert epoch_ids(resumed) != full  # the next epoch


def test_resume_in_a_new_process(tars: list[Path], run_python: Callable[..., Any]) -> None:
    dl = loader(tars, shuffle=True, seed=9, shuffle_window=8)
    full = epoch_ids(loader(tars, shuffle=True, seed=9, shuffle_window=8))
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    code = f"""
import json, sys
import numpy as np
import ferrofeed as ff
dl = ff.DataLoader(ff.TarShards({[str(p) for p in tars]!r}), 4, shuffle=True, seed=9,
                   shuffle_window=8, transform=lambda s: {{"cls": s["cls"]}})
dl.load_state_dict(json.loads(sys.argv[1]))
print(json.dumps([[int(c) for c in np.asarray(b["cls"])] for b in dl]))
"""
    out = run_python(code, args=[json.dumps(state)])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == full[3:]


@pytest.mark.parametrize(("w1", "w2"), [(2, 3), (3, 1), (1, 4)])
def test_an_elastic_resume_reads_every_remaining_sample_once(
    tars: list[Path], w1: int, w2: int
) -> None:
    kw: dict[str, Any] = {"shuffle": True, "seed": 6, "shuffle_window": 6}
    before: list[int] = []
    states = []
    for r in range(w1):
        dl = loader(tars, 3, rank=r, world_size=w1, **kw)
        it = iter(dl)
        before += [i for _ in range(4) for i in ids_of(next(it))]
        states.append(dl.state_dict())
    # Ranks step in lockstep: rank 0's state is the job's position.
    assert all(s["batches_done"] == 4 for s in states)
    after: list[list[list[int]]] = []
    for r in range(w2):
        dl = loader(tars, 3, rank=r, world_size=w2, num_workers=1 if r == 0 else 0, **kw)
        dl.load_state_dict(states[0])
        n = len(dl)  # this world's part of the epoch
        after.append(epoch_ids(dl))
        assert n == len(after[-1])
    assert len({len(a) for a in after}) == 1
    seen = before + [i for a in after for b in a for i in b]
    assert sorted(seen) == list(range(55))
    # The next epoch is whole again, on the new world.
    nxt = loader(tars, 3, rank=0, world_size=w2, **kw)
    nxt.load_state_dict(states[0])
    for _ in nxt:
        pass
    assert nxt.state_dict()["history"] == []
    assert nxt.epoch == 1


def test_a_state_that_does_not_fit_is_refused(tars: list[Path]) -> None:
    dl = loader(tars, shuffle=True)
    state = dl.state_dict()
    other = loader(tars[:-1], shuffle=True)
    with pytest.raises(ValueError, match=r"shard_counts|dataset_len"):
        other.load_state_dict(state)
    bad = dict(state, history=[[2, 999]])
    with pytest.raises(ValueError, match="does not fit"):
        dl.load_state_dict(bad)
    assert dl.state_dict() == state


def test_sharded_only_options_are_refused_elsewhere(tars: list[Path]) -> None:
    with pytest.raises(TypeError, match=r"shuffle_window= is for sharded sources"):
        ff.DataLoader(list(range(4)), 2, shuffle_window=8)
    with pytest.raises(TypeError, match="batches_per_epoch"):
        ff.DataLoader(ff.TarShards(tars), 2, batches_per_epoch=3)
    with pytest.raises(TypeError, match="image= names the field"):
        ff.DataLoader(ff.TarShards(tars), 2, image="jpg")


# -- errors inside shards, in the loader --------------------------------------------------------


def test_a_failing_transform_names_the_sample_and_skip_accounts_for_it(tars: list[Path]) -> None:
    def fussy(s: dict[str, Any]) -> dict[str, Any]:
        if s["cls"] in (5, 17):
            raise RuntimeError(f"no {s['cls']}")
        return to_ids(s)

    with pytest.raises(RuntimeError, match="no 5"):
        epoch_ids(loader(tars, transform=fussy))
    dl = loader(tars, transform=fussy, on_error="skip", num_workers=2)
    seen = [i for b in epoch_ids(dl) for i in b]
    assert sorted(seen) == [i for i in range(55) if i not in (5, 17)]
    assert sorted(i for i, _ in dl.stats()["skipped"]) == [5, 17]


# -- the native image chain ------------------------------------------------------------------


@pytest.fixture
def image_tars(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    paths, start = [], 0
    for k, n in enumerate([6, 9, 5]):
        members: list[Member] = []
        for i in range(start, start + n):
            members += [(f"k{i:05d}.jpg", jpeg(rng)), (f"k{i:05d}.cls", str(i).encode())]
        paths.append(write_tar(tmp_path / f"img-{k}.tar", members))
        start += n
    return paths


SPEC: dict[str, Any] = {"size": 32, "crop": "random", "flip": "random"}


def test_native_batches_equal_a_python_transform_of_the_same_bytes(image_tars: list[Path]) -> None:
    native = ff.DataLoader(
        ff.TarShards(image_tars),
        4,
        shuffle=True,
        seed=8,
        shuffle_window=8,
        transform=ops.decode_image(**SPEC),
        image="jpg",
        label="cls",
        num_threads=2,
    )

    def python(sample: dict[str, Any]) -> tuple[Any, int]:
        # Without seed=, inside a loader: the sample's own draws, as the native chain's.
        return ff.io.decode_image(sample["jpg"], **SPEC), sample["cls"]

    reference = ff.DataLoader(
        ff.TarShards(image_tars), 4, shuffle=True, seed=8, shuffle_window=8, transform=python
    )
    got = [(np.asarray(x), np.asarray(y)) for x, y in native]
    want = [(np.asarray(x), np.asarray(y)) for x, y in reference]
    assert len(got) == len(want) == 5
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.shape == (len(gy), 32, 32, 3)
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gx, wx)
    assert sorted(int(i) for _, y in got for i in y) == list(range(20))


@pytest.mark.parametrize("workers", [0, 2])
def test_native_images_left_in_a_large_shard_decode_as_read_ones(
    tmp_path: Path, workers: int
) -> None:
    # Windows of 96 over one shard of 200: pieces of 64 samples or more leave the image
    # members in the file (the decode threads read them); sample 150's is corrupt.
    rng = np.random.default_rng(3)
    members: list[Member] = []
    for i in range(200):
        image = b"\xff\xd8\xff garbage" if i == 150 else jpeg(rng)
        members += [(f"k{i:05d}.jpg", image), (f"k{i:05d}.cls", str(i).encode())]
    big = [write_tar(tmp_path / "big.tar", members)]
    kw: dict[str, Any] = {"shuffle": True, "seed": 4, "shuffle_window": 96, "on_error": "skip"}
    native = ff.DataLoader(
        ff.TarShards(big),
        8,
        transform=ops.decode_image(**SPEC),
        image="jpg",
        label="cls",
        num_threads=2,
        num_workers=workers,
        **kw,
    )

    def python(sample: dict[str, Any]) -> tuple[Any, int]:
        return ff.io.decode_image(sample["jpg"], **SPEC), sample["cls"]

    reference = ff.DataLoader(ff.TarShards(big), 8, transform=python, **kw)
    got = [(np.asarray(x), np.asarray(y)) for x, y in native]
    want = [(np.asarray(x), np.asarray(y)) for x, y in reference]
    assert len(got) == len(want) == 25
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gx, wx)
    assert sorted(int(i) for _, y in got for i in y) == [i for i in range(200) if i != 150]
    ((index, reason),) = native.stats()["skipped"]
    assert index == 150
    assert "big.tar: member k00150.jpg" in reason, reason
    strict = ff.DataLoader(
        ff.TarShards(big), 8, transform=ops.decode_image(size=16), image="jpg", label="cls"
    )
    with pytest.raises(ff.ImageDecodeError, match=r"big\.tar: member k00150\.jpg"):
        list(strict)


def test_native_missing_field_names_shard_and_sample(
    tmp_path: Path, image_tars: list[Path]
) -> None:
    rng = np.random.default_rng(1)
    odd = write_tar(
        tmp_path / "odd.tar",
        [("k00020.png", jpeg(rng)), ("k00020.cls", b"20"), ("k00021.jpg", jpeg(rng))],
    )
    kw: dict[str, Any] = {"transform": ops.decode_image(size=16), "image": "jpg", "label": "cls"}
    with pytest.raises(
        ff.ShardFieldError, match=r"odd\.tar: sample k00020: no image field \"jpg\""
    ) as e:
        list(ff.DataLoader(ff.TarShards([*image_tars, odd]), 4, **kw))
    assert "png" in str(e.value)
    assert e.value.shard == str(odd)
    dl = ff.DataLoader(ff.TarShards([*image_tars, odd]), 4, on_error="skip", **kw)
    labels = sorted(int(i) for _, y in dl for i in np.asarray(y))
    assert labels == list(range(20))
    reasons = dict(dl.stats()["skipped"])
    assert set(reasons) == {20, 21}
    assert "no image field" in reasons[20]
    assert "no label field" in reasons[21]
    # Alternatives: the first field a sample has.
    alt = ff.DataLoader(
        ff.TarShards([*image_tars, odd]),
        4,
        on_error="skip",
        transform=ops.decode_image(size=16),
        image="jpg;png",
        label="cls",
    )
    assert sorted(int(i) for _, y in alt for i in np.asarray(y)) == list(range(21))


def test_a_corrupt_image_in_a_shard_names_the_member(
    tmp_path: Path, image_tars: list[Path]
) -> None:
    bad = write_tar(
        tmp_path / "bad.tar", [("k00020.jpg", b"\xff\xd8\xff garbage"), ("k00020.cls", b"20")]
    )
    kw: dict[str, Any] = {"transform": ops.decode_image(size=16), "image": "jpg", "label": "cls"}
    with pytest.raises(ff.ImageDecodeError, match=r"bad\.tar: member k00020\.jpg"):
        list(ff.DataLoader(ff.TarShards([*image_tars, bad]), 4, **kw))
    dl = ff.DataLoader(ff.TarShards([*image_tars, bad]), 4, on_error="skip", **kw)
    assert sum(len(np.asarray(y)) for _, y in dl) == 20
    assert [i for i, _ in dl.stats()["skipped"]] == [20]


# -- JsonLines ---------------------------------------------------------------------------------


def test_json_lines_plain_gzip_and_zstd(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "tokens": list(range(i % 5))}) for i in range(30)]
    text = "\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:20]) + "\n"
    (tmp_path / "a.jsonl").write_text(text)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress("\n".join(lines[20:25]).encode()))
    zstd = pytest.importorskip("zstandard")
    (tmp_path / "c.jsonl.zst").write_bytes(
        zstd.ZstdCompressor().compress("\n".join(lines[25:]).encode())
    )
    corpus = ff.JsonLines(sorted(str(p) for p in tmp_path.iterdir()))
    assert len(corpus) == 30
    assert [n for _, n in corpus.shards] == [20, 5, 5]
    assert [s["id"] for s in corpus] == list(range(30))
    dl = ff.DataLoader(corpus, 6, shuffle=True, transform=lambda s: s["id"])
    assert sorted(int(i) for b in dl for i in b) == list(range(30))


def test_a_malformed_json_line_names_its_line_and_skip_loses_only_it(tmp_path: Path) -> None:
    good = [json.dumps({"id": i}) for i in range(8)]
    (tmp_path / "part.jsonl").write_text("\n".join([*good[:3], "{oops", *good[3:]]) + "\n")
    corpus = ff.JsonLines(tmp_path / "part.jsonl")
    assert len(corpus) == 9
    with pytest.raises(ff.ShardCorruptError, match=r"part\.jsonl: line 4") as e:
        list(ff.DataLoader(corpus, 3, transform=lambda s: s["id"]))
    assert e.value.at == "line 4"
    dl = ff.DataLoader(corpus, 3, transform=lambda s: s["id"], on_error="skip")
    assert sorted(int(i) for b in dl for i in b) == list(range(8))
    assert [i for i, _ in dl.stats()["skipped"]] == [3]


# -- ParquetShards -------------------------------------------------------------------------------


def write_parquet(path: Path, rows: dict[str, list[Any]], *, row_group_size: int = 5) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(rows), path, row_group_size=row_group_size)
    return path


def test_parquet_rows_columns_and_hugging_face_images(tmp_path: Path) -> None:
    for k in range(3):
        ids = list(range(k * 12, k * 12 + 12))
        write_parquet(
            tmp_path / f"part-{k}.parquet",
            {
                "image": [{"bytes": f"img{i}".encode(), "path": f"{i}.jpg"} for i in ids],
                "label": ids,
                "caption": [f"caption {i}" for i in ids],
            },
        )
    rows = ff.ParquetShards(str(tmp_path / "part-*.parquet"), columns=["label", "image"])
    assert len(rows) == 36
    first = next(iter(rows))
    assert first == {"label": 0, "image": b"img0"}
    dl = ff.DataLoader(
        rows, 5, shuffle=True, seed=1, shuffle_window=10, transform=lambda r: r["label"]
    )
    assert sorted(int(i) for b in dl for i in b) == list(range(36))
    with pytest.raises(ff.ShardCorruptError, match="nope"):
        ff.ParquetShards(str(tmp_path / "part-0.parquet"), columns=["nope"])


def test_parquet_native_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    blobs = [jpeg(rng) for _ in range(10)]
    write_parquet(
        tmp_path / "img.parquet",
        {"image": [{"bytes": b, "path": None} for b in blobs], "label": list(range(10))},
        row_group_size=4,
    )
    dl = ff.DataLoader(
        ff.ParquetShards(tmp_path / "img.parquet"),
        4,
        transform=ops.decode_image(size=24),
        image="image",
        label="label",
    )
    batches = [(np.asarray(x), np.asarray(y)) for x, y in dl]
    assert [y.tolist() for _, y in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for x, y in batches:
        for img, i in zip(x, y, strict=True):
            np.testing.assert_array_equal(img, ff.io.decode_image(blobs[i], size=24).numpy())


def test_a_corrupt_parquet_footer_is_refused_and_a_corrupt_page_loses_only_its_rest(
    tmp_path: Path,
) -> None:
    path = write_parquet(tmp_path / "t.parquet", {"x": list(range(40))}, row_group_size=10)
    data = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[:-20])
    with pytest.raises(ff.ShardCorruptError, match=r"cut\.parquet: footer"):
        ff.ParquetShards(tmp_path / "cut.parquet")
    # Garbage over the pages of the second row group (found through the footer).
    pq = pytest.importorskip("pyarrow.parquet")
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    spoiled = bytearray(data)
    spoiled[start : start + col.total_compressed_size] = b"\xa5" * col.total_compressed_size
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(spoiled))
    good = write_parquet(tmp_path / "u.parquet", {"x": list(range(40, 50))})
    rows = ff.ParquetShards([bad, good])
    with pytest.raises(ff.ShardCorruptError, match=r"bad\.parquet: row group 1"):
        list(ff.DataLoader(rows, 10, transform=lambda r: r["x"]))
    dl = ff.DataLoader(rows, 10, transform=lambda r: r["x"], on_error="skip", max_failures=None)
    got = sorted(int(i) for b in dl for i in b)
    # The first row group, and the other file, arrive; the rest of the bad file does not.
    assert got == list(range(10)) + list(range(40, 50))
    assert dl.stats()["skipped_count"] == 30


def test_max_failures_applies_to_a_lost_rest_of_shard(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", {"x": list(range(40))}, row_group_size=10)
    data = bytearray(path.read_bytes())
    pq = pytest.importorskip("pyarrow.parquet")
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    data[start : start + col.total_compressed_size] = b"\x00" * col.total_compressed_size
    path.write_bytes(bytes(data))
    dl = ff.DataLoader(ff.ParquetShards(path), 10, transform=lambda r: r["x"], on_error="skip")
    with pytest.raises(ff.TooManyFailuresError):
        list(dl)


# -- bucket_by -------------------------------------------------------------------------------


@pytest.fixture
def token_lines(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(3)
    paths, i = [], 0
    for k in range(4):
        lines = []
        for _ in range(12):
            lines.append(json.dumps({"id": i, "tokens": [0] * int(rng.integers(1, 60))}))
            i += 1
        path = tmp_path / f"part-{k}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def bucketed(paths: list[Path], **kw: Any) -> ff.DataLoader:
    return ff.DataLoader(
        ff.JsonLines(paths),
        4,
        shuffle=True,
        seed=2,
        shuffle_window=16,
        bucket_by=lambda s: len(s["tokens"]),
        transform=lambda s: (s["id"], len(s["tokens"])),
        collate=list,
        **kw,
    )


def test_bucket_by_sorts_each_window_into_batches_then_shuffles_them(
    token_lines: list[Path],
) -> None:
    dl = bucketed(token_lines)
    batches = list(dl)
    assert sorted(i for b in batches for i, _ in b) == list(range(48))
    # 16-sample windows of 4 batches: within a window, batches hold disjoint length ranges.
    for w in range(0, len(batches), 4):
        spans = sorted((min(n for _, n in b), max(n for _, n in b)) for b in batches[w : w + 4])
        for (_, hi), (lo, _) in itertools.pairwise(spans):
            assert hi <= lo, spans
    # Not sorted across the window's batches (they are shuffled), but reproducible.
    assert [b for b in bucketed(token_lines)] == batches
    plain = ff.DataLoader(
        ff.JsonLines(token_lines),
        4,
        shuffle=True,
        seed=2,
        shuffle_window=16,
        transform=lambda s: (s["id"], len(s["tokens"])),
        collate=list,
    )
    assert list(plain) != batches


def test_bucket_by_resumes_exactly_and_refuses_another_world(token_lines: list[Path]) -> None:
    full = list(bucketed(token_lines))
    dl = bucketed(token_lines)
    it = iter(dl)
    head = [next(it) for _ in range(6)]  # mid-window
    state = dl.state_dict()
    resumed = bucketed(token_lines)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    wider = bucketed(token_lines, rank=0, world_size=2)
    with pytest.raises(ValueError, match="bucket_by"):
        wider.load_state_dict(state)
    with pytest.raises(TypeError, match=r"bucket_by= is for sharded sources"):
        ff.DataLoader(list(range(4)), 2, bucket_by=len)


# -- memory ------------------------------------------------------------------------------------


def test_memory_stays_bounded_by_the_window_over_many_shards(
    tmp_path: Path, run_python: Callable[..., Any]
) -> None:
    # 48 shards of 64 samples of 40 KB (about 120 MB): an epoch holds about two windows
    # of 128 samples (10 MB) and the batches in flight, never the shards it has read.
    payload = os.urandom(40_000)
    for k in range(48):
        members: list[Member] = []
        for i in range(k * 64, k * 64 + 64):
            members += [(f"s{i:06d}.bin", payload), (f"s{i:06d}.cls", str(i).encode())]
        write_tar(tmp_path / f"big-{k:03d}.tar", members)
    code = f"""
import json, os, sys
import ferrofeed as ff

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

shards = ff.TarShards(os.path.join({str(tmp_path)!r}, "big-*.tar"))
dl = ff.DataLoader(shards, 16, shuffle=True, shuffle_window=128, num_threads=2,
                   transform=lambda s: (s["cls"], len(s["bin"])), collate=list)
seen, start, peak = 0, None, 0
for n, batch in enumerate(dl):
    seen += len(batch)
    if n == 20:
        start = rss()
    elif n > 20:
        peak = max(peak, rss())
print(json.dumps({{"seen": seen, "start": start, "peak": peak}}))
"""
    out = run_python(code, env={"MALLOC_ARENA_MAX": "2"}, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["seen"] == 48 * 64
    growth = report["peak"] - report["start"]
    # The data is 120 MB; a loader that kept what it read would grow by most of it.
    assert growth < 30_000_000, report


def test_empty_shards_are_passed_over(tmp_path: Path) -> None:
    a = write_tar(tmp_path / "a.tar", labelled_members(range(0, 3)))
    empty = write_tar(tmp_path / "b.tar", [])
    c = write_tar(tmp_path / "c.tar", labelled_members(range(3, 7)))
    shards = ff.TarShards([a, empty, c, empty])
    assert [n for _, n in shards.shards] == [3, 0, 4, 0]
    cases: list[tuple[dict[str, Any], list[int]]] = [
        ({}, list(range(7))),
        ({"shuffle": True, "seed": 1}, list(range(7))),
        ({"rank": 1, "world_size": 2}, [4, 5, 6]),  # 4 samples for rank 0, 3 for rank 1
    ]
    for kw, want in cases:
        dl = ff.DataLoader(shards, 2, transform=to_ids, shuffle_window=2, **kw)
        assert sorted(i for b in dl for i in ids_of(b)) == want
    assert list(ff.DataLoader(ff.TarShards(empty), 2, transform=to_ids)) == []


@pytest.mark.parametrize("cls", [ff.TarShards, ff.JsonLines, ff.ParquetShards])
def test_a_named_pipe_as_a_shard_is_refused_at_once(tmp_path: Path, cls: type) -> None:
    fifo = tmp_path / "pipe.tar"
    os.mkfifo(fifo)
    with pytest.raises(ff.ShardReadError, match=r"pipe\.tar: .*named pipe") as e:
        cls(fifo)
    assert isinstance(e.value, OSError)
    with pytest.raises(ff.ShardReadError, match="Is a directory"):
        cls(tmp_path)


def test_the_next_epochs_first_window_is_read_ahead(tars: list[Path]) -> None:
    dl = loader(tars, shuffle=True, seed=7, shuffle_window=8)
    source = dl.dataset
    assert isinstance(source, ff.ShardedSource)
    reader = dl._source  # the loader's side of the source: its plans and its read-ahead
    feed = reader._feed  # the core's feed of its windows
    e0 = epoch_ids(dl)
    plan1 = reader.plan(1)
    assert isinstance(plan1, _core.ShardPlan)
    # Epoch 1's first window was asked for before epoch 1 began: every window of epoch 0
    # was read, then epoch 1's first.
    assert feed.ahead == plan1.window_pieces(0)
    assert feed.reads == reader.plan(0).windows + 1
    e1 = epoch_ids(dl)
    assert feed.reads == reader.plan(0).windows + plan1.windows + 1  # not read twice
    # Epoch 2's first, read ahead at the end of epoch 1.
    assert feed.ahead == reader.plan(2).window_pieces(0)
    fresh = loader(tars, shuffle=True, seed=7, shuffle_window=8)
    assert epoch_ids(fresh) == e0
    assert epoch_ids(fresh) == e1
