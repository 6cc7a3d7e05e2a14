"""What the wheel declares, and what a user without an optional framework is told.

A missing framework is simulated in a fresh interpreter with ``sys.modules[name] = None``,
which makes ``import name`` raise ModuleNotFoundError as if it were not installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import ferrofeed
import pytest
from conftest import REPO_ROOT, last_json_line, run_python

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
# The requirement on NumPy that the wheel declares, e.g. "numpy>=2.2".
NUMPY_REQUIREMENT = next(r for r in PROJECT["dependencies"] if r.startswith("numpy"))

# What the user is told to run, per missing module.
INSTALL_HINT = {
    "torch": "pip install 'ferrofeed[torch]'",
    "jax": "pip install 'ferrofeed[jax]'",
    "numpy": f"pip install '{NUMPY_REQUIREMENT}'",
}

# Import `what` with `missing` hidden; print the error's type, name and message as JSON.
MISSING = """
import json, sys
sys.modules[{missing!r}] = None
try:
    {what}
except ImportError as e:
    print(json.dumps({{"type": type(e).__name__, "name": e.name, "msg": str(e)}}))
else:
    print(json.dumps({{"type": None}}))
"""


def _import_error(missing: str, what: str) -> dict[str, str | None]:
    proc = run_python(MISSING.format(missing=missing, what=what))
    result: dict[str, str | None] = last_json_line(proc.stdout)
    return result


@pytest.mark.parametrize(
    ("missing", "what"),
    [
        ("torch", "import ferrofeed.torch"),
        ("torch", "import ferrofeed; ferrofeed.to_torch(ferrofeed.zeros(2, 'uint8'))"),
        ("jax", "import ferrofeed.jax"),
        ("jax", "import ferrofeed; ferrofeed.to_jax(ferrofeed.zeros(2, 'uint8'))"),
        ("numpy", "import ferrofeed.numpy"),
        ("numpy", "import ferrofeed; ferrofeed.to_numpy(ferrofeed.zeros(2, 'uint8'))"),
    ],
)
def test_a_missing_framework_names_what_to_install(missing: str, what: str) -> None:
    err = _import_error(missing, what)
    assert err["type"] == "ModuleNotFoundError", err
    assert err["name"] == missing, err  # `except ModuleNotFoundError` code still sees which
    assert INSTALL_HINT[missing] in (err["msg"] or ""), err


@pytest.mark.parametrize("output", ["torch", "jax"])
def test_dataloader_output_without_its_framework_names_the_extra(
    output: str, tmp_path: Path
) -> None:
    # The native image chain hands its batches over through ferrofeed.torch / ferrofeed.jax.
    code = f"""
from ferrofeed import DataLoader
from ferrofeed.samples import image_folder
image_folder({str(tmp_path)!r}, 4, classes=2, size=(64, 48))
next(iter(DataLoader({str(tmp_path)!r}, batch_size=2, output={output!r})))
"""
    err = _import_error(output, code.replace("\n", "\n    "))
    assert err["type"] == "ModuleNotFoundError", err
    assert INSTALL_HINT[output] in (err["msg"] or ""), err


def test_import_ferrofeed_and_the_numpy_output_need_no_torch_or_jax() -> None:
    code = """
import json, sys
sys.modules["torch"] = None
sys.modules["jax"] = None
import ferrofeed
print(json.dumps(ferrofeed.zeros((2, 3), "uint8").numpy().shape))
"""
    assert json.loads(run_python(code).stdout.strip().splitlines()[-1]) == [2, 3]


def test_a_broken_framework_keeps_its_own_error() -> None:
    # torch is found but one of its own imports fails: that error, not "install torch".
    code = """
import json, sys, types
torch = types.ModuleType("torch")
torch.__path__ = []  # a package, whose torch.utils cannot be found
sys.modules["torch"] = torch
try:
    import ferrofeed.torch
except ImportError as e:
    print(json.dumps({"name": e.name, "msg": str(e)}))
