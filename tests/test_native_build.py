"""The two builds of the native extension in the x86_64 wheel, and which one is loaded.

The wheel holds ``_core.abi3.so`` (any x86_64 CPU) and ``_core_x86_64_v3.abi3.so`` (AVX2,
FMA, BMI2, ...); ``ferrofeed._native`` picks one at import. The choice is tested as a pure
function here; the two builds are then run side by side, each in a process of its own, and
must give the same bytes for the same images and transforms. Those tests skip where the
installed ferrofeed has one build only (a build from source) or the CPU cannot run the
second.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Any

import ferrofeed
import pytest
from conftest import last_json_line, run_python
from ferrofeed import _native

V3_PATH = Path(ferrofeed.__file__).with_name(_native.V3_FILE)
CPU_FLAGS = _native.cpu_flags(_native._read_cpuinfo())
HAS_BOTH = V3_PATH.is_file() and _native.V3_FLAGS <= CPU_FLAGS
needs_both = pytest.mark.skipif(
    not HAS_BOTH,
    reason=f"{_native.V3_FILE} is not installed (a build from source) or this CPU lacks "
    f"{sorted(_native.V3_FLAGS - CPU_FLAGS)}",
)

# A line of /proc/cpuinfo as Linux writes it on an x86-64-v3 CPU (an AMD EPYC's, shortened).
EPYC_FLAGS = (
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
    "clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc "
    "rep_good nopl cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 erms invpcid avx512f"
)


def test_cpu_flags_reads_the_first_flags_line() -> None:
    text = (
        f"processor\t: 0\nvendor_id\t: AuthenticAMD\n{EPYC_FLAGS}\n\nprocessor : 1\nflags : sse2\n"
    )
    flags = _native.cpu_flags(text)
    assert flags >= _native.V3_FLAGS
    assert {"sse2", "avx512f"} <= flags
    # No flags line (e.g. /proc/cpuinfo unreadable, or another architecture's format).
    assert _native.cpu_flags("") == frozenset()
    assert _native.cpu_flags("processor : 0\nFeatures : fp asimd\n") == frozenset()


@pytest.mark.parametrize("missing", sorted(_native.V3_FLAGS))
def test_auto_takes_the_v3_build_only_with_every_flag(missing: str) -> None:
    full = _native.cpu_flags(EPYC_FLAGS)
    assert _native.choose("", "x86_64", full, has_v3=True) == _native.V3
    assert _native.choose("auto", "x86_64", full, has_v3=True) == _native.V3
    # One instruction set short (an Ivy Bridge has AVX but no AVX2, FMA or BMI2; a VM's
    # CPU model may hide any of them): the portable build.
    assert _native.choose("", "x86_64", full - {missing}, has_v3=True) == _native.BASELINE
    with pytest.raises(ImportError, match=f"this CPU lacks .*{missing}"):
        _native.choose("x86-64-v3", "x86_64", full - {missing}, has_v3=True)


def test_choose_falls_back_and_the_override_wins() -> None:
    full = _native.cpu_flags(EPYC_FLAGS)
    # No second build in the package (built from source, or the aarch64 wheel).
    assert _native.choose("", "x86_64", full, has_v3=False) == _native.BASELINE
    assert _native.choose("", "aarch64", frozenset(), has_v3=False) == _native.BASELINE
    assert _native.choose("", "aarch64", full, has_v3=True) == _native.BASELINE
    # FERROFEED_CPU=baseline, in any case and with spaces, whatever the CPU has.
    assert _native.choose(" Baseline ", "x86_64", full, has_v3=True) == _native.BASELINE
    assert _native.choose("X86-64-V3", "x86_64", full, has_v3=True) == _native.V3
    with pytest.raises(ImportError, match="no x86-64-v3 build"):
        _native.choose("x86-64-v3", "x86_64", full, has_v3=False)
    with pytest.raises(ImportError, match="not x86_64"):
        _native.choose("x86-64-v3", "aarch64", full, has_v3=True)
    with pytest.raises(ImportError, match="expected 'auto', 'baseline' or 'x86-64-v3'"):
        _native.choose("avx2", "x86_64", full, has_v3=True)


# Which build a fresh interpreter loads, and from which file.
WHICH = """
import json, ferrofeed
print(json.dumps({"build": ferrofeed.build_info()["native_build"],
                  "file": ferrofeed._core.__file__,
                  "same": __import__("sys").modules["ferrofeed._core"] is ferrofeed._core}))
