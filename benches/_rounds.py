"""The rounds of a benchmark: their order (`rotated`), which configurations run here
(`runnable`), the runs of two configurations compared round by round (`same_rounds`,
`better`), medians and ranges (`med_range`, `medians`, `fmt`, `fmt_ratio`), the command
line's shared options, quick defaults and lists (`add_run_options`, `fill_defaults`,
`subset`) and the tables (`write_markdown`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where results go: those BENCHMARKS.md quotes (committed), and those of quick and local
# runs (git ignores them).
RESULTS = REPO_ROOT / "benches" / "results"
LOCAL_RESULTS = REPO_ROOT / "bench-results"


def med_range(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def medians(runs: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, dict[str, float]]:
    """The median and range of each figure of ``keys`` over ``runs`` (one configuration's
    rounds, say)."""
    return {key: med_range([r[key] for r in runs]) for key in keys}


def same_rounds(
    a: list[dict[str, Any]], b: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The runs of two configurations paired round by round, for the rounds both ran."""
    return list(zip(a, b, strict=False))


def better(
    pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]], key: str, *, lower: bool = False
) -> dict[str, float]:
    """Runs ``(a, b)`` of the same round compared on ``key``, round by round, then the median
    and range: ``a``'s over ``b``'s, or ``b``'s over ``a``'s where ``lower`` is better (CPU
    per image, time to the first batch), so that above 1 is always better for ``a``."""
    return med_range([b[key] / a[key] if lower else a[key] / b[key] for a, b in pairs])


def rotated(items: Sequence[Any], rnd: int) -> list[Any]:
    """``items`` in round ``rnd``'s order: rotated by one more place each round, so that no
    configuration always follows the same one."""
    shift = rnd % max(len(items), 1)
    return [*items[shift:], *items[:shift]]


def runnable(
    checks: dict[str, tuple[bool, str]], labels: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Which configurations can run here, from what each one's check said (``key: (ok,
    why)``): their keys, in order, and why each other cannot (``not_run``), said in a line
    ``skipped KEY (LABEL): WHY`` as it is found."""
    keys, not_run = [], {}
    for key, (ok, why) in checks.items():
        if ok:
            keys.append(key)
        else:
            not_run[key] = why
            label = f" ({labels[key]})" if labels and key in labels else ""
            print(f"skipped {key}{label}: {why}", flush=True)
    return keys, not_run


def subset(
    text: str, allowed: Iterable[str], what: str, parser: argparse.ArgumentParser
) -> list[str]:
    """The names of a comma-separated option (``all``: every one of ``allowed``), in the
    order given; a name not in ``allowed`` is a usage error naming ``what`` it is."""
    allowed = list(allowed)
    if text.strip() == "all":
        return allowed
    names = [x.strip() for x in text.split(",") if x.strip()]
    if unknown := set(names) - set(allowed):
        parser.error(f"unknown {what}: {sorted(unknown)} (of {','.join(allowed)})")
    return names


def add_run_options(
    parser: argparse.ArgumentParser, *, timeout: float, quick: str | None = None
) -> None:
    """The options every benchmark script takes alike: ``--seed`` (of the data and the
    shuffles), ``--timeout`` (seconds one run may take before it fails) and, where the
    script has a smoke run, ``--quick`` (``quick`` is its help: what it makes smaller)."""
    parser.add_argument("--seed", type=int, default=0, help="of the data and the shuffles")
    parser.add_argument(
        "--timeout", type=float, default=timeout, help=f"seconds one run may take ({timeout:g})"
    )
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)


def add_result_options(
    parser: argparse.ArgumentParser, *, quick_dir: str, replot: str, flag: str = "--out-dir"
) -> None:
    """Where a script's results go, ``flag`` (see `results_dir`), and ``--replot FILE``
    (``replot`` says what is made again from a results JSON)."""
    parser.add_argument(
        flag,
        type=Path,
        default=None,
        help=f"where results go (default benches/results; --quick: bench-results/{quick_dir})",
    )
    parser.add_argument("--replot", type=Path, default=None, help=replot)


def results_dir(given: Path | None, quick: bool, quick_dir: str) -> Path:
    """Where results go: ``given``, else benches/results/ (those BENCHMARKS.md quotes), or
    for a quick run bench-results/``quick_dir``/, which leaves the committed ones alone."""
    if given is not None:
        return given
    return LOCAL_RESULTS / quick_dir if quick else RESULTS


def fill_defaults(args: argparse.Namespace, **defaults: tuple[Any, Any]) -> None:
    """Give each option left unset (None) its default, ``name=(full, quick)``: the second
    with ``--quick`` (a smoke run). What the command line gives stays."""
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def write_markdown(out_dir: Path, name: str, md: str) -> Path:
    """Write the tables ``md`` to ``out_dir/{name}.md`` and print them; return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.md"
    path.write_text(md + "\n")
    print()
    print(md)
    return path


def fmt(stat: dict[str, float], scale: float = 1.0, digits: int = 0) -> str:
    """``median (min-max)``, scaled."""
    m, lo, hi = (stat[k] * scale for k in ("median", "min", "max"))
    return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def fmt_ratio(stat: dict[str, float]) -> str:
    """A ratio's ``medianx (min-max)``."""
    return f"{stat['median']:.2f}x ({stat['min']:.2f}-{stat['max']:.2f})"
