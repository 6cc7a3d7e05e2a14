"""`ferrofeed.Mix`: several sources at set proportions, as one source of a `DataLoader`.

What issue 33 asks of a mixture: the proportions (over the epoch and over every window),
the three ways an epoch ends, each source in its own order, the same batches on 1 or N
threads and in worker processes, another order each epoch, exact and elastic resume with
a small state, the native image chain with field alternatives, the figures per source,
and bad input refused with the problem named.
"""

from __future__ import annotations

import gc
import io
import json
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ferrofeed as ff
import numpy as np
import pytest
from ferrofeed import _core, ops

# -- data ----------------------------------------------------------------------------------


def write_tar(path: Path, samples: Sequence[dict[str, bytes]]) -> Path:
    """A WebDataset tar of ``samples`` (each a dict of extension -> bytes), in order."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, sample in enumerate(samples):
            for ext, data in sample.items():
                info = tarfile.TarInfo(f"{path.stem}-{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def id_shards(root: Path, ids: range, per_shard: int) -> ff.TarShards:
    """Tar shards whose sample ``i`` has ``cls == i`` (the ids tell which sample it is)."""
    paths = []
    for k, lo in enumerate(range(ids.start, ids.stop, per_shard)):
        hi = min(lo + per_shard, ids.stop)
        paths.append(
            write_tar(root / f"ids-{k:03d}.tar", [{"cls": str(i).encode()} for i in range(lo, hi)])
        )
    return ff.TarShards([str(p) for p in paths])


def value(sample: Any) -> int:
    """A sample's own id: the tar samples' ``cls``, the lists' values themselves."""
    return int(sample["cls"]) if isinstance(sample, dict) else int(sample)


def ids(loader: ff.DataLoader, epoch: int | None = None) -> list[list[int]]:
    """The ids of each batch of the loader (the next epoch, or ``epoch``'s)."""
    batches = loader if epoch is None else loader.epoch_batches(epoch)
    return [np.asarray(b).tolist() for b in batches]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


A = list(range(0, 700))  # a source of 700
B = list(range(10_000, 10_300))  # a source of 300


# -- proportions and the ends of an epoch --------------------------------------------------


def test_weights_default_to_the_sources_sizes_and_are_normalized() -> None:
    assert ff.Mix([A, B]).weights == pytest.approx((0.7, 0.3))
    assert ff.Mix([A, B], weights=[3, 1]).weights == (0.75, 0.25)
    assert ff.Mix([A, B], weights=[1, 0]).weights == (1.0, 0.0)
    mix = ff.Mix([A, B])
    assert mix.total == 1000
    assert mix.locate(699) == (0, 0, 699)
    assert mix.locate(700) == (1, 0, 0)
    assert mix.locate(2005) == (0, 2, 5)
    assert mix[700] == 10_000
    assert "weights=[0.7, 0.3]" in repr(mix)


def test_shortest_draws_at_the_weights_and_never_repeats() -> None:
    loader = ff.DataLoader(ff.Mix([A, B], weights=[0.5, 0.5]), batch_size=10, shuffle=True)
    got = flat(ids(loader))
    assert len(got) == len(set(got))
    from_b = [i >= 10_000 for i in got]
    # B (300) runs out first: every B sample, and as many of A, at 50/50.
    assert sum(from_b) == 300
    assert abs(len(got) - 600) <= 2
    # Over any window of 100 consecutive samples: 50 of each, give or take 3.
    for lo in range(0, len(got) - 100, 37):
        assert abs(sum(from_b[lo : lo + 100]) - 50) <= 3


def test_proportions_hold_within_half_a_point_over_an_epoch() -> None:
    a, b, c = range(100_000), range(200_000, 300_000), range(400_000, 500_000)
    mix = ff.Mix([a, b, c], weights=[0.6, 0.3, 0.1], samples_per_epoch=30_000)
    loader = ff.DataLoader(mix, batch_size=500, shuffle=True, seed=3)
    got = np.concatenate([np.asarray(batch) for batch in loader])
    assert len(got) == 30_000
    for lo, w in ((0, 0.6), (200_000, 0.3), (400_000, 0.1)):
        share = float(((got >= lo) & (got < lo + 100_000)).mean())
        assert abs(share - w) < 0.005
    assert loader.stats()["sources"][0]["weight"] == pytest.approx(0.6)