"""
    err = last_json_line(run_python(code).stdout)
    assert err["name"] == "torch.utils", err
    assert "ferrofeed[torch]" not in err["msg"], err


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_pyproject_declares_numpy_with_a_floor_and_the_frameworks_as_extras() -> None:
    project = PROJECT
    numpy = [r for r in project["dependencies"] if _requirement_names([r]) == {"numpy"}]
    assert len(numpy) == 1, project["dependencies"]
    assert ">=" in numpy[0], numpy
    # torch and jax are never pulled in by a plain install
    assert not {"torch", "jax"} & _requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["torch"]) == {"torch"}
    assert _requirement_names(extras["jax"]) == {"jax"}


def test_the_installed_wheel_declares_numpy() -> None:
    try:
        dist = importlib.metadata.distribution("ferrofeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ferrofeed is not installed (run from the source tree)")
    installed = Path(str(dist.locate_file("ferrofeed/__init__.py"))).resolve()
    if installed != Path(ferrofeed.__file__).resolve():
        pytest.skip(f"the ferrofeed imported is not the installed one ({ferrofeed.__file__})")
    plain = [r for r in dist.requires or [] if "extra ==" not in r]
    assert _requirement_names(plain) == {"numpy"}, dist.requires


def _readme_quick_start_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README's Quick start has no ```bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_quick_start_commands() -> None:
    # A README command that fails on a fresh machine must fail CI: .ci/run runs each of
    # them (the first one in a fresh virtual environment).
    commands = _readme_quick_start_commands()
    assert commands[0] == "make demo", commands
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_lines = [shlex.split(line.split("#", 1)[0]) for line in ci.splitlines()]
    for command in commands:
        words = shlex.split(command)
        assert any(line[: len(words)] == words for line in ci_lines), (
            f"the README's {command!r} is not run by .ci/run"
        )


def _make_dry_run(*args: str) -> str:
    """What ``make -n -B ARGS`` would run (every recipe, whatever is built already)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(
        ["make", "-n", "-B", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return proc.stdout


def test_make_builds_once_for_demo_and_test_and_the_release_wheel_twice() -> None:
    # demo and test: one extension, the fast profile, the system linker; cargo test with the
    # same profile (so it reuses the wheel's dependencies).
    for goal in ("demo", "test"):
        run = _make_dry_run(goal)
        builds = [ln for ln in run.splitlines() if "maturin build" in ln]
        assert len(builds) == 1, builds
        assert "--profile fast" in builds[0], builds
        assert "--zig" not in builds[0], builds
    assert "cargo test --profile fast\n" in _make_dry_run("test-rust")
    # The release wheel: zig, release (fat LTO) and, on x86_64, the x86-64-v3 build too; the
    # benchmark targets install it by default.
    for args in (("install", "BUILD=release"), ("bench-scaling",), ("compare",)):
        builds = [ln for ln in _make_dry_run(*args).splitlines() if "maturin build" in ln]
        assert builds, args
        assert all("--release" in b for b in builds), (args, builds)
        assert all("--zig" in b for b in builds), (args, builds)
        if platform.machine() == "x86_64":
            assert any("target-cpu=x86-64-v3" in b for b in builds), (args, builds)


def test_make_test_leaves_the_slow_tier_to_make_test_slow() -> None:
    test = _make_dry_run("test")
    slow = _make_dry_run("test-slow")
    assert '-m "not slow"' in test
    assert "-m slow" not in test
    assert "-m slow" in slow
    assert "--no-default-features image" in slow
    assert "--no-default-features" not in test
    every = _make_dry_run("test-all")
    assert '-m "not slow"' in every
    assert "-m slow" in every


def test_readme_states_the_measured_time_of_each_command() -> None:
    # Each quick-start command says how long it takes; the figures are the latest
    # benches/fresh_clone.py run's, whose machine and date the text beside them names.
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README's Quick start has no ```bash block"
    measured = json.loads(
        (REPO_ROOT / "benches" / "results" / "fresh_clone.json").read_text(encoding="utf-8")
    )
    for target in ("demo", "test"):
        line = next(
            (ln for ln in block.group(1).splitlines() if ln.startswith(f"make {target} ")), None
        )
        assert line is not None, f"README's quick start has no 'make {target}' line"
        stated = re.search(r"\((\d+\.\d) min\)\s*$", line)
        assert stated, f"README's 'make {target}' line ends without its time (N.N min): {line!r}"
        minutes = measured["targets"][target]["wall_s"] / 60
        assert float(stated.group(1)) == round(minutes, 1), (
            f"README says make {target} takes {stated.group(1)} min; "
            f"benches/results/fresh_clone.json measured {minutes:.1f}"
        )
    prose = " ".join(section.split())
    for fact in (measured["cpu"], f"{measured['cores']} vCPUs", measured["date"]):
        assert str(fact) in prose, f"README's quick start does not name {fact!r}"


@pytest.mark.parametrize("output", ["torch", "jax"])
def test_python_dataloader_without_its_framework_says_so_at_construction(output: str) -> None:
    code = f"""
from ferrofeed import DataLoader
DataLoader(list(range(4)), 2, output={output!r})
"""
    err = _import_error(output, code.replace("\n", "\n    "))
    assert err["type"] == "ModuleNotFoundError", err
    assert INSTALL_HINT[output] in (err["msg"] or ""), err
