"""One image spec and one batch layout: every entry point checks its keywords the same way."""

from __future__ import annotations

import copy
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ferrofeed.io as fio
import numpy as np
import pytest
from ferrofeed import PipelineBuilder, ops
from ferrofeed.ops import BatchLayout, ImageSpec
from ferrofeed.samples import synthetic_jpeg

# A 1x1 red PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d494844520000000100000001080200000090"
    "7753de0000000c49444154789c63f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
)


def _image_entry_points() -> dict[str, Callable[..., object]]:
    """Every way to give the image keywords, by name."""

    def load_images(**kw: Any) -> object:
        # load_images needs a size: give one unless the case is about it.
        return fio.load_images([PNG], **{"size": 4, **kw})

    return {
        "ImageSpec": lambda **kw: ImageSpec(**kw),
        "io.decode_image": lambda **kw: fio.decode_image(PNG, **kw),
        "io.load_images": load_images,
        "ops.decode_image": lambda **kw: ops.decode_image(**kw),
    }


POSITIVE = "{} must be positive, not {}"
CROP = 'crop is an int or (height, width) for a center crop, or "random", not {}'
FLIP = 'flip is True, False or "random" (a random horizontal flip), not {}'
SIZE_TYPE = "size is an int or a (height, width) pair of ints, not {}"
SCALE = "scale is (min, max) with 0 < min <= max <= 1, not {}"
RATIO = "ratio is (min, max) with 0 < min <= max, not {}"

BAD_IMAGE_OPTIONS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"size": 0}, ValueError, POSITIVE.format("size", 0)),
    ({"size": (3, 0)}, ValueError, POSITIVE.format("size", "(3, 0)")),
    ({"size": -2}, ValueError, POSITIVE.format("size", -2)),
    ({"size": (4, -1)}, ValueError, POSITIVE.format("size", "(4, -1)")),
    ({"size": "big"}, TypeError, SIZE_TYPE.format("'big'")),
    ({"size": (1, 2, 3)}, TypeError, SIZE_TYPE.format("(1, 2, 3)")),
    ({"size": 2.5}, TypeError, SIZE_TYPE.format("2.5")),
    ({"resize_shorter": 0}, ValueError, POSITIVE.format("resize_shorter", 0)),
    ({"crop": 0}, ValueError, POSITIVE.format("crop", 0)),
    ({"crop": (0, 5)}, ValueError, POSITIVE.format("crop", "(0, 5)")),
    ({"crop": -3}, ValueError, POSITIVE.format("crop", -3)),
    ({"crop": "center"}, ValueError, CROP.format("'center'")),
    ({"crop": 1.5}, ValueError, CROP.format("1.5")),
    ({"crop": (1, 2, 3)}, ValueError, CROP.format("(1, 2, 3)")),
    (
        {"size": None, "crop": "random"},
        ValueError,
        'crop="random" (a random resized crop) needs an output size=',
    ),
    ({"flip": "yes"}, ValueError, FLIP.format("'yes'")),
    ({"flip": 2}, ValueError, FLIP.format("2")),
    ({"flip": 0.5}, ValueError, FLIP.format("0.5")),
    ({"scale": (0.5, 0.25)}, ValueError, SCALE.format("(0.5, 0.25)")),
    ({"scale": (0.0, 1.0)}, ValueError, SCALE.format("(0.0, 1.0)")),
    ({"scale": (0.5, 2.0)}, ValueError, SCALE.format("(0.5, 2.0)")),
    ({"ratio": (2.0, 1.0)}, ValueError, RATIO.format("(2.0, 1.0)")),
    ({"ratio": (-1.0, 1.0)}, ValueError, RATIO.format("(-1.0, 1.0)")),
    ({"ratio": (float("nan"), 1.0)}, ValueError, RATIO.format("(NaN, 1.0)")),
    ({"mode": "CMYK"}, ValueError, 'mode is "RGB" or "L" (grayscale), not "CMYK"'),
]


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    BAD_IMAGE_OPTIONS,
    ids=[",".join(f"{k}={v!r}" for k, v in c[0].items()) for c in BAD_IMAGE_OPTIONS],
)
def test_each_bad_image_option_has_one_error_whichever_entry_point(
    kwargs: dict[str, Any], exc: type[Exception], message: str
) -> None:
    for name, entry in _image_entry_points().items():
        with pytest.raises(exc) as info:
            entry(**kwargs)
        assert type(info.value) is exc, (name, info.value)
        assert str(info.value) == message, name


