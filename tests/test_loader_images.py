"""`DataLoader` over image files: `ImageFolder`, `ImageFiles` and the native batch op.

Folders of class subfolders, image files and sequences of paths go through the native image
chain (each batch's files decoded in parallel into one pooled buffer). Checked here against
`ferrofeed.io.decode_image` file by file, and against the map-style `DataLoader` over
``range(n)`` for the order (shuffle, sharding, ``batches_per_epoch``, resume).

Most loaders label each file with its own dataset index (``ImageFiles(paths,
labels=range(n))``), so every batch row can be traced back to its file.

JAX is only ever imported in a subprocess: importing it here breaks the fork tests elsewhere.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import ferrofeed
import numpy as np
import pytest
from ferrofeed import (
    DataLoader,
    ImageDecodeError,
    ImageFiles,
    ImageFolder,
    ImageReadError,
    PipelineBuilder,
    PipelineError,
    default_collate,
    io,
    ops,
)
from thread_counts import settle_threads, thread_counts

Image = pytest.importorskip("PIL.Image")

RunPython = Callable[..., subprocess.CompletedProcess[str]]

# The class folders of the shared dataset, and how many images each holds (those of "cat"
# partly in a nested folder). Created in an unsorted order on purpose.
CLASSES = {"dog": 15, "bird": 14, "cat": 16}
N_IMAGES = sum(CLASSES.values())
SIZE = 32  # the side of the fixed-size transform most tests use
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def write_jpeg(path: Path, rng: np.random.Generator) -> None:
    """A small JPEG of random size and content (every file's pixels are distinct)."""
    h, w = (int(v) for v in rng.integers(64, 161, size=2))
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], axis=-1)
    noise = rng.integers(-40, 40, size=(h, w, 3))
    img = np.clip(base + noise + int(rng.integers(-60, 60)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.startswith("gray"):  # a one-channel JPEG, decoded to RGB
        Image.fromarray(img[..., 0]).save(path, format="JPEG", quality=90)
    elif path.suffix.lower() == ".png":  # with an alpha channel, dropped
        alpha = np.full(img.shape[:2], 200, np.uint8)
        Image.fromarray(np.dstack([img, alpha])).save(path)  # RGBA
    else:
        Image.fromarray(img).save(path, format="JPEG", quality=90)


class Dataset:
    """The shared image folder and its reference decodes."""

    def __init__(self, root: Path, paths: list[str], labels: list[int]) -> None:
        self.root = root
        self.paths = paths  # ImageFolder's order: by class, then sorted path
        self.labels = labels
        self.refs = np.stack([io.decode_image(p, size=SIZE).numpy() for p in paths])

    def indexed(self) -> ImageFiles:
        """The files, each labelled with its own index."""
        return ImageFiles(self.paths, labels=list(range(len(self.paths))))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(1234)
    expected: dict[str, list[str]] = {}
    for name, count in CLASSES.items():
        found = []
        for i in range(count):
            if name == "cat" and i % 3 == 0:
                rel = f"indoor/{i:02d}.jpg"  # nested: found recursively
            elif name == "bird" and i == 1:
                rel = f"{i:02d}.PNG"  # upper-case ending, and a PNG
            elif name == "dog" and i == 2:
                rel = f"{i:02d}.JPEG"
            elif name == "dog" and i == 3:
                rel = f"gray{i:02d}.jpg"
            else:
                rel = f"{i:02d}.jpg"
            write_jpeg(root / name / rel, rng)
            found.append(str(root / name / rel))
        expected[name] = sorted(found)
    # Decoys, all valid images or text: hidden files and folders, other endings, a file
    # at the root (not in a class), a hidden class folder.
    write_jpeg(root / "cat" / ".hidden.jpg", rng)
    write_jpeg(root / "cat" / ".cache" / "thumb.jpg", rng)
    write_jpeg(root / ".trash" / "x.jpg", rng)
    write_jpeg(root / "stray.jpg", rng)
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "dog" / "README").write_text("not an image")
    write_jpeg(root / "bird" / "photo.jpg.bak", rng)
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(sorted(CLASSES)):
        paths += expected[name]
        labels += [label] * len(expected[name])
    return Dataset(root, paths, labels)


def map_order(n: int, epochs: Sequence[int] = (0,), **kw: Any) -> list[list[int]]:
    """Dataset indices of each batch of the map-style `DataLoader` over ``range(n)``."""
    loader = DataLoader(list(range(n)), **kw)
    return [b.tolist() for e in epochs for b in loader.epoch_batches(e)]


def collect(batches: Iterable[Any]) -> list[tuple[np.ndarray, list[int]]]:
    """(images, labels) of each batch, the images copied."""
    return [(np.array(images), labels.tolist()) for images, labels in batches]


def same_batches(
    a: Sequence[tuple[np.ndarray, list[int]]], b: Sequence[tuple[np.ndarray, list[int]]]
) -> bool:
    return len(a) == len(b) and all(
        la == lb and np.array_equal(ia, ib) for (ia, la), (ib, lb) in zip(a, b, strict=True)
    )


def digest(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def indexed_loader(data: Dataset, **kw: Any) -> DataLoader:
    kw.setdefault("transform", ops.decode_image(size=SIZE))
    kw.setdefault("num_threads", 2)
    return DataLoader(data.indexed(), **kw)


# --------------------------------------------------------------------------------------
# ImageFolder and ImageFiles


def test_image_folder_classes_labels_and_files(data: Dataset) -> None:
    folder = ImageFolder(data.root)
    assert folder.classes == ["bird", "cat", "dog"]
    assert folder.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    # Recursive, sorted within each class, hidden files/folders and other endings left out.
    assert list(folder.paths) == data.paths
    assert list(folder.labels or []) == data.labels
    assert len(folder) == N_IMAGES
    names = [os.fspath(p) for p in folder.paths]
    assert any(os.sep + "indoor" + os.sep in p for p in names)
    assert any(p.endswith(".PNG") for p in names)
    assert any(p.endswith(".JPEG") for p in names)
    # Iterable (through the sequence protocol): (path, label) pairs.
    pairs = list(folder)  # type: ignore[call-overload]
    assert pairs == list(zip(data.paths, data.labels, strict=True))
    for p in folder.paths:
        rel = Path(p).relative_to(data.root)
        assert not any(part.startswith(".") for part in rel.parts), p
        assert rel.parts[0] in CLASSES
    for i in (0, 13, 14, N_IMAGES - 1):
        path, label = folder[i]
        assert (path, label) == (data.paths[i], data.labels[i])
        assert type(label) is int
        assert folder.classes[label] == Path(path).relative_to(data.root).parts[0]
    # A str root and a pathlib root give the same; so does DataLoader(path).
    assert list(ImageFolder(str(data.root)).paths) == data.paths
    assert "3 classes" in repr(folder)
    assert f"{N_IMAGES} images" in repr(folder)


def test_image_folder_extensions_and_symlinks(tmp_path: Path) -> None:
    for rel in ("a/1.jpg", "a/2.png", "b/3.webp", "b/4.bmp", "b/5.gif"):
        (tmp_path / "root" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / rel).write_bytes(b"")  # ImageFolder never opens them
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "6.jpg").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "b" / "linked")
    folder = ImageFolder(tmp_path / "root")
    names = [Path(p).name for p in folder.paths]
    assert names == ["1.jpg", "2.png", "3.webp", "4.bmp", "6.jpg"]
    assert list(folder.labels or []) == [0, 0, 1, 1, 1]
    only_png = ImageFolder(tmp_path / "root", extensions=[".PNG", ".gif"])
    assert [Path(p).name for p in only_png.paths] == ["2.png", "5.gif"]
    assert list(only_png.labels or []) == [0, 1]


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a folder"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "file.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        ImageFolder(tmp_path / "file.jpg")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "loose.jpg").write_bytes(b"")  # a file at the root is not a class
    (empty / ".hidden").mkdir()  # nor is a hidden folder
    (empty / ".hidden" / "x.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no class folders"):
        ImageFolder(empty)
    no_images = tmp_path / "no_images"
    (no_images / "a").mkdir(parents=True)
    (no_images / "b").mkdir()
    (no_images / "a" / "notes.txt").write_text("x")
    (no_images / "b" / ".x.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no images"):
        ImageFolder(no_images)
    # DataLoader(path) builds the ImageFolder, with the same errors.
    with pytest.raises(FileNotFoundError):
        DataLoader(no_images)
    with pytest.raises(FileNotFoundError):
        DataLoader(str(tmp_path / "missing"))