def test_longest_reads_the_longest_source_whole_and_reshuffles_the_others() -> None:
    small = list(range(10_000, 10_050))
    loader = ff.DataLoader(
        ff.Mix([A, small], weights=[0.5, 0.5], stop="longest"), batch_size=10, shuffle=True
    )
    got = flat(ids(loader))
    from_a = [i for i in got if i < 10_000]
    assert sorted(from_a) == A  # every sample of A once
    from_small = [i for i in got if i >= 10_000]
    assert len(from_small) >= 650
    passes = [from_small[k : k + 50] for k in range(0, 150, 50)]
    assert all(sorted(p) == small for p in passes)  # whole passes, each a permutation
    assert passes[0] != passes[1]  # reshuffled


def test_samples_per_epoch_fixes_the_length() -> None:
    mix = ff.Mix([A, B], samples_per_epoch=2500)
    loader = ff.DataLoader(mix, batch_size=64, drop_last=True)
    assert len(loader) == 2500 // 64
    assert len(flat(ids(loader))) == 2500 // 64 * 64
    loader = ff.DataLoader(mix, batch_size=64, world_size=2, rank=1)
    assert loader.samples_per_rank == 1250
    assert sum(len(b) for b in ids(loader)) == 1250


# -- order -------------------------------------------------------------------------------


def test_each_source_keeps_its_own_order_without_a_shuffle() -> None:
    got = flat(ids(ff.DataLoader(ff.Mix([A, B]), batch_size=7)))
    assert [i for i in got if i < 10_000] == A
    assert [i for i in got if i >= 10_000] == B


def test_another_order_each_epoch_and_the_same_for_the_same_seed() -> None:
    def epoch(e: int, seed: int = 5) -> list[list[int]]:
        return ids(ff.DataLoader(ff.Mix([A, B]), batch_size=8, shuffle=True, seed=seed), e)

    assert epoch(0) == epoch(0)
    assert epoch(0) != epoch(1)
    assert epoch(0) != epoch(0, seed=6)
    assert sorted(flat(epoch(0))) == sorted(flat(epoch(1)))


def test_the_same_batches_on_one_or_many_threads_and_in_worker_processes(
    tmp_path: Path,
) -> None:
    tar = id_shards(tmp_path, range(50_000, 50_400), 64)
    mix = ff.Mix([A, tar, ff.SharedList(B)], weights=[2, 1, 1], stop="longest")

    def run(**kw: Any) -> list[list[int]]:
        loader = ff.DataLoader(
            mix, batch_size=16, shuffle=True, seed=9, shuffle_window=32, transform=value, **kw
        )
        return [np.asarray(b).tolist() for b in loader]

    one = run(num_threads=1)
    got = flat(one)
    # The shards take longest (400 at a quarter): read once, whole; A went round again.
    assert sorted(i for i in got if 50_000 <= i < 50_400) == list(range(50_000, 50_400))
    assert {i for i in got if i < 10_000} == set(A)
    assert len([i for i in got if i < 10_000]) > len(A)
    assert run(num_threads=4) == one
    assert run(num_workers=2) == one
    assert run(num_workers=2, worker_start_method="spawn") == one


def test_samples_reach_the_transform_as_their_source_gives_them(tmp_path: Path) -> None:
    tar = id_shards(tmp_path, range(100, 140), 16)
    seen: list[Any] = []

    def keep(sample: Any) -> int:
        seen.append(sample)
        return value(sample)

    loader = ff.DataLoader(
        ff.Mix([list(range(40)), tar]), batch_size=8, transform=keep, num_threads=1
    )
    got = sorted(flat(ids(loader)))
    assert got == list(range(40)) + list(range(100, 140))
    kinds = Counter(type(s).__name__ for s in seen)
    assert kinds == {"int": 40, "dict": 40}
    assert all(set(s) >= {"cls", "__key__"} for s in seen if isinstance(s, dict))