def test_bounds_that_touch_and_every_valid_option_are_accepted() -> None:
    for kwargs in (
        {"size": 4, "crop": "random", "scale": (1.0, 1.0), "ratio": (1.0, 1.0)},
        {"size": (3, 5), "resize_shorter": 7, "crop": (2, 3), "flip": True},
        {"size": 4, "flip": "random", "mode": "gray"},
        {"size": np.int64(4), "flip": np.True_, "dct_scaling": False, "crop_decode": False},
    ):
        for name, entry in _image_entry_points().items():
            entry(**kwargs)  # no error
            assert name


BAD_LAYOUT_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"layout": "HWC"}, 'layout is "NHWC" or "NCHW", not "HWC"'),
    ({"dtype": "float64"}, 'dtype is "uint8" or "float32", not "float64"'),
    ({"normalize": ([0.5], [0.5])}, 'normalize= needs dtype="float32"'),
    (
        {"dtype": "float32", "normalize": ([0.5, 0.5], [1.0])},
        "normalize mean has 1 or 3 values, not 2",
    ),
    ({"dtype": "float32", "normalize": ([0.5], [])}, "normalize std has 1 or 3 values, not 0"),
    (
        {"dtype": "float32", "normalize": ([0.5], [1.0, 0.0, 1.0])},
        "normalize std must be finite and not 0, not [1.0, 0.0, 1.0]",
    ),
    (
        {"dtype": "float32", "normalize": ([float("inf")], [1.0])},
        "normalize mean must be finite, not [inf]",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_LAYOUT_OPTIONS)
def test_each_bad_layout_option_has_one_error_whichever_entry_point(
    kwargs: dict[str, Any], message: str
) -> None:
    for entry in (lambda **kw: BatchLayout(**kw), lambda **kw: ops.collate(4, **kw)):
        with pytest.raises(ValueError, match=re.escape(message) + "$"):
            entry(**kwargs)


def test_image_spec_fields_equality_hash_and_repr() -> None:
    spec = ImageSpec(size=224, crop="random", flip="random")
    assert repr(spec) == "ImageSpec(size=(224, 224), crop='random', flip='random')"
    assert (spec.size, spec.crop, spec.flip) == ((224, 224), "random", "random")
    assert (spec.scale, spec.ratio) == ((0.08, 1.0), (0.75, 4 / 3))
    assert (spec.mode, spec.resize_shorter, spec.dct_scaling, spec.crop_decode) == (
        "RGB",
        None,
        True,
        True,
    )
    assert repr(ImageSpec()) == "ImageSpec()"
    assert (ImageSpec().size, ImageSpec().crop, ImageSpec().flip) == (None, None, False)
    full = ImageSpec(
        size=(8, 6),
        resize_shorter=20,
        crop=10,
        flip=True,
        scale=(0.5, 0.9),
        ratio=(0.5, 2.0),
        mode="L",
        dct_scaling=False,
        crop_decode=False,
    )
    assert repr(full) == (
        "ImageSpec(size=(8, 6), resize_shorter=20, crop=(10, 10), flip=True, "
        "scale=(0.5, 0.9), ratio=(0.5, 2.0), mode='L', dct_scaling=False, crop_decode=False)"
    )
    # The same spec however it is written; a different one otherwise.
    assert ImageSpec(size=8) == ImageSpec(size=(8, 8))
    assert ImageSpec(mode="gray") == ImageSpec(mode="L")
    assert ImageSpec(flip=None) == ImageSpec(flip=False) == ImageSpec()
    assert ImageSpec(size=8) != ImageSpec(size=9)
    assert ImageSpec(crop=8) != ImageSpec(size=8)
    assert ImageSpec() != "ImageSpec()"
    assert hash(ImageSpec(size=8)) == hash(ImageSpec(size=(8, 8)))
    assert len({ImageSpec(size=8), ImageSpec(size=(8, 8)), ImageSpec(size=9)}) == 2
    # The repr rebuilds the spec, and so do pickle and copy.
    for s in (spec, full, ImageSpec(), ImageSpec(size=3, crop=(2, 1), flip="random")):
        assert eval(repr(s), {"ImageSpec": ImageSpec}) == s
        assert pickle.loads(pickle.dumps(s)) == s
        assert copy.deepcopy(s) == s
    with pytest.raises(AttributeError):
        spec.size = (1, 1)  # type: ignore[misc]