def test_image_files_indexing_slicing_and_errors() -> None:
    paths = [f"/x/{i}.jpg" for i in range(6)]
    files = ImageFiles(paths, labels=[5, 4, 3, 2, 1, 0])
    assert len(files) == 6
    assert files[0] == ("/x/0.jpg", 5)
    assert files[-1] == ("/x/5.jpg", 0)
    part = files[1:5:2]
    assert isinstance(part, ImageFiles)
    assert len(part) == 2
    assert [part[0], part[1]] == [("/x/1.jpg", 4), ("/x/3.jpg", 2)]
    assert files.paths is paths  # kept, not copied
    plain = ImageFiles([Path(p) for p in paths])
    assert plain[2] == Path("/x/2.jpg")
    assert plain[2:4].labels is None
    assert [plain[2:4][i] for i in range(2)] == [Path("/x/2.jpg"), Path("/x/3.jpg")]
    assert "with labels" in repr(files)
    assert "without labels" in repr(plain)
    np_labels = ImageFiles(paths, labels=np.arange(6, dtype=np.int64))  # type: ignore[arg-type]
    assert type(np_labels[3][1]) is int
    with pytest.raises(ValueError, match="5 labels for 6 paths"):
        ImageFiles(paths, labels=[0] * 5)
    with pytest.raises(IndexError):
        files[6]
    with pytest.raises(TypeError, match="ImageFolder"):
        ImageFiles("/x")  # a str is a Sequence[str]: refused at run time
    with pytest.raises(TypeError, match="ImageFolder"):
        ImageFiles(Path("/x"))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# DataLoader over a folder


@pytest.mark.timeout(120)
def test_folder_default_transform_matches_decode_image_in_map_style_order(
    data: Dataset,
) -> None:
    batch_size, seed = 8, 11
    loader = DataLoader(data.root, batch_size=batch_size, shuffle=True, seed=seed, num_threads=2)
    assert loader.native
    assert len(loader) == 6
    batches = list(loader)  # all kept alive while the loader makes the next ones
    order = map_order(N_IMAGES, batch_size=batch_size, shuffle=True, seed=seed)
    assert len(batches) == len(order) == 6
    assert sorted(i for b in order for i in b) == list(range(N_IMAGES))
    assert order[0] != sorted(order[0])  # shuffled
    refs = {
        i: io.decode_image(p, resize_shorter=256, crop=224).numpy()
        for i, p in enumerate(data.paths)
    }
    for (images, labels), indices in zip(batches, order, strict=True):
        assert isinstance(images, np.ndarray)
        assert images.shape == (len(indices), 224, 224, 3)
        assert images.dtype == np.uint8
        assert images.ctypes.data % 64 == 0  # a pooled, aligned buffer
        assert labels.dtype == np.int64
        assert labels.tolist() == [data.labels[i] for i in indices]
        for row, i in zip(images, indices, strict=True):
            assert np.array_equal(row, refs[i]), f"row of {data.paths[i]} differs"
    assert [b[0].shape[0] for b in batches] == [8, 8, 8, 8, 8, 5]
    # An ImageFolder object gives the very same batches as its path.
    again = DataLoader(
        ImageFolder(data.root), batch_size=batch_size, shuffle=True, seed=seed, num_threads=1
    )
    assert same_batches(collect(again), collect(batches))
    assert loader.epoch == 1


def test_every_file_once_per_epoch_and_pixels_match(data: Dataset) -> None:
    loader = indexed_loader(data, batch_size=6, shuffle=True, seed=2)
    for epoch in range(2):
        got = collect(loader)
        seen = [i for _, labels in got for i in labels]
        assert sorted(seen) == list(range(N_IMAGES)), f"epoch {epoch}"
        assert [labels for _, labels in got] == map_order(
            N_IMAGES, epochs=[epoch], batch_size=6, shuffle=True, seed=2
        )
        for images, labels in got:
            assert np.array_equal(images, data.refs[labels])
    assert loader.epoch == 2