# -- resume --------------------------------------------------------------------------------


def test_state_dict_resumes_exactly_and_stays_small(tmp_path: Path) -> None:
    tar = id_shards(tmp_path, range(50_000, 50_600), 100)
    big_a, big_b = range(1_000_000), range(2_000_000, 3_000_000)

    def loader() -> ff.DataLoader:
        return ff.DataLoader(
            ff.Mix([big_a, tar, big_b], weights=[1, 1, 1]),
            batch_size=32,
            shuffle=True,
            seed=2,
            transform=value,
            shuffle_window=64,
        )

    whole = ids(loader())
    first = loader()
    it = iter(first)
    head = [np.asarray(next(it)).tolist() for _ in range(7)]
    state = first.state_dict()
    assert len(json.dumps(state)) <= 4096
    resumed = loader()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert head + ids(resumed) == whole
    # Another mixture refuses the state.
    other = ff.DataLoader(
        ff.Mix([big_a, tar, big_b], weights=[1, 2, 1]),
        batch_size=32,
        shuffle=True,
        seed=2,
        shuffle_window=64,
    )
    with pytest.raises(ValueError, match="saved with mix="):
        other.load_state_dict(state)


def test_loading_a_state_costs_no_replay() -> None:
    # Sources of 10^8 samples: a position near the end of the epoch is arithmetic.
    a, b = range(10**8), range(10**8, 2 * 10**8)
    mix = ff.Mix([a, b], weights=[0.5, 0.5])
    loader = ff.DataLoader(mix, batch_size=256, shuffle=True, seed=1)
    last = len(loader) - 1
    state = {**loader.state_dict(), "batches_done": last}
    loader.load_state_dict(state)
    batch = next(iter(loader))
    plan = _core.MixPlan([10**8, 10**8], [0.5, 0.5], "shortest", 256, shuffle=True, seed=1)
    assert np.asarray(batch).tolist() == plan.batch(last)
    assert len(json.dumps(state)) <= 4096


@pytest.mark.parametrize("worlds", [[(4, 3), (3, None)], [(2, 5), (5, 1), (3, None)]])
def test_an_elastic_resume_finishes_the_epoch_with_nothing_repeated(
    tmp_path: Path, worlds: list[tuple[int, int | None]]
) -> None:
    tar = id_shards(tmp_path, range(50_000, 50_480), 60)
    mix = ff.Mix([list(range(600)), tar, list(range(10_000, 10_400))], weights=[3, 2, 1])

    def loaders(world: int) -> list[ff.DataLoader]:
        return [
            ff.DataLoader(
                mix,
                batch_size=8,
                shuffle=True,
                seed=4,
                rank=r,
                world_size=world,
                transform=value,
                shuffle_window=40,
            )
            for r in range(world)
        ]

    whole = flat([i for dl in loaders(4) for i in ids(dl)])
    seen: list[int] = []
    state: dict[str, Any] | None = None
    for world, done in worlds:
        group = loaders(world)
        for dl in group:
            if state is not None:
                dl.load_state_dict({**state, "rank": dl.rank})
            it = iter(dl)
            n = len(dl) - dl.state_dict()["batches_done"] if done is None else done
            seen += flat([np.asarray(next(it)).tolist() for _ in range(n)])
        state = group[0].state_dict()
    assert len(seen) == len(set(seen)), "a sample twice"
    assert (
        not set(seen)
        - set(whole)
        - set(range(600))
        - set(range(10_000, 10_400))
        - set(range(50_000, 50_480))
    )
    # What may be lost: each world's remainders (fewer than its ranks, per source).
    assert len(seen) >= len(whole) - sum(3 * w for w, _ in worlds) - 8 * 5


# -- object storage --------------------------------------------------------------------