"""


def _which(env: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = last_json_line(run_python(WHICH, env=env).stdout)
    return result


def test_baseline_override_loads_the_portable_build() -> None:
    got = _which({_native.ENV: "baseline"})
    assert got["build"] == "baseline", got
    assert got["same"], got
    assert Path(got["file"]) == Path(ferrofeed.__file__).with_name("_core.abi3.so"), got


def test_a_bad_override_fails_the_import_with_the_values_it_takes() -> None:
    proc = run_python("import ferrofeed", env={_native.ENV: "fast"}, check=False)
    assert proc.returncode != 0
    assert "ImportError: FERROFEED_CPU='fast': expected 'auto', 'baseline' or 'x86-64-v3'" in (
        proc.stderr
    )


def test_this_process_loaded_what_choose_picks() -> None:
    flags = CPU_FLAGS if V3_PATH.is_file() else frozenset()
    want = _native.choose(
        os.environ.get(_native.ENV, ""), platform.machine(), flags, V3_PATH.is_file()
    )
    assert ferrofeed.build_info()["native_build"] == want
    assert (Path(ferrofeed._core.__file__).name == _native.V3_FILE) == (want == _native.V3)
    assert _native.load_core() == want  # a second call answers from sys.modules


@needs_both
def test_auto_loads_the_v3_build_on_this_cpu() -> None:
    got = _which({_native.ENV: "auto"})
    assert got["build"] == "x86-64-v3", got
    assert got["same"], got
    assert Path(got["file"]) == V3_PATH


needs_v3_cpu = pytest.mark.skipif(
    not _native.V3_FLAGS <= CPU_FLAGS,
    reason=f"this CPU lacks {sorted(_native.V3_FLAGS - CPU_FLAGS)}",
)


@needs_v3_cpu
def test_a_damaged_v3_file_falls_back_to_the_portable_build(tmp_path: Path) -> None:
    # A copy of the installed package whose x86-64-v3 file is not a shared library.
    pkg = Path(ferrofeed.__file__).parent
    copy = tmp_path / "ferrofeed"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__", _native.V3_FILE))
    (copy / _native.V3_FILE).write_bytes(b"not an ELF file\n" * 64)
    env = {"PYTHONPATH": str(tmp_path)}
    proc = run_python(WHICH, env={**env, _native.ENV: "auto"})
    got = last_json_line(proc.stdout)
    assert got["build"] == "baseline", got
    assert Path(got["file"]) == copy / "_core.abi3.so", got
    assert "RuntimeWarning: ferrofeed: cannot load _core_x86_64_v3.abi3.so" in proc.stderr
    assert "using the portable build" in proc.stderr
    # Asked for by name, the damaged build fails the import instead.
    proc = run_python("import ferrofeed", env={**env, _native.ENV: "x86-64-v3"}, check=False)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert _native.V3_FILE in proc.stderr


# Decode the same images through every kind of work the native chain does and print a
# digest of each output; run once per build. The JPEGs are encoded here by Pillow (the same
# in both processes), from scikit-image's photos: baseline 4:2:0 and 4:4:4, progressive,
# grayscale, and a size that is not a multiple of the MCU; PNG and WebP too.
DIGESTS = r"""
import hashlib, io, json, sys
import numpy as np
from PIL import Image
import skimage.data
import ferrofeed
from ferrofeed import io as fio

photos = {n: np.asarray(getattr(skimage.data, n)()) for n in
          ("astronaut", "coffee", "chelsea", "rocket", "retina")}
def enc(arr, fmt, **kw):
    b = io.BytesIO(); Image.fromarray(arr).save(b, fmt, **kw); return b.getvalue()