def test_shuffle_off_keeps_folder_order(data: Dataset) -> None:
    loader = DataLoader(
        ImageFolder(data.root), batch_size=10, transform=ops.decode_image(size=SIZE)
    )
    got = collect(loader)
    assert [lab for _, labels in got for lab in labels] == data.labels
    assert np.array_equal(np.concatenate([im for im, _ in got]), data.refs)


def test_python_transform_on_image_files_is_map_style(data: Dataset) -> None:
    loader = DataLoader(ImageFolder(data.root), batch_size=16, transform=lambda item: item[1] * 10)
    assert not loader.native
    assert [b.tolist() for b in loader] == [
        [lab * 10 for lab in data.labels[i : i + 16]] for i in range(0, N_IMAGES, 16)
    ]


def test_grayscale_and_center_crop_only(data: Dataset) -> None:
    loader = indexed_loader(
        data, batch_size=16, transform=ops.decode_image(resize_shorter=40, crop=24, mode="L")
    )
    got = collect(loader)
    for images, labels in got:
        assert images.shape == (len(labels), 24, 24, 1)
        for row, i in zip(images, labels, strict=True):
            ref = io.decode_image(data.paths[i], resize_shorter=40, crop=24, mode="L")
            assert np.array_equal(row, ref.numpy())
    flipped = collect(
        indexed_loader(data, batch_size=16, transform=ops.decode_image(size=SIZE, flip=True))
    )
    for images, labels in flipped:
        assert np.array_equal(images, data.refs[labels][:, :, ::-1])


# --------------------------------------------------------------------------------------
# random crops: determinism


@pytest.mark.timeout(120)
def test_random_crops_same_for_any_thread_count_and_differ_by_epoch(data: Dataset) -> None:
    def loader(num_threads: int, batch_size: int = 8, seed: int = 5) -> DataLoader:
        return DataLoader(
            ImageFolder(data.root),
            batch_size=batch_size,
            shuffle=True,
            seed=seed,
            num_threads=num_threads,
            transform=ops.decode_image(size=SIZE, crop="random"),
        )

    runs = {t: [collect(loader(t).epoch_batches(e)) for e in (0, 1)] for t in (1, 2, 4)}
    for t in (2, 4):
        assert same_batches(runs[t][0], runs[1][0]), f"epoch 0, num_threads={t}"
        assert same_batches(runs[t][1], runs[1][1]), f"epoch 1, num_threads={t}"
    # Several small batches decoding at once (num_threads > batch_size).
    small = [collect(loader(t, batch_size=2).epoch_batches(0)) for t in (1, 4)]
    assert same_batches(small[0], small[1])
    flat_small = np.concatenate([im for im, _ in small[0]])
    assert np.array_equal(flat_small, np.concatenate([im for im, _ in runs[1][0]]))

    # Random crops, not the plain resize.
    epoch0 = runs[1][0]
    order0 = map_order(N_IMAGES, batch_size=8, shuffle=True, seed=5)
    plain = np.concatenate([data.refs[i] for i in order0])
    cropped0 = np.concatenate([im for im, _ in epoch0])
    assert np.mean([not np.array_equal(a, b) for a, b in zip(cropped0, plain, strict=True)]) > 0.9

    # Epochs differ in their crops: compare each file's crop across epochs.
    def by_file(batches: list[tuple[np.ndarray, list[int]]], epoch: int) -> dict[int, np.ndarray]:
        order = map_order(N_IMAGES, epochs=[epoch], batch_size=8, shuffle=True, seed=5)
        assert [labels for _, labels in batches] == [[data.labels[i] for i in b] for b in order]
        images = np.concatenate([im for im, _ in batches])
        return {i: images[j] for j, i in enumerate(i for b in order for i in b)}

    e0, e1 = by_file(runs[1][0], 0), by_file(runs[1][1], 1)
    differ = [not np.array_equal(e0[i], e1[i]) for i in range(N_IMAGES)]
    assert np.mean(differ) > 0.9, "random crops repeat from epoch to epoch"

    # The same (seed, epoch) in a fresh loader: the same crops; by iteration or set_epoch.
    fresh = loader(2)
    fresh.set_epoch(1)
    assert same_batches(collect(fresh), runs[1][1])
    through_iter = loader(1)
    assert same_batches(collect(through_iter), runs[1][0])
    assert same_batches(collect(through_iter), runs[1][1])
    # Another seed, other crops (and order).
    other = collect(loader(1, seed=6).epoch_batches(0))
    assert not same_batches(other, runs[1][0])


def test_random_flip_mirrors_the_same_crop_about_half_the_time(data: Dataset) -> None:
    # RandomResizedCrop + RandomHorizontalFlip natively: each image is the crop drawn with
    # flip=False, mirrored or not; both happen; the draw does not depend on threads.
    def run(flip: bool | str, threads: int = 2) -> list[tuple[np.ndarray, list[int]]]:
        op = ops.decode_image(size=SIZE, crop="random", flip=flip)  # type: ignore[arg-type]
        return collect(
            indexed_loader(data, batch_size=8, seed=11, num_threads=threads, transform=op)
        )

    plain = np.concatenate([im for im, _ in run(False)])
    flipped = run("random")
    assert same_batches(flipped, run("random", threads=1))
    images = np.concatenate([im for im, _ in flipped])
    mirrored = 0
    for got, crop in zip(images, plain, strict=True):
        if np.array_equal(got, crop[:, ::-1]) and not np.array_equal(got, crop):
            mirrored += 1
        else:
            assert np.array_equal(got, crop), "a random flip changed more than the mirroring"
    # 45 images, each mirrored with probability 1/2: 1 to 44 (chance of failing < 1e-12)
    assert 0 < mirrored < len(images), mirrored
    # flip=True mirrors every one (NumPy's bool_ too).
    always = np.concatenate([im for im, _ in run(True)])
    assert np.array_equal(always, plain[:, :, ::-1])
    assert np.array_equal(np.concatenate([im for im, _ in run(np.True_)]), always)  # type: ignore[arg-type]


