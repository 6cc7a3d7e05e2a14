"""What benches/remote_compare.py makes of its runs: medians, ratios round by round, the
target's verdict, the table (``remote_compare.md``, which BENCHMARKS.md quotes) and the plot.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from _remote_configs import BY_KEY, CONFIGS, PAIRS
from _rounds import fmt, fmt_ratio, med_range, medians, same_rounds, write_markdown

NAME = "remote_compare"
MIB = 1 << 20
TARGET = 0.90  # the issue's: within 10% of local disk
COLORS = {"ferrofeed": "#7570b3", "webdataset": "#d95f02"}


def cores(r: dict[str, Any]) -> tuple[float, float]:
    """The CPUs the loader's process tree and the servers kept busy over a run, on average:
    their CPU seconds over the run's wall time (building the source and every epoch)."""
    wall = sum(r["epoch_s"])
    return r["cpu_loader_s"] / wall, sum(r["server_cpu_s"].values()) / wall


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    for r in runs:
        r["loader_cores"], r["server_cores"] = cores(r)
        r["total_cpu_s_per_1000"] = r["cpu_s_per_1000"] + r["server_cpu_s_per_1000"]
    out: dict[str, Any] = medians(
        runs,
        (
            "images_per_s",
            "first_epoch_images_per_s",
            "ttfb_s",
            "cpu_s_per_1000",
            "server_cpu_s_per_1000",
            "total_cpu_s_per_1000",
            "loader_cores",
            "server_cores",
            "peak_pss",
            "peak_pss_added",
        ),
    )
    steady = [e for r in runs for e in r["remote_epochs"][1:]]
    if steady:  # ferrofeed's remote counters per steady epoch, over every run
        counters = steady[0].keys()
        out["remote_steady_epoch"] = medians(steady, counters)
        out["remote_first_epoch"] = medians([r["remote_epochs"][0] for r in runs], counters)
        sources = [r["remote_source"] for r in runs]
        out["remote_source"] = medians(sources, sources[0].keys())
    return out


def per_round(runs: dict[str, list[dict[str, Any]]], a: str, b: str, key: str) -> list[float]:
    """``a``'s ``key`` over ``b``'s, round by round, for the rounds both ran."""
    return [x[key] / y[key] for x, y in same_rounds(runs.get(a, []), runs.get(b, []))]


def ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each configuration against its baseline, and ferrofeed against webdataset."""
    out: dict[str, Any] = {}
    pairs = [(c.key, c.baseline) for c in CONFIGS if c.baseline] + PAIRS
    for a, b in pairs:
        steady = per_round(runs, a, b, "images_per_s")
        if not steady:
            continue
        first = per_round(runs, a, b, "first_epoch_images_per_s")
        cpu = per_round(runs, a, b, "cpu_s_per_1000")
        total = per_round(runs, a, b, "total_cpu_s_per_1000")
        out[f"{a} vs {b}"] = {
            "steady_per_round": steady,
            "steady": med_range(steady),
            "first_epoch_per_round": first,
            "first_epoch": med_range(first),
            # CPU per image, a's over b's (above 1: a takes more): the loader's alone, and
            # the loader's with the servers'.
            "cpu_per_image": med_range(cpu),
            "cpu_per_image_with_servers": med_range(total),
        }
    return out


def markdown(results: dict[str, Any]) -> str:
    """The tables BENCHMARKS.md quotes, from the results."""
    s = results["summary"]
    build = results["build"]
    lines = [
        f"#### training (RandomResizedCrop 224 + random flip) from tar shards in object storage, "
        f"on {results['cpu']}",
        "",
        f"{results['machine']}; ferrofeed build: {build['build_profile']} "
        f"(cargo profile {build.get('cargo_profile') or 'unknown'}, {build['native_build']}); "
        f"{results['data']['n']} JPEGs in {results['data']['shards']} tar shards of "
        f"{results['data']['per_shard']} ({results['data']['mean_tar_bytes'] / 1e6:.1f} MB "
        f"each); {results['args']['rounds']} rounds of {results['args']['epochs']} epochs; "
        f"load average {results['loadavg_start']} at the start, {results['loadavg_end']} "
        "at the end.",
        "",
        "| configuration | steady images/s | first epoch images/s | first batch (ms) "
        "| CPU s / 1000 images, loader | CPU s / 1000 images, servers "
        "| CPUs busy, loader + servers | peak PSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, st in s.items():
        label = BY_KEY[key].label
        label = f"**{label}**" if BY_KEY[key].family == "ferrofeed" else label
        lines.append(
            f"| {label} | {fmt(st['images_per_s'])} | {fmt(st['first_epoch_images_per_s'])} "
            f"| {fmt(st['ttfb_s'], 1e3)} | {fmt(st['cpu_s_per_1000'], digits=2)} "
            f"| {fmt(st['server_cpu_s_per_1000'], digits=2)} "
            f"| {st['loader_cores']['median']:.2f} + {st['server_cores']['median']:.2f} "
            f"| {fmt(st['peak_pss'], 1 / MIB)} |"
        )
    lines += [
        "",
        "Per round, then median and range (images/s: above 1, the first is faster; CPU per "
        "image: the first's over the second's, above 1, the first takes more):",
        "",
        "| configuration | against | steady images/s | per round | first epoch images/s "
        "| CPU per image, loader | CPU per image, loader + servers |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for pair, r in results["ratios"].items():
        a, b = pair.split(" vs ")
        rounds = ", ".join(f"{x:.3f}" for x in r["steady_per_round"])
        lines.append(
            f"| {BY_KEY[a].label} | {BY_KEY[b].label} | {fmt_ratio(r['steady'])} | {rounds} "
            f"| {fmt_ratio(r['first_epoch'])} | {fmt_ratio(r['cpu_per_image'])} "
            f"| {fmt_ratio(r['cpu_per_image_with_servers'])} |"
        )
    remote = [k for k in s if "remote_steady_epoch" in s[k]]
    if remote:
        lines += [
            "",
            'ferrofeed\'s `loader.stats()["remote"]`, per epoch (median and range over the '
            "rounds; steady: the epochs after the first), and around building the source "
            "(listing and counting the shards):",
            "",
            "| configuration | when | requests | retries | MiB received | shards fetched "
            "| cache hits | wait_s |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key in remote:
            for when, field in (
                ("source", "remote_source"),
                ("first epoch", "remote_first_epoch"),
                ("steady epoch", "remote_steady_epoch"),
            ):
                st = s[key][field]
                lines.append(
                    f"| {BY_KEY[key].label} | {when} | {fmt(st['requests'])} "
                    f"| {fmt(st['retries'])} | {fmt(st['bytes'], 1 / MIB, 1)} "
                    f"| {fmt(st['fetched'])} | {fmt(st['cache_hits'])} "
                    f"| {fmt(st['wait_s'], digits=3)} |"
                )
    t = results.get("target")
    if t:
        lines += [
            "",
            f"Target (issue 26): S3 + 20 ms/request steady images/s at least {TARGET:.2f}x "
            f"local disk: {fmt_ratio(t['ratio'])} per round {t['per_round']}: "
            f"**{'met' if t['met'] else 'missed'}** (median).",
        ]
    if results["not_run"]:
        lines += ["", "Not run:", ""]
        lines += [f"- {BY_KEY[k].label}: {why}" for k, why in results["not_run"].items()]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Bars of steady and first-epoch images/s and CPU per image (loader + servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    keys = [c.key for c in CONFIGS if c.key in s][::-1]
    panels = [
        ("images_per_s", "steady images/s, epochs after the first (higher is better)"),
        ("first_epoch_images_per_s", "first epoch images/s, building the source included"),
        ("cpu", "CPU s per 1000 images: loader tree + servers (hatched) (lower is better)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.45 * len(keys) + 1.9), sharey=True)
    for ax, (metric, xlabel) in zip(axes, panels, strict=True):
        top = 0.0
        for y, key in enumerate(keys):
            color = COLORS[BY_KEY[key].family]
            if metric == "cpu":
                a = s[key]["cpu_s_per_1000"]["median"]
                b = s[key]["server_cpu_s_per_1000"]["median"]
                ax.barh(y, a, 0.7, color=color)
                ax.barh(y, b, 0.7, left=a, color=color, alpha=0.45, hatch="//")
                ax.text(a + b, y, f" {a:.2f} + {b:.2f}", va="center", fontsize=7)
                top = max(top, a + b)
                continue
            st = s[key][metric]
            err = [[st["median"] - st["min"]], [st["max"] - st["median"]]]
            ax.barh(y, st["median"], 0.7, xerr=err, color=color, capsize=2, error_kw={"lw": 0.8})
            ax.text(st["max"], y, f" {st['median']:,.0f}", va="center", fontsize=7)
            top = max(top, st["max"])
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(keys)), [BY_KEY[k].label for k in keys], fontsize=8)
    for tick, key in zip(axes[0].get_yticklabels(), keys, strict=True):
        if BY_KEY[key].family == "ferrofeed":
            tick.set_fontweight("bold")
    build = results["build"]
    fig.suptitle(
        "training (RandomResizedCrop 224 + flip) from tar shards: local disk, moto S3, HTTP, "
        f"with and without 20 ms/request; median of {results['args']['rounds']} rounds, "
        f"bars: min-max\n{results['machine']}; ferrofeed {build['build_profile']} "
        f"(cargo profile {build.get('cargo_profile') or 'unknown'})",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def report(results: dict[str, Any], out_dir: Path) -> None:
    """Write ``remote_compare.{json,md,png}`` into ``out_dir``; print the tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.json").write_text(json.dumps(results, indent=1))
    written = [out_dir / f"{NAME}.json", write_markdown(out_dir, NAME, markdown(results))]
    if importlib.util.find_spec("matplotlib") is not None:
        plot(results, out_dir / f"{NAME}.png")
        written.append(out_dir / f"{NAME}.png")
    print("written: " + ", ".join(str(p) for p in written))


def analyse(results: dict[str, Any]) -> dict[str, Any]:
    """Add the summaries, ratios and the target's verdict to ``results`` (from its runs)."""
    runs = results["runs"]
    results["summary"] = {key: summarize(rs) for key, rs in runs.items() if rs}
    results["ratios"] = ratios(runs)
    target = results["ratios"].get("s3-latency vs local")
    if target:
        results["target"] = {
            "ratio": target["steady"],
            "per_round": [round(x, 3) for x in target["steady_per_round"]],
            "met": target["steady"]["median"] >= TARGET,
        }
    return results