def test_remote_sources_mix_as_their_local_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objstore import HttpFileServer

    monkeypatch.setenv("FERROFEED_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "shards"
    root.mkdir()
    local = id_shards(root, range(50_000, 50_300), 50)
    n = len(local.shards)
    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 8, "transform": value}
    want = ids(ff.DataLoader(ff.Mix([A, local], weights=[1, 1]), **kw))
    with HttpFileServer(root) as server:
        remote = ff.TarShards(f"{server.url}/ids-{{000..{n - 1:03d}}}.tar")
        loader = ff.DataLoader(ff.Mix([A, remote], weights=[1, 1]), **kw)
        assert ids(loader) == want
        # The sharded source's object-storage counters come through the mixture's stats.
        assert {"requests", "bytes", "fetched"} <= set(loader.stats()["remote"])


# -- the native image chain ------------------------------------------------------------


def jpeg(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (24, 20), color).save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_the_native_chain_mixes_folders_and_shards_with_field_alternatives(
    tmp_path: Path,
) -> None:
    pytest.importorskip("PIL")
    folder = tmp_path / "folder"
    for c, name in enumerate(("a", "b")):
        (folder / name).mkdir(parents=True)
        for i in range(12):
            (folder / name / f"{i}.jpg").write_bytes(jpeg((200, 10, 10 + c)))
    jpg = write_tar(tmp_path / "jpg.tar", [{"jpg": jpeg((10, 200, 10)), "cls": b"7"}] * 20)
    image = write_tar(tmp_path / "image.tar", [{"image": jpeg((10, 10, 200)), "label": b"9"}] * 20)
    mix = ff.Mix([str(folder), ff.TarShards(str(jpg)), ff.TarShards(str(image))], weights=[1, 1, 1])
    loader = ff.DataLoader(
        mix,
        batch_size=6,
        image="jpg;image",
        label="cls;label",
        transform=ops.decode_image(size=8),
    )
    labels: list[int] = []
    for images, batch_labels in loader:
        pixels = np.asarray(images)[:, 4, 4].astype(int)
        for px, label in zip(pixels, np.asarray(batch_labels).tolist(), strict=True):
            labels.append(label)
            # Each image is its source's colour: the right bytes went with each label.
            channel = {7: 1, 9: 2}.get(label, 0)
            assert px[channel] > 150, (label, px)
    counts = Counter(labels)
    assert counts[7] == counts[9] == 20
    assert abs(counts[0] + counts[1] - 20) <= 1
    assert loader.native
    # Without the alternatives, the shard whose fields differ is named.
    plain = ff.DataLoader(
        mix, batch_size=6, image="jpg", label="cls", transform=ops.decode_image(size=8)
    )
    with pytest.raises(ff.ShardFieldError, match=r"image\.tar"):
        list(plain)


# -- nothing left behind ---------------------------------------------------------------


def test_leaving_an_epoch_early_leaves_no_thread(tmp_path: Path) -> None:
    from thread_counts import settle_threads, thread_counts

    tar = id_shards(tmp_path, range(50_000, 50_400), 40)
    (tmp_path / "b").mkdir()
    other = id_shards(tmp_path / "b", range(60_000, 60_200), 40)

    def loader() -> ff.DataLoader:
        mix = ff.Mix([A, tar, other], weights=[1, 1, 1])
        kw: dict[str, Any] = {"shuffle": True, "shuffle_window": 16, "transform": value}
        return ff.DataLoader(mix, batch_size=8, **kw)

    ids(loader())  # what the process makes once (the runtime, the pools) is made now
    gc.collect()
    base = thread_counts()
    for _ in range(3):
        it = iter(loader())
        next(it)
        next(it)
        del it  # break out mid-epoch, every part's reader mid-read
    gc.collect()
    assert settle_threads(base) == base


# -- failures and figures --------------------------------------------------------------