def test_flip_argument_errors_and_seeded_single_decode(data: Dataset) -> None:
    for bad in ("yes", 2, 0.5):
        with pytest.raises(ValueError, match="flip is True, False or"):
            ops.decode_image(size=SIZE, flip=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="flip is True, False or"):
            io.decode_image(data.paths[0], size=SIZE, flip=bad)  # type: ignore[arg-type]
    path = data.paths[0]
    outcomes = set()
    for seed in range(24):
        one = io.decode_image(path, size=SIZE, flip="random", seed=seed).numpy()
        assert np.array_equal(
            one, io.decode_image(path, size=SIZE, flip="random", seed=seed).numpy()
        )
        plain = data.refs[0]
        outcomes.add("mirrored" if np.array_equal(one, plain[:, ::-1]) else "plain")
        assert np.array_equal(one, plain) or np.array_equal(one, plain[:, ::-1])
        # load_images: item i draws from crop_seed(seed, 0, i), the one crop-seed rule
        batch = io.load_images([path, path], size=SIZE, flip="random", seed=seed).numpy()
        for i in range(2):
            s = ferrofeed._core.crop_seed(seed, 0, i)
            want = io.decode_image(path, size=SIZE, flip="random", seed=s).numpy()
            assert np.array_equal(batch[i], want)
    assert outcomes == {"mirrored", "plain"}


def test_op_seed_beside_the_loaders_is_refused(data: Dataset) -> None:
    # The loader's seed= seeds every sample: an op's own would not be used.
    op = ops.decode_image(size=SIZE, crop="random", seed=3)
    with pytest.raises(ValueError, match=r"pass seed=3 to the DataLoader instead"):
        indexed_loader(data, batch_size=9, transform=op)


# --------------------------------------------------------------------------------------
# sharding by rank


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shards_are_disjoint_cover_and_equal(
    data: Dataset, world_size: int, drop_last: bool
) -> None:
    kw: dict[str, Any] = {
        "batch_size": 4,
        "shuffle": True,
        "seed": 9,
        "drop_last": drop_last,
        "world_size": world_size,
    }
    shards = []
    for rank in range(world_size):
        loader = indexed_loader(data, rank=rank, **kw)
        got = collect(loader)
        assert len(got) == len(loader)
        assert [labels for _, labels in got] == map_order(N_IMAGES, rank=rank, **kw)
        for images, labels in got:
            assert np.array_equal(images, data.refs[labels])
            if drop_last:
                assert len(labels) == 4
        shards.append([i for _, labels in got for i in labels])
    assert len({len(s) for s in shards}) == 1, "ranks see different numbers of samples"
    counts = {len(indexed_loader(data, rank=r, **kw)) for r in range(world_size)}
    assert len(counts) == 1, "ranks have different numbers of batches"
    every = [i for s in shards for i in s]
    if drop_last:
        assert len(every) == len(set(every)), "ranks overlap"
        per_rank = (N_IMAGES // world_size) // 4 * 4
        assert len(shards[0]) == per_rank
    else:
        assert set(every) == set(range(N_IMAGES)), "ranks do not cover the dataset"
        per_rank = -(-N_IMAGES // world_size)
        assert len(shards[0]) == per_rank
        # Only the padding (wrapped round to the start) repeats.
        assert len(every) - len(set(every)) == per_rank * world_size - N_IMAGES


# --------------------------------------------------------------------------------------
# resume

RESUME_SCRIPT = """
import hashlib, json, sys
import numpy as np
from ferrofeed import DataLoader, ImageFiles, ops

cfg = json.loads(sys.argv[1])
files = ImageFiles(cfg["paths"], labels=list(range(len(cfg["paths"]))))
loader = DataLoader(
    files,
    batch_size=cfg["batch_size"],
    shuffle=True,
    seed=cfg["seed"],
    num_threads=2,
    transform=ops.decode_image(size=cfg["size"], crop="random"),
)
loader.load_state_dict(cfg["state"])
out = []
for images, labels in loader:
    data = np.ascontiguousarray(images).tobytes()
    out.append([labels.tolist(), hashlib.sha256(data).hexdigest()])
print(json.dumps({"batches": out, "epoch": loader.epoch}))
"""


@pytest.mark.timeout(120)
def test_resume_mid_epoch_in_process_and_in_a_new_process(
    data: Dataset, run_python: RunPython, last_json_line: Callable[[str], Any]
) -> None:
    def make() -> DataLoader:
        return indexed_loader(
            data,
            batch_size=5,
            shuffle=True,
            seed=21,
            transform=ops.decode_image(size=SIZE, crop="random"),
        )

    reference = make()
    collect(reference)  # epoch 0
    full1 = collect(reference)  # epoch 1: the one interrupted below
    assert len(full1) == 9
    k = 4

    loader = make()
    collect(loader)
    taken = []
    for i, (images, labels) in enumerate(loader):
        taken.append((np.array(images), labels.tolist()))
        if i + 1 == k:
            break
    assert same_batches(taken, full1[:k])
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, k)

    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert same_batches(collect(resumed), full1[k:])
    assert resumed.epoch == 2
    # The interrupted loader itself continues where it stopped.
    assert same_batches(collect(loader), full1[k:])

    cfg = {"paths": data.paths, "batch_size": 5, "seed": 21, "size": SIZE, "state": state}
    out = last_json_line(run_python(RESUME_SCRIPT, args=[json.dumps(cfg)], timeout=90).stdout)
    assert out["epoch"] == 2
    assert out["batches"] == [[labels, digest(images)] for images, labels in full1[k:]]


def test_resume_with_batches_per_epoch_across_passes(data: Dataset) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 8, "batches_per_epoch": 7}
    loader = indexed_loader(data, **kw)
    assert len(loader) == 7
    epochs = [collect(loader) for _ in range(4)]  # 28 batches: more than two passes of 12
    labels = [lab for e in epochs for _, lab in e]
    assert [len(e) for e in epochs] == [7, 7, 7, 7]
    assert labels == map_order(N_IMAGES, epochs=range(4), **kw)
    # Passes: 12 batches each (the last of 1 sample), every file once per pass.
    assert [len(b) for b in labels[:12]] == [4] * 11 + [1]
    assert sorted(i for b in labels[:12] for i in b) == list(range(N_IMAGES))
    assert sorted(i for b in labels[12:24] for i in b) == list(range(N_IMAGES))
    assert labels[:12] != labels[12:24]  # each pass has its own order
    for images, lab in (b for e in epochs for b in e):
        assert np.array_equal(images, data.refs[lab])

    # Resume in the middle of epoch 1 (which crosses from pass 0 into pass 1).
    partial = indexed_loader(data, **kw)
    collect(partial)
    for i, _ in enumerate(partial):
        if i == 2:
            break
    state = partial.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 3)
    fresh = indexed_loader(data, **kw)
    fresh.load_state_dict(state)
    assert same_batches(collect(fresh), epochs[1][3:])


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last(data: Dataset, drop_last: bool) -> None:
    loader = indexed_loader(data, batch_size=4, shuffle=True, seed=1, drop_last=drop_last)
    got = collect(loader)
    sizes = [len(labels) for _, labels in got]
    if drop_last:
        assert sizes == [4] * 11
        assert len(loader) == 11
    else:
        assert sizes == [4] * 11 + [1]
        assert len(loader) == 12
    assert [labels for _, labels in got] == map_order(
        N_IMAGES, batch_size=4, shuffle=True, seed=1, drop_last=drop_last
    )