def test_batch_layout_fields_equality_hash_and_repr() -> None:
    default = BatchLayout()
    assert (default.layout, default.dtype, default.normalize) == ("NHWC", "uint8", None)
    assert repr(default) == "BatchLayout()"
    imagenet = BatchLayout(
        layout="NCHW", dtype="float32", normalize=([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    )
    # The values read back as written (they are kept as float32).
    assert imagenet.normalize == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert repr(imagenet) == (
        "BatchLayout(layout='NCHW', dtype='float32', "
        "normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))"
    )
    one = BatchLayout(dtype="float32", normalize=([0.5], [0.25]))
    assert one == BatchLayout(dtype="float32", normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    assert hash(one) == hash(BatchLayout(dtype="float32", normalize=([0.5] * 3, [0.25] * 3)))
    assert one != BatchLayout(dtype="float32")
    assert BatchLayout(layout="NCHW") != default
    assert default != "NHWC"
    for layout in (default, imagenet, one):
        assert eval(repr(layout), {"BatchLayout": BatchLayout}) == layout
        assert pickle.loads(pickle.dumps(layout)) == layout
        assert copy.copy(layout) == layout
    with pytest.raises(AttributeError):
        default.dtype = "float32"  # type: ignore[misc]


def test_decode_op_exposes_its_spec_and_explicit_seed() -> None:
    op = ops.decode_image(size=8, crop="random", flip="random", seed=5)
    assert op.spec == ImageSpec(size=8, crop="random", flip="random")
    assert op.seed == 5
    assert ops.decode_image(size=8, seed=0).seed == 0
    unseeded = ops.decode_image(resize_shorter=16, crop=8, mode="gray")
    assert unseeded.seed is None
    assert unseeded.spec == ImageSpec(resize_shorter=16, crop=8, mode="L")
    assert (unseeded.layout, unseeded.group_size, unseeded.drop_last) == (None, None, None)
    with pytest.raises(AttributeError):
        op.seed = 6  # type: ignore[misc]
    with pytest.raises(AttributeError):
        op.spec = ImageSpec()  # type: ignore[misc]


def test_collate_op_exposes_its_layout_group_size_and_drop_last() -> None:
    op = ops.collate(4, drop_last=True, layout="NCHW", dtype="float32", normalize=([0.5], [0.5]))
    assert (op.group_size, op.drop_last) == (4, True)
    assert op.layout == BatchLayout(layout="NCHW", dtype="float32", normalize=([0.5], [0.5]))
    assert (op.spec, op.seed) == (None, None)
    loader_sized = ops.collate()
    assert (loader_sized.group_size, loader_sized.drop_last) == (0, False)
    assert loader_sized.layout == BatchLayout()
    assert ops.collate(7, max_batches=2, timeout=None).group_size == 7
    with pytest.raises(AttributeError):
        op.drop_last = False  # type: ignore[misc]


def test_ops_without_specs_say_so() -> None:
    for op in (ops.read_file(), ops.identity()):
        assert (op.spec, op.seed, op.layout, op.group_size, op.drop_last) == (
            None,
            None,
            None,
            None,
            None,
        )


def test_the_spec_is_what_decodes(tmp_path: Path) -> None:
    """io.decode_image, io.load_images and a pipeline's ops.decode_image give one image."""
    path = tmp_path / "a.jpg"
    path.write_bytes(synthetic_jpeg(40, 30, seed=3))
    kwargs: dict[str, Any] = {"size": (12, 10), "resize_shorter": 20, "crop": 16, "flip": True}
    one = fio.decode_image(path, **kwargs).numpy()
    batch = fio.load_images([path], **kwargs).numpy()
    (native,) = list(
        PipelineBuilder()
        .add_source([str(path)])
        .pipe(ops.decode_image(**kwargs))
        .pipe(ops.collate(1))
        .add_sink()
        .build()
    )
    assert one.shape == (12, 10, 3)
    assert np.array_equal(batch[0], one)
    assert np.array_equal(np.from_dlpack(native)[0], one)


def test_the_examples_of_ops_and_of_the_spec_stubs_run() -> None:
    import ast
    import doctest

    import ferrofeed._core

    res = doctest.testmod(ops)
    assert res.failed == 0
    assert res.attempted > 0
    # The classes are documented in the stub (the compiled module's docstrings are the
    # Rust doc comments): run the stub's examples.
    stub = Path(ferrofeed._core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    runner = doctest.DocTestRunner()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("ImageSpec", "BatchLayout"):
            doc = ast.get_docstring(node)
            assert doc is not None
            test = doctest.DocTestParser().get_doctest(doc, {}, node.name, str(stub), 0)
            assert test.examples, node.name
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
