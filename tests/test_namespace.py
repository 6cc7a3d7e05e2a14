"""The top-level namespace: the public API, nothing else."""

from __future__ import annotations

import subprocess
import sys
import types

import ferrofeed


def test_namespace_holds_only_the_public_api() -> None:
    # Submodules (ferrofeed.torch, ferrofeed.numpy, ...) become attributes of the package
    # once anything imports them; they are public, and not names the package leaks.
    extra = {
        n
        for n in dir(ferrofeed)
        if not n.startswith("_")
        and n not in ferrofeed.__all__
        and not (
            isinstance(getattr(ferrofeed, n), types.ModuleType)
            and getattr(ferrofeed, n).__name__ == f"ferrofeed.{n}"
        )
    }
    assert extra == set(), extra
    assert all(hasattr(ferrofeed, n) for n in ferrofeed.__all__)


def test_a_fresh_import_exposes_only_the_public_api() -> None:
    # In a fresh interpreter nothing else has imported a submodule: the names seen are
    # exactly what `import ferrofeed` puts there.
    code = (
        "import ferrofeed, types\n"
        "extra = sorted(n for n in dir(ferrofeed) if not n.startswith('_')"
        " and n not in ferrofeed.__all__"
        " and not isinstance(getattr(ferrofeed, n), types.ModuleType))\n"
        "print(extra)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