# --------------------------------------------------------------------------------------
# output: torch and JAX


def test_torch_output(data: Dataset) -> None:
    torch = pytest.importorskip("torch")
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 4}
    ref = collect(indexed_loader(data, **kw))
    got = list(indexed_loader(data, output="torch", **kw))
    assert len(got) == len(ref)
    for (images, labels), (ref_images, ref_labels) in zip(got, ref, strict=True):
        assert isinstance(images, torch.Tensor)
        assert isinstance(labels, torch.Tensor)
        assert images.dtype == torch.uint8
        assert labels.dtype == torch.int64
        assert tuple(images.shape) == (len(ref_labels), SIZE, SIZE, 3)
        assert images.data_ptr() % 64 == 0  # the pooled buffer itself, not a copy
        assert labels.tolist() == ref_labels
        assert np.array_equal(images.numpy(), ref_images)
    # float32 NCHW through collate, in torch.
    nchw = indexed_loader(
        data, output="torch", collate=ops.collate(8, layout="NCHW", dtype="float32"), **kw
    )
    images, labels = next(iter(nchw))
    assert images.dtype == torch.float32
    assert tuple(images.shape) == (8, 3, SIZE, SIZE)
    expected = ref[0][0].astype(np.float32).transpose(0, 3, 1, 2) / 255
    np.testing.assert_allclose(images.numpy(), expected, atol=1e-6)
    # A device torch knows (the CPU) is accepted too.
    cpu = indexed_loader(data, output="torch", device="cpu", **kw)
    assert next(iter(cpu))[1].tolist() == ref[0][1]


def test_device_cuda_moves_batches_from_pinned_buffers(data: Dataset) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 4}
    ref = collect(indexed_loader(data, **kw))
    loader = indexed_loader(data, output="torch", device="cuda:0", **kw)
    got = list(loader)
    assert len(got) == len(ref)
    for (images, labels), (ref_images, ref_labels) in zip(got, ref, strict=True):
        assert images.device.type == "cuda"
        assert labels.device.type == "cuda"
        assert labels.tolist() == ref_labels
        assert np.array_equal(images.cpu().numpy(), ref_images)
    # With a device, the batch buffers are page-locked (the copy runs asynchronously).
    assert loader.stats()["buffers"]["pinned"] > 0


JAX_SCRIPT = """
import hashlib, json, sys
import numpy as np
import jax
from ferrofeed import DataLoader, ImageFiles, ops

paths = json.loads(sys.argv[1])
files = ImageFiles(paths, labels=list(range(len(paths))))
kw = dict(batch_size=8, shuffle=True, seed=4, num_threads=2, transform=ops.decode_image(size=32))
out = []
ref = list(DataLoader(files, **kw))
for (images, labels), (ri, rl) in zip(DataLoader(files, output="jax", **kw), ref, strict=True):
    out.append({
        "jax": isinstance(images, jax.Array) and isinstance(labels, jax.Array),
        "dtype": str(images.dtype),
        "label_dtype": str(labels.dtype),
        "shape": list(images.shape),
        "labels": np.asarray(labels).tolist(),
        "ref_labels": rl.tolist(),
        "equal": bool(np.array_equal(np.asarray(images), ri)),
    })
folder = DataLoader(sys.argv[2], batch_size=8, num_threads=2, output="jax")
images, labels = next(iter(folder))
out.append({"folder_shape": list(images.shape), "folder_jax": isinstance(images, jax.Array)})
print(json.dumps(out))
"""


@pytest.mark.timeout(180)
def test_jax_output_in_a_subprocess(data: Dataset, run_python: RunPython) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    proc = run_python(JAX_SCRIPT, args=[json.dumps(data.paths), str(data.root)], timeout=150)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    *batches, folder = out
    assert len(batches) == 6
    for b in batches:
        assert b["jax"]
        assert b["dtype"] == "uint8"
        assert b["label_dtype"] in ("int32", "int64")  # int32 unless jax_enable_x64
        assert b["shape"] == [len(b["ref_labels"]), SIZE, SIZE, 3]
        assert b["labels"] == b["ref_labels"]
        assert b["equal"]
    assert sorted(i for b in batches for i in b["labels"]) == list(range(N_IMAGES))
    assert folder == {"folder_shape": [8, 224, 224, 3], "folder_jax": True}


# --------------------------------------------------------------------------------------
# collate: layout, dtype, normalization; construction errors