files = {}
for name, rgb in photos.items():
    files[f"{name}-420"] = enc(rgb, "JPEG", quality=75, subsampling=2)
    files[f"{name}-444"] = enc(rgb, "JPEG", quality=95, subsampling=0)
    files[f"{name}-prog"] = enc(rgb, "JPEG", quality=85, progressive=True)
    files[f"{name}-odd"] = enc(rgb[:333, :451], "JPEG", quality=90)
    files[f"{name}-gray"] = enc(np.asarray(Image.fromarray(rgb).convert("L")), "JPEG", quality=90)
    files[f"{name}-png"] = enc(rgb, "PNG")
    files[f"{name}-webp"] = enc(rgb, "WEBP", quality=90)
names = sorted(files)
data = [files[n] for n in names]
jobs = {
    "training": dict(size=224, crop="random", flip="random", seed=7),
    "training-small": dict(size=(40, 56), crop="random", seed=3),
    "exact": dict(size=224, resize_shorter=256, crop=224),
    "resize": dict(size=(160, 200)),
    "full-decode": dict(size=(96, 128), crop="random", seed=5, crop_decode=False,
                        dct_scaling=False),
    "gray": dict(size=128, mode="L", resize_shorter=144, crop=128),
}
out = {"build": ferrofeed.build_info()["native_build"]}
for job, kw in jobs.items():
    batch = np.from_dlpack(fio.load_images(data, threads=2, **kw))
    out[job] = [hashlib.sha256(batch[i].tobytes()).hexdigest() for i in range(len(names))]
    out[job + "/mean"] = float(batch.mean())
# The DataLoader's batch op: float32, NCHW, normalized per channel. Its crops are seeded by
# the file names, so both runs write the files into the same folder (argv[1]).
import os
paths = []
for n in names:
    kind = n.rsplit("-", 1)[1]
    paths.append(os.path.join(sys.argv[1], n + {"png": ".png", "webp": ".webp"}.get(kind, ".jpg")))
    with open(paths[-1], "wb") as f:
        f.write(files[n])
dl = ferrofeed.DataLoader(
    paths, 7, shuffle=True, seed=11, num_threads=2,
    transform=ferrofeed.ops.decode_image(size=64, crop="random", flip="random"),
    collate=ferrofeed.ops.collate(layout="NCHW", dtype="float32",
                                  normalize=([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
)
out["loader-float32"] = [hashlib.sha256(np.from_dlpack(x).tobytes()).hexdigest() for x in dl]
for n in ("astronaut-420", "coffee-prog", "rocket-odd"):
    img = np.from_dlpack(fio.decode_image(files[n]))
    out["decode/" + n] = hashlib.sha256(img.tobytes()).hexdigest()
out["names"] = names
print(json.dumps(out))
"""


@needs_both
def test_both_builds_give_the_same_bytes(tmp_path: Path) -> None:
    pytest.importorskip("skimage")
    pytest.importorskip("PIL")
    runs = {
        build: last_json_line(
            run_python(DIGESTS, args=[str(tmp_path)], env={_native.ENV: build}, timeout=240).stdout
        )
        for build in ("baseline", "x86-64-v3")
    }
    base, v3 = runs["baseline"], runs["x86-64-v3"]
    assert (base["build"], v3["build"]) == ("baseline", "x86-64-v3")
    assert base["names"] == v3["names"]
    assert len(base["names"]) == 35
    for key in base:
        if key in ("build", "names"):
            continue
        if isinstance(base[key], list) and len(base[key]) == len(base["names"]):
            differ = [
                n for n, a, b in zip(base["names"], base[key], v3[key], strict=True) if a != b
            ]
            assert not differ, f"{key}: the builds decode these differently: {differ}"
        else:
            assert base[key] == v3[key], key
    assert len(base["loader-float32"]) == 5
    # Not a vacuous comparison: the jobs give different images.
    assert base["training"] != base["exact"]
    assert len(set(base["training"])) == 35