class Flaky:
    """A map-style source whose samples from ``bad`` on fail."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i >= self.bad:
            raise OSError(f"sample {i} is gone")
        return 10_000 + i


def test_a_failing_source_is_counted_and_the_others_go_on() -> None:
    mix = ff.Mix([A, Flaky(300, bad=100)], weights=[0.7, 0.3])
    loader = ff.DataLoader(mix, batch_size=10, on_error="skip", max_failures=None)
    got = flat(ids(loader))
    assert [i for i in got if i < 10_000] == A
    assert [i for i in got if i >= 10_000] == [10_000 + i for i in range(100)]
    stats = loader.stats()
    sources = stats["sources"]
    assert [s["skipped"] for s in sources] == [0, 200]
    assert stats["skipped_count"] == 200
    with pytest.raises(OSError, match="is gone"):
        list(ff.DataLoader(mix, batch_size=10))


def test_a_damaged_shard_is_refused_without_skip_and_read_up_to_the_damage_with_it(
    tmp_path: Path,
) -> None:
    tar = id_shards(tmp_path, range(50_000, 50_120), 40)
    cut = Path(tar.shards[1][0])
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 100])
    damaged = ff.TarShards([p for p, _ in tar.shards])
    mix = ff.Mix([A, damaged], weights=[1, 1])
    with pytest.raises(ff.ShardCorruptError) as e:
        ff.DataLoader(mix, batch_size=8)
    assert e.value.shard == str(cut)
    loader = ff.DataLoader(mix, batch_size=8, on_error="skip", transform=value)
    got = flat(ids(loader))
    from_tar = [i for i in got if i >= 50_000]
    # Every sample before the damage, and the other shards whole.
    assert len(from_tar) == len(damaged) < 120
    assert set(from_tar) >= set(range(50_000, 50_040)) | set(range(50_080, 50_120))
    assert [shard for shard, _ in loader.stats()["skipped_shards"]] == [str(cut)]


def test_stats_count_each_source_up_to_the_loader_position() -> None:
    loader = ff.DataLoader(ff.Mix([A, B], weights=[0.5, 0.5]), batch_size=10)
    it = iter(loader)
    for _ in range(5):
        next(it)
    sources = loader.stats()["sources"]
    counts = [s["samples"] for s in sources]
    assert sum(counts) == 50
    assert all(abs(n - 25) <= 1 for n in counts)
    assert [s["kind"] for s in sources] == ["list", "list"]


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weights": [1, -1]}, ValueError, "weight 1 is -1.0"),
        ({"weights": [0, 0]}, ValueError, "every weight is 0"),
        ({"weights": [float("nan"), 1]}, ValueError, "weight 0 is nan"),
        ({"weights": [float("inf"), 1]}, ValueError, "weight 0 is inf"),
        ({"weights": [1, 2, 3]}, ValueError, "3 weights for 2 sources"),
        ({"weights": [1, "2"]}, TypeError, "weight 1 must be a number"),
        ({"weights": [True, 1]}, TypeError, "weight 0 must be a number"),
        ({"stop": "first"}, ValueError, "stop must be"),
        ({"samples_per_epoch": 0}, ValueError, "samples_per_epoch"),
        ({"samples_per_epoch": 2.5}, ValueError, "samples_per_epoch"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ff.Mix([A, B], **kwargs)


def test_bad_sources_are_refused() -> None:
    with pytest.raises(ValueError, match=r"source 1 \(list\) is empty"):
        ff.Mix([A, []])
    with pytest.raises(ValueError, match="at least one source"):
        ff.Mix([])
    with pytest.raises(TypeError, match="source 0 is an iterable dataset"):
        ff.Mix([iter(A), B])
    with pytest.raises(TypeError, match="source 1 is a Mix"):
        ff.Mix([A, ff.Mix([B])])
    with pytest.raises(TypeError, match="sources must be a list"):
        ff.Mix("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source 0 must be a sequence"):
        ff.Mix([42, B])
    with pytest.raises(TypeError, match="read through a DataLoader"):
        iter(ff.Mix([A]))


def test_loader_arguments_that_do_not_apply_to_a_mix_are_refused() -> None:
    mix = ff.Mix([A, B])
    for kw in ({"bucket_by": len}, {"batches_per_epoch": 3}, {"batch_sampler": [[0]]}):
        with pytest.raises(TypeError, match="does not apply to a Mix"):
            ff.DataLoader(mix, **kw)
    with pytest.raises(TypeError, match="image= names the field"):
        ff.DataLoader(mix, image="jpg")
    small = ff.Mix([list(range(3)), B], stop="longest")
    with pytest.raises(ValueError, match="fewer than the 4 ranks"):
        ff.DataLoader(small, batch_size=2, world_size=4, rank=0)