def test_collate_layout_dtype_and_normalize_match_numpy(data: Dataset) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 6}
    u8 = collect(indexed_loader(data, **kw))

    def with_collate(**ckw: Any) -> list[tuple[np.ndarray, list[int]]]:
        return collect(indexed_loader(data, collate=ops.collate(8, **ckw), **kw))

    normalized = with_collate(layout="NCHW", dtype="float32", normalize=(MEAN, STD))
    float_nhwc = with_collate(dtype="float32")
    u8_nchw = with_collate(layout="NCHW")
    u8_explicit = with_collate()
    assert len(normalized) == len(u8) == 6
    mean = np.array(MEAN, np.float32)
    std = np.array(STD, np.float32)
    for (raw, labels), (f, fl), (g, gl), (c, cl), (e, el) in zip(
        u8, normalized, float_nhwc, u8_nchw, u8_explicit, strict=True
    ):
        assert labels == fl == gl == cl == el
        assert f.dtype == np.float32
        assert f.shape == (len(labels), 3, SIZE, SIZE)
        expected = ((raw.astype(np.float32) / 255 - mean) / std).transpose(0, 3, 1, 2)
        np.testing.assert_allclose(f, expected, atol=1e-5, rtol=0)
        assert g.dtype == np.float32
        assert g.shape == raw.shape
        np.testing.assert_allclose(g, raw.astype(np.float32) / 255, atol=1e-6, rtol=0)
        assert c.dtype == np.uint8
        assert np.array_equal(c, raw.transpose(0, 3, 1, 2))
        assert np.array_equal(e, raw)
    # Straight into an aligned, pooled float32 buffer (no copy on the way out).
    images, _ = next(
        iter(indexed_loader(data, collate=ops.collate(8, dtype="float32", layout="NCHW"), **kw))
    )
    assert images.dtype == np.float32
    assert images.ctypes.data % 64 == 0


def test_construction_errors(data: Dataset) -> None:
    files = data.indexed()
    with pytest.raises(ValueError, match="batch size"):
        DataLoader(files, batch_size=4, collate=ops.collate(5))
    # A pipeline's collate sizes its own buffers; a DataLoader has its own: refused, not
    # ignored. The defaults, given or not, are what a DataLoader takes.
    for kw, shown in (
        ({"max_batches": 4}, r"max_batches=4, timeout=60\.0"),
        ({"timeout": None}, "max_batches=16, timeout=None"),
        ({"timeout": 5.0}, r"timeout=5\.0"),
    ):
        with pytest.raises(ValueError, match=shown) as info:
            DataLoader(files, batch_size=4, collate=ops.collate(**kw))  # type: ignore[arg-type]
        assert "leave them out" in str(info.value)
    DataLoader(files, batch_size=4, collate=ops.collate(max_batches=16, timeout=60.0))
    with pytest.raises(TypeError, match="Python collate"):
        DataLoader(files, batch_size=4, collate=default_collate)
    with pytest.raises(TypeError, match="Python collate"):
        DataLoader(files, batch_size=4, transform=ops.decode_image(size=8), collate=list)
    with pytest.raises(TypeError):  # a native op that does not group
        DataLoader(files, batch_size=4, collate=ops.decode_image(size=8))
    with pytest.raises(ValueError, match="size="):
        ops.decode_image(crop="random")  # refused by the op itself
    for transform in (ops.decode_image(), ops.decode_image(resize_shorter=40)):
        with pytest.raises(ValueError, match="size= or crop="):
            DataLoader(files, batch_size=4, transform=transform)
    with pytest.raises(TypeError, match="decode_image"):
        DataLoader(files, batch_size=4, transform=ops.read_file())
    with pytest.raises(TypeError, match="int"):
        DataLoader(list(range(8)), batch_size=4, transform=ops.decode_image(size=8))
    with pytest.raises(TypeError):
        DataLoader([b"\xff\xd8"] * 4, batch_size=2, transform=ops.decode_image(size=8))
    with pytest.raises(TypeError, match="native image chain"):
        DataLoader(list(range(8)), batch_size=4, collate=ops.collate(4))
    # What is fine: a fixed size by crop alone, or size with a random crop.
    DataLoader(files, batch_size=4, transform=ops.decode_image(crop=24))
    DataLoader(files, batch_size=4, transform=ops.decode_image(size=16, crop="random"))
    DataLoader(files, batch_size=4, collate=ops.collate(4, layout="NCHW"))
    empty = DataLoader(ImageFiles([]), batch_size=4, transform=ops.decode_image(size=8))
    assert len(empty) == 0
    assert list(empty) == []


# --------------------------------------------------------------------------------------
# plain sequences of paths


def test_sequence_of_path_label_pairs(data: Dataset) -> None:
    pairs = [(p, 100 + i) for i, p in enumerate(data.paths)]
    loader = DataLoader(
        pairs, batch_size=7, shuffle=True, seed=3, transform=ops.decode_image(size=SIZE)
    )
    assert loader.native
    order = map_order(N_IMAGES, batch_size=7, shuffle=True, seed=3)
    got = collect(loader)
    assert [labels for _, labels in got] == [[100 + i for i in b] for b in order]
    for (images, _), indices in zip(got, order, strict=True):
        assert np.array_equal(images, data.refs[indices])


def test_sequence_of_pathlib_paths_gives_images_only(data: Dataset) -> None:
    paths = [Path(p) for p in data.paths]
    loader = DataLoader(
        paths, batch_size=10, shuffle=True, seed=3, transform=ops.decode_image(size=SIZE)
    )
    order = map_order(N_IMAGES, batch_size=10, shuffle=True, seed=3)
    batches = list(loader)
    assert len(batches) == len(order) == 5
    for images, indices in zip(batches, order, strict=True):
        assert isinstance(images, np.ndarray), "no labels: the images alone"
        assert images.shape == (len(indices), SIZE, SIZE, 3)
        assert np.array_equal(images, data.refs[indices])
    # ImageFiles without labels: the same.
    unlabelled = DataLoader(
        ImageFiles(data.paths), batch_size=10, transform=ops.decode_image(size=SIZE)
    )
    first = next(iter(unlabelled))
    assert isinstance(first, np.ndarray)
    assert np.array_equal(first, data.refs[:10])


# --------------------------------------------------------------------------------------
# bad files


