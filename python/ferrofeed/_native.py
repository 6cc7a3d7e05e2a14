"""Which build of the native extension (``ferrofeed._core``) this process loads.

The x86_64 wheel holds two builds of the same Rust and C code: ``_core.abi3.so`` for any
x86_64 CPU, and ``_core_x86_64_v3.abi3.so``, compiled for x86-64-v3 (AVX2, FMA, BMI2, ...:
Intel Haswell, 2013, and AMD Excavator/Zen on). The second lets the compiler inline and
vectorize all of the code for those instructions, not only the kernels that pick them at
run time, and decodes the training job with about 4% less CPU (BENCHMARKS.md). Both give
the same bytes (tests/test_native_build.py compares them over every codec and job).

``import ferrofeed`` loads the x86-64-v3 build when the wheel has it and the CPU (as the
kernel reports it in ``/proc/cpuinfo``) has every instruction set it needs, and the portable
build otherwise. The environment variable ``FERROFEED_CPU`` overrides the choice:
``baseline`` always loads the portable build; ``x86-64-v3`` requires the other one (an
ImportError names what is missing); ``auto`` (or unset) chooses as above, and falls back to
the portable build, with a RuntimeWarning, if the x86-64-v3 file is there but cannot be
loaded.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import warnings
from pathlib import Path

__all__ = ["BASELINE", "ENV", "V3", "V3_FILE", "V3_FLAGS", "choose", "cpu_flags", "load_core"]

ENV = "FERROFEED_CPU"
BASELINE = "baseline"
V3 = "x86-64-v3"
V3_FILE = "_core_x86_64_v3.abi3.so"
_MODULE = "ferrofeed._core"
_X86_64 = ("x86_64", "AMD64")  # platform.machine() on Linux, and on Windows

# The instruction sets that x86-64-v3 adds up (LLVM's and GCC's definition: x86-64-v2's, then
# AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT, MOVBE, XSAVE), as /proc/cpuinfo names them
# ("pni" is SSE3, "abm" LZCNT). The kernel leaves out AVX and AVX2 where it has not enabled
# the registers they need, so the flags say what this process may run, not only what the
# chip could.
V3_FLAGS = frozenset(
    {
        "cx16",
        "lahf_lm",
        "popcnt",
        "pni",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "avx",
        "avx2",
        "bmi1",
        "bmi2",
        "f16c",
        "fma",
        "abm",
        "movbe",
        "xsave",
    }
)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    r"""The instruction-set flags of the first CPU in ``/proc/cpuinfo``'s text (empty if none).

    Example:
        >>> sorted(cpu_flags("processor : 0\nflags\t\t: sse2 avx2 fma\n"))
        ['avx2', 'fma', 'sse2']
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def choose(setting: str, machine: str, flags: frozenset[str], has_v3: bool) -> str:
    """The build to load: ``BASELINE`` or ``V3``.

    ``setting`` is ``FERROFEED_CPU``'s value (``""`` when unset), ``machine`` is
    ``platform.machine()``, ``flags`` the CPU's (:func:`cpu_flags`), ``has_v3`` whether the
    installed package holds the x86-64-v3 build.

    Raises:
        ImportError: ``setting`` is not ``auto``, ``baseline`` or ``x86-64-v3``, or it is
            ``x86-64-v3`` and that build is missing or this CPU cannot run it.

    Example:
        >>> choose("", "x86_64", V3_FLAGS, has_v3=True)
        'x86-64-v3'
        >>> choose("baseline", "x86_64", V3_FLAGS, has_v3=True)
        'baseline'
    """
    wanted = _wanted(setting)
    if wanted not in ("auto", BASELINE, V3):
        raise ImportError(f"{ENV}={setting!r}: expected 'auto', '{BASELINE}' or '{V3}'")
    if wanted == BASELINE:
        return BASELINE
    missing = sorted(V3_FLAGS - flags) if machine in _X86_64 else None
    if wanted == V3:
        if not has_v3:
            raise ImportError(
                f"{ENV}={V3}, but this ferrofeed has no {V3} build ({V3_FILE}): only the "
                f"x86_64 wheel holds one (a build from source does not)"
            )
        if missing is None:
            raise ImportError(f"{ENV}={V3}, but this machine is {machine}, not x86_64")
        if missing:
            raise ImportError(f"{ENV}={V3}, but this CPU lacks {', '.join(missing)}")
        return V3
    return V3 if has_v3 and missing == [] else BASELINE


def _wanted(setting: str) -> str:
    """``FERROFEED_CPU``'s value as :func:`choose` compares it (unset or blank: ``auto``)."""
    return setting.strip().lower() or "auto"


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""  # no flags: the portable build


def load_core() -> str:
    """Import ``ferrofeed._core`` from the build :func:`choose` picks; return its name.

    The portable build is imported the usual way. The x86-64-v3 one is the same module
    (``PyInit__core``) in a file of its own, loaded under the name ``ferrofeed._core``, so
    every ``from ferrofeed import _core`` (and pickle) finds it in ``sys.modules``.
    A second call returns the first call's answer.
    """
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return V3 if Path(loaded.__file__ or "").name == V3_FILE else BASELINE
    v3_path = Path(__file__).with_name(V3_FILE)
    machine = platform.machine()
    # The flags are only read where they can matter.
    has_v3 = v3_path.is_file()
    flags = cpu_flags(_read_cpuinfo()) if has_v3 and machine in _X86_64 else frozenset()
    setting = os.environ.get(ENV, "")
    build = choose(setting, machine, flags, has_v3)
    if build == V3:
        try:
            _load_v3(v3_path)
        except ImportError as e:
            if _wanted(setting) == V3:
                raise
            # A damaged file (the CPU check already passed): the portable build still works.
            warnings.warn(
                f"ferrofeed: cannot load {v3_path.name} ({e}); using the portable build",
                RuntimeWarning,
                stacklevel=3,
            )
            build = BASELINE
    if build == BASELINE:
        importlib.import_module(_MODULE)
    return build


def _load_v3(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    if spec is None or spec.loader is None:  # a ".abi3.so" name always has a loader
        raise ImportError(f"no loader for {path}")
    module = importlib.util.module_from_spec(spec)  # dlopen and PyInit__core
    sys.modules[_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODULE]
        raise