@pytest.fixture(scope="module")
def broken(data: Dataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("broken")
    good = Path(data.paths[0]).read_bytes()
    files = {
        "truncated": d / "truncated.jpg",
        "text": d / "text.jpg",
        "missing": d / "missing.jpg",
    }
    files["truncated"].write_bytes(good[:200])
    files["text"].write_text("this is not a JPEG")
    for k in range(4):
        files[f"bad{k}"] = d / f"bad{k}.jpg"
        files[f"bad{k}"].write_bytes(good[: 100 + 10 * k])
    return {k: str(v) for k, v in files.items()}


def test_corrupt_file_raises_pipeline_error_naming_it(
    data: Dataset, broken: dict[str, str]
) -> None:
    paths = [*data.paths[:6], broken["truncated"], *data.paths[6:12]]
    loader = DataLoader(
        ImageFiles(paths, labels=list(range(len(paths)))),
        batch_size=3,
        transform=ops.decode_image(size=SIZE),
        num_threads=2,
    )
    seen: list[list[int]] = []

    def consume() -> None:
        seen.extend(labels.tolist() for _, labels in loader)

    with pytest.raises(ImageDecodeError) as info:
        consume()
    assert seen == [[0, 1, 2], [3, 4, 5]]
    inner = info.value
    assert not isinstance(inner, PipelineError)
    assert isinstance(inner, ValueError)
    assert "truncated.jpg" in str(inner)
    # The failing batch is not counted: a resume retries it.
    assert loader.state_dict()["batches_done"] == 2


def test_missing_file_raises_image_read_error(data: Dataset, broken: dict[str, str]) -> None:
    paths = [*data.paths[:3], broken["missing"]]
    loader = DataLoader(paths, batch_size=4, transform=ops.decode_image(size=SIZE))
    with pytest.raises(ImageReadError) as info:
        list(loader)
    inner = info.value
    assert isinstance(inner, OSError)
    assert inner.errno == 2
    assert inner.filename == broken["missing"]
    assert "missing.jpg" in str(inner)


def test_skip_leaves_bad_files_out_and_reports_their_dataset_index(
    data: Dataset, broken: dict[str, str]
) -> None:
    paths = list(data.paths[:20])
    bad = {5: broken["truncated"], 11: broken["missing"], 12: broken["text"]}
    for i, p in bad.items():
        paths[i] = p
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 17}
    loader = DataLoader(
        ImageFiles(paths, labels=list(range(20))),
        transform=ops.decode_image(size=SIZE),
        on_error="skip",
        num_threads=2,
        **kw,
    )
    order = map_order(20, **kw)
    got = collect(loader)
    assert len(got) == len(order) == 5
    for (images, labels), indices in zip(got, order, strict=True):
        kept = [i for i in indices if i not in bad]
        assert labels == kept
        assert images.shape == (len(kept), SIZE, SIZE, 3)
        assert np.array_equal(images, data.refs[kept])
    assert sum(len(labels) for _, labels in got) == 17
    stats = loader.stats()
    skipped = dict(stats["skipped"])
    assert stats["skipped_count"] == 3
    assert sorted(skipped) == [5, 11, 12]
    # Listed in the order they were met.
    met = [i for b in order for i in b if i in bad]
    assert [i for i, _ in stats["skipped"]] == met
    assert skipped[5].startswith("ImageDecodeError: ")
    assert "truncated.jpg" in skipped[5]
    assert skipped[11].startswith("ImageReadError: ")
    assert "missing.jpg" in skipped[11]
    assert skipped[12].startswith("ImageDecodeError: ")
    assert "text.jpg" in skipped[12]


def test_skip_a_batch_of_only_bad_files_is_not_yielded_but_counted(
    data: Dataset, broken: dict[str, str]
) -> None:
    paths = [*data.paths[:4], *(broken[f"bad{k}"] for k in range(4)), *data.paths[4:8]]

    def make() -> DataLoader:
        return DataLoader(
            ImageFiles(paths, labels=list(range(12))),
            batch_size=4,
            transform=ops.decode_image(size=SIZE),
            on_error="skip",
            num_threads=2,
        )

    loader = make()
    assert len(loader) == 3
    got = collect(loader)
    assert [labels for _, labels in got] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert np.array_equal(got[1][0], data.refs[4:8])
    assert [i for i, _ in loader.stats()["skipped"]] == [4, 5, 6, 7]
    assert loader.epoch == 1

    # Break after the first batch: the state says 1; resuming yields only the last one.
    loader = make()
    for _ in loader:
        break
    state = loader.state_dict()
    assert state["batches_done"] == 1
    resumed = make()
    resumed.load_state_dict(state)
    assert [labels for _, labels in collect(resumed)] == [[8, 9, 10, 11]]
    assert resumed.epoch == 1

    # Break after the batch that follows the empty one: 3 positions done, epoch over.
    loader = make()
    for i, _ in enumerate(loader):
        if i == 1:
            assert loader.state_dict()["batches_done"] == 3
            break
    else:
        pytest.fail("fewer than 2 batches")
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert collect(resumed) == []
    assert resumed.epoch == 1


# --------------------------------------------------------------------------------------
# progress


def test_progress_bar(data: Dataset, capsys: pytest.CaptureFixture[str]) -> None:
    loader = indexed_loader(data, batch_size=10, progress=True)
    assert len(collect(loader)) == 5
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "5/5" in captured.err
    assert "epoch 0" in captured.err or "batch" in captured.err


def test_progress_counts_positions_of_skipped_batches(
    data: Dataset, broken: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [*data.paths[:2], broken["bad0"], broken["bad1"], *data.paths[2:4]]
    loader = DataLoader(
        paths, batch_size=2, transform=ops.decode_image(size=SIZE), on_error="skip", progress=True
    )
    assert len(list(loader)) == 2
    assert "3/3" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# threads


@pytest.mark.timeout(60)
def test_no_threads_left_after_an_epoch_a_break_or_an_error(
    data: Dataset, broken: dict[str, str]
) -> None:
    loader = indexed_loader(data, batch_size=4, shuffle=True, num_threads=4, prefetch=2)
    collect(loader)  # warm up (lazy one-time threads, if any, start here)
    gc.collect()
    time.sleep(0.05)
    base = thread_counts()

    collect(loader)
    assert settle_threads(base) == base, "threads left after a full epoch"

    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert settle_threads(base) == base, "threads left after a break"

    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert settle_threads(base) == base, "threads left by a dropped iterator"

    bad = DataLoader(
        [*data.paths[:8], broken["truncated"], *data.paths[8:16]],
        batch_size=2,
        transform=ops.decode_image(size=SIZE),
        num_threads=4,
    )
    with pytest.raises(ImageDecodeError):
        list(bad)
    assert settle_threads(base) == base, "threads left after an error"


def test_kept_batches_are_not_overwritten_by_later_ones(data: Dataset) -> None:
    loader = indexed_loader(data, batch_size=4, prefetch=1)
    kept = list(loader)  # every batch kept: the pool must not hand its buffer out again
    again = list(loader)  # a second epoch while the first one's batches are alive
    for (images, labels), (images2, labels2) in zip(kept, again, strict=True):
        assert np.array_equal(images, data.refs[labels.tolist()])
        assert np.array_equal(images2, data.refs[labels2.tolist()])
        assert images.ctypes.data != images2.ctypes.data
    assert ferrofeed.ImageFolder is ImageFolder
    stages = loader.stats()["pipeline"]
    assert stages["decode_batch"]["items_out"] == len(loader) == 12
    assert loader.stats()["buffers"]["in_use"] >= 24  # images and labels, all kept
    del kept, again, images, labels, images2, labels2
    gc.collect()
    assert loader.stats()["buffers"]["in_use"] == 0, "batch buffers not given back"


def test_collate_without_batch_size_takes_the_loaders(data: Dataset) -> None:
    loader = DataLoader(
        data.paths[:10],
        4,
        transform=ops.decode_image(size=SIZE),
        collate=ops.collate(layout="NCHW"),  # the batch size is said once
    )
    shapes = [images.shape for images in loader]
    assert shapes == [(4, 3, SIZE, SIZE), (4, 3, SIZE, SIZE), (2, 3, SIZE, SIZE)]
    with pytest.raises(ValueError, match="same batch size"):
        DataLoader(data.paths, 4, transform=ops.decode_image(size=SIZE), collate=ops.collate(8))


def test_collate_without_batch_size_is_refused_by_a_pipeline() -> None:
    builder = PipelineBuilder().add_source([]).pipe(ops.collate()).add_sink()
    with pytest.raises(ValueError, match="without a batch size"):
        builder.build()


def test_collate_pool_timeout_is_settable() -> None:
    assert ops.collate(4, timeout=None).group_size == 4
    with pytest.raises(ValueError, match="timeout"):
        ops.collate(4, timeout=0)


def test_native_batches_in_flight() -> None:
    from ferrofeed._executors import _batches_in_flight

    # (num_threads, batch size) -> batches decoded at once: about 8 images queued or
    # decoding per thread, plus the batch being handed over; at least 2.
    cases = {
        (1, 2): 5,  # 1 thread, batches of 2: 8 images queued, and one batch handed over
        (1, 32): 2,
        (2, 4): 5,
        (2, 32): 2,
        (16, 32): 5,  # 2 images a thread a batch, as batches of 2 on 1 thread
        (16, 256): 2,
        (64, 32): 17,
        (3, 1): 25,
        (8, 0): 65,  # a batch size of 0 counts as 1
    }
    for (threads, batch), want in cases.items():
        assert _batches_in_flight(threads, batch) == want, (threads, batch)
    # The depth never shrinks as threads grow, at any batch size.
    for batch in (1, 2, 4, 32, 256):
        depths = [_batches_in_flight(t, batch) for t in (1, 2, 4, 8, 16, 32, 64)]
        assert depths == sorted(depths), (batch, depths)
        assert all(
            d * batch >= 8 * t for d, t in zip(depths, (1, 2, 4, 8, 16, 32, 64), strict=True)
        )
    assert ferrofeed._core._cpu_pool_size() >= 1


def test_batches_identical_for_1_2_and_16_threads_and_depth_grows_with_threads(
    data: Dataset,
) -> None:
    """Random crops and flips, small and larger batches: the same batches on 1, 2 and 16
    threads, while the batches decoding at once (the in-flight depth) grow with the
    threads and never pass their bound."""

    def loader(num_threads: int, batch_size: int) -> DataLoader:
        return DataLoader(
            ImageFolder(data.root),
            batch_size=batch_size,
            shuffle=True,
            seed=11,
            num_threads=num_threads,
            transform=ops.decode_image(size=SIZE, crop="random", flip="random"),
        )

    for batch_size in (2, 8):
        runs, depth = {}, {}
        for threads in (1, 2, 16):
            dl = loader(threads, batch_size)
            runs[threads] = collect(dl)
            decode = dl.stats()["pools"]["decode"]
            assert decode["threads"] == threads
            assert decode["batches"] == -(-N_IMAGES // batch_size)
            assert decode["in_flight"] == 0  # the pass is over
            assert 1 <= decode["max_in_flight"] <= decode["batches_in_flight"]
            assert decode["images_in_flight"] == decode["batches_in_flight"] * batch_size
            depth[threads] = decode
        assert same_batches(runs[2], runs[1]), f"batch {batch_size}, 2 threads"
        assert same_batches(runs[16], runs[1]), f"batch {batch_size}, 16 threads"
        bounds = [depth[t]["batches_in_flight"] for t in (1, 2, 16)]
        assert bounds[0] <= bounds[1] < bounds[2], bounds
        # More than one batch decodes at once: the threads cross batch boundaries.
        assert depth[16]["max_in_flight"] >= 2, depth[16]
        assert sorted(i for _, labels in runs[1] for i in labels) == sorted(data.labels)


def test_decode_pool_stats_count_busy_and_idle_time_of_the_pass(data: Dataset) -> None:
    dl = indexed_loader(data, batch_size=4, num_threads=3)
    assert dl.stats()["pools"]["decode"]["batches"] == 0  # no pass yet
    for _ in dl:
        time.sleep(0.002)  # a slow consumer: the threads wait for it
    first = dl.stats()["pools"]["decode"]
    assert first["threads"] == 3
    assert first["busy_s"] > 0
    assert first["idle_s"] > 0
    assert first["wall_s"] * 3 == pytest.approx(first["busy_s"] + first["idle_s"], rel=1e-6)
    assert 0 < first["busy"] < 1
    assert first["busy"] == pytest.approx(first["busy_s"] / (3 * first["wall_s"]), rel=1e-6)
    # The pass has ended: its figures no longer grow.
    time.sleep(0.02)
    assert dl.stats()["pools"]["decode"] == first
    # A new pass counts from its own start.
    it = iter(dl)
    next(it)
    second = dl.stats()["pools"]["decode"]
    assert second["batches"] < first["batches"]
    assert second["wall_s"] < first["wall_s"] + 0.02
    del it
    # Other executors have no decode pool.
    assert DataLoader(list(range(8)), batch_size=4).stats()["pools"] == {}
