"""What benches/compare.py makes of its runs: medians, ratios round by round, the tables
(``{name}.md``, which BENCHMARKS.md quotes) and the plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _compare_loaders import BY_KEY, JOBS, LOADERS
from _rounds import better, fmt, fmt_ratio, med_range, medians, same_rounds, write_markdown

MIB = 1 << 20
JOB_TITLES = {
    "exact": "exact 224 (shorter side 256, center crop 224)",
    "train": "training (RandomResizedCrop 224 + random flip)",
    "shards": "training (RandomResizedCrop 224 + random flip) from shards: WebDataset tar "
    "and Hugging Face Parquet",
}

# The ferrofeed configuration each headline ratio is quoted for, per job.
HEADLINE = {"exact": "ferrofeed-native", "train": "ferrofeed-native", "shards": "ferrofeed-tar"}
# Pairs compared round by round (besides ferrofeed with each peer): the torchvision loader
# against the Pillow one with as many workers; ferrofeed's shard sources against its
# image-folder path (the "no more CPU per image than the image-folder path").
PEER_PAIRS = [
    *((f"torchvision-w{w}", f"pytorch-w{w}") for w in (2, 4)),
    ("ferrofeed-tar", "ferrofeed-folder"),
    ("ferrofeed-parquet", "ferrofeed-folder"),
]


# --- per round, then median and range ----------------------------------------------------------


def ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each ferrofeed configuration against each peer, per job, round by round."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        ours = [k for k in by_loader if BY_KEY[k].ferrofeed]
        peers = [k for k in by_loader if not BY_KEY[k].ferrofeed]
        out[job] = {}
        for f in ours:
            for p in peers:
                per = same_rounds(by_loader[f], by_loader[p])
                if not per:
                    continue
                out[job][f"{f} vs {p}"] = {  # >1: ferrofeed better on each
                    "throughput": better(per, "images_per_s"),
                    "cpu_per_image_less": better(per, "cpu_s_per_1000", lower=True),
                    "ttfb_sooner": better(per, "ttfb_s", lower=True),
                    "pss_added_less": better(per, "peak_pss_added", lower=True),
                }
    return out


def best_peer_ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each ferrofeed configuration's images/s against the fastest peer of each round (which
    peer that is may change from round to round), per job: median and range."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        peers = [k for k in by_loader if not BY_KEY[k].ferrofeed and by_loader[k]]
        for f in [k for k in by_loader if BY_KEY[k].ferrofeed]:
            rounds = min([len(by_loader[f])] + [len(by_loader[p]) for p in peers])
            if not peers or not rounds:
                continue
            per = [
                by_loader[f][i]["images_per_s"]
                / max(by_loader[p][i]["images_per_s"] for p in peers)
                for i in range(rounds)
            ]
            out.setdefault(job, {})[f] = med_range(per)
    return out


def peer_ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each pair of `PEER_PAIRS` that ran, per job, round by round (>1: the first better)."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        for a, b in PEER_PAIRS:
            per = same_rounds(by_loader.get(a, []), by_loader.get(b, []))
            if not per:
                continue
            out.setdefault(job, {})[f"{a} vs {b}"] = {
                "throughput": better(per, "images_per_s"),
                "cpu_per_image_less": better(per, "cpu_s_per_1000", lower=True),
            }
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median and range of each figure over one loader's rounds."""
    figures = ("images_per_s", "ttfb_s", "cpu_s_per_1000", "peak_pss", "peak_pss_added")
    return medians(runs, (*figures, "pss_growth"))


# --- report: markdown tables and plots ---------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    """The tables BENCHMARKS.md quotes, from the results."""
    lines: list[str] = []
    # Results written before the CPU had a field of its own name it in "machine".
    cpu = results.get("cpu") or results["machine"]
    for job, summary in results["summary"].items():
        lines += [
            f"#### {JOB_TITLES[job]}, on {cpu}",
            "",
            "| loader | images/s | first batch (ms) | CPU s / 1000 images | peak PSS (MiB) "
            "| added by the loader (MiB) | growth, epoch 1→3 (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, s in summary.items():
            label = BY_KEY[key].label
            label = f"**{label}**" if BY_KEY[key].ferrofeed else label
            lines.append(
                f"| {label} | {fmt(s['images_per_s'])} | {fmt(s['ttfb_s'], 1e3)} "
                f"| {fmt(s['cpu_s_per_1000'], digits=2)} | {fmt(s['peak_pss'], 1 / MIB)} "
                f"| {fmt(s['peak_pss_added'], 1 / MIB)} | {fmt(s['pss_growth'], 1 / MIB, 1)} |"
            )
        lines.append("")
        table = results["ratios"].get(job, {})
        peers = [k for k in summary if not BY_KEY[k].ferrofeed]
        native = HEADLINE[job]
        if native in summary and peers:
            lines += [
                f"{BY_KEY[native].label} against each peer, from the same rounds (per round, "
                "then median and range; above 1 is better for ferrofeed):",
                "",
                "| peer | images/s | less CPU per image | first batch sooner | less memory added |",
                "|---|---:|---:|---:|---:|",
            ]
            for p in peers:
                r = table[f"{native} vs {p}"]
                lines.append(
                    f"| {BY_KEY[p].label} | {fmt_ratio(r['throughput'])} "
                    f"| {fmt_ratio(r['cpu_per_image_less'])} | {fmt_ratio(r['ttfb_sooner'])} "
                    f"| {fmt_ratio(r['pss_added_less'])} |"
                )
            lines.append("")
            bests = results.get("best_peer", {}).get(job, {})
            if bests:
                lines += ["Images/s against the fastest peer of each round:", ""]
                lines += [f"- {BY_KEY[k].label}: {fmt_ratio(r)}" for k, r in bests.items()]
                lines.append("")
        pairs = results.get("peer_ratios", {}).get(job, {})
        if pairs:
            lines += [
                "Pairs from the same rounds (per round, then median and range; above 1 is "
                "better for the first):",
                "",
                "| loader | against | images/s | less CPU per image |",
                "|---|---|---:|---:|",
            ]
            for pair, r in pairs.items():
                a, b = pair.split(" vs ")
                lines.append(
                    f"| {BY_KEY[a].label} | {BY_KEY[b].label} | {fmt_ratio(r['throughput'])} "
                    f"| {fmt_ratio(r['cpu_per_image_less'])} |"
                )
            lines.append("")
        same = [k for k in ("ferrofeed-threads", "ferrofeed-w2") if k in summary]
        if same and peers:
            lines += [
                "ferrofeed running the same Pillow transform as PyTorch, against each peer "
                "(images/s ratio; CPU per image, less):",
                "",
                "| peer | " + " | ".join(BY_KEY[k].label for k in same) + " |",
                "|---|" + "---:|" * len(same),
            ]
            for p in peers:
                cells = [
                    f"{fmt_ratio(table[f'{k} vs {p}']['throughput'])}; CPU "
                    f"{fmt_ratio(table[f'{k} vs {p}']['cpu_per_image_less'])}"
                    for k in same
                ]
                lines.append(f"| {BY_KEY[p].label} | " + " | ".join(cells) + " |")
            lines.append("")
    not_run = results["not_run"]
    if not_run:
        lines += ["Not run:", ""]
        lines += [f"- {BY_KEY[k].label}: {why}" for k, why in not_run.items()]
        lines.append("")
    if results.get("warnings"):
        lines += ["Warnings:", ""] + [f"- {w}" for w in results["warnings"]] + [""]
    ram = results.get("ram")
    if ram:
        lines += [
            f"#### metadata only: {ram['runs'][0]['n']:,} COCO-like annotations, "
            f"{ram['layout']}, each reads every item, on {cpu}",
            "",
            "| loader | peak total PSS (MiB) | steady total PSS (MiB) "
            "| job footprint, no data (MiB) | wall time (s) |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in ram["runs"]:
            name = r["container"]
            name = f"**{name}**" if name.startswith("ferrofeed") else name
            bound = " (stopped: a lower bound)" if r.get("lower_bound") else ""
            footprint = r.get("footprint")
            lines.append(
                f"| {name}{bound} | {r['peak_total_pss'] / MIB:,.1f} "
                f"| {r['total_pss_end'] / MIB:,.1f} "
                f"| {'-' if footprint is None else f'{footprint / MIB:,.1f}'} "
                f"| {r['iterate_s']:.1f} |"
            )
        lines.append("")
        for t in ram.get("targets") or []:
            method = t.get("method", "?")
            one = t.get("same_libs_one_copy_ratio") or t.get("steady_one_copy_ratio")
            torch_ratio = t.get("steady_torch_ratio")
            parts = []
            if one is not None:
                parts.append(f"ferrofeed's steady PSS is {one:.3f}x one copy + footprint")
            if torch_ratio is not None:
                parts.append(f"{torch_ratio:.3f}x PyTorch's")
            if parts:
                lines.append(f"- {method}: " + ", ".join(parts))
        lines.append("")
    return "\n".join(lines)


PLOT_METRICS = [
    ("images_per_s", 1.0, "images/s (higher is better)", "throughput"),
    ("cpu_s_per_1000", 1.0, "CPU s per 1000 images, whole process tree (lower is better)", "cpu"),
    ("peak_pss_added", 1 / MIB, "peak PSS added by the loader, MiB (lower is better)", "pss"),
]
JOB_COLORS = {"exact": "#1b9e77", "train": "#d95f02", "shards": "#7570b3"}


def _bars(
    ax: Any, summary: dict[str, Any], jobs: list[str], keys: list[str], metric: str, scale: float
) -> None:
    """One horizontal bar per (loader, job) of ``metric``: the median, min-max whiskers."""
    height = 0.8 / max(len(jobs), 1)
    top = 0.0
    for n, job in enumerate(jobs):
        ys, med, lo, hi = [], [], [], []
        for y, key in enumerate(keys):
            if key not in summary[job]:
                continue
            stat = summary[job][key][metric]
            ys.append(y + ((len(jobs) - 1) / 2 - n) * height)
            med.append(stat["median"] * scale)
            lo.append((stat["median"] - stat["min"]) * scale)
            hi.append((stat["max"] - stat["median"]) * scale)
        ax.barh(
            ys,
            med,
            height,
            xerr=[lo, hi],
            color=JOB_COLORS[job],
            capsize=2,
            error_kw={"lw": 0.8},
            label=JOB_TITLES[job],
        )
        for y, m, h in zip(ys, med, hi, strict=True):
            ax.text(m + h, y, f" {m:,.0f}" if m >= 10 else f" {m:.2f}", va="center", fontsize=7)
            top = max(top, m + h)
    ax.set_xlim(0, top * 1.15)
    ax.grid(axis="x", alpha=0.3)


def _loader_ticks(ax: Any, keys: list[str]) -> None:
    ax.set_yticks(range(len(keys)), [BY_KEY[k].label for k in keys], fontsize=8)
    for tick, key in zip(ax.get_yticklabels(), keys, strict=True):
        if BY_KEY[key].ferrofeed:
            tick.set_fontweight("bold")


def plots(results: dict[str, Any], out_dir: Path, stem: str = "compare") -> list[Path]:
    """PNG plots of images/s, CPU per image and memory per loader and job; PSS over time
    (RAM job).

    Several jobs: one plot per metric, a bar per job (``{stem}_throughput.png``,
    ``{stem}_cpu.png``, ``{stem}_pss.png``). One job (e.g. ``--jobs shards``): one plot,
    ``{stem}.png``, with the three metrics side by side.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    summary = results["summary"]
    jobs = [j for j in JOBS if j in summary]
    keys = [lo.key for lo in LOADERS if any(lo.key in summary[j] for j in jobs)][::-1]
    # The machine (its CPU first) on a line of its own, so that it is never cut off.
    title = results["title"].replace("; ", "\n", 1)
    if len(jobs) == 1 and keys:
        fig, axes = plt.subplots(
            1, len(PLOT_METRICS), figsize=(15, 0.45 * len(keys) + 1.8), sharey=True
        )
        for ax, (metric, scale, xlabel, _name) in zip(axes, PLOT_METRICS, strict=True):
            _bars(ax, summary, jobs, keys, metric, scale)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
        _loader_ticks(axes[0], keys)
        fig.suptitle(
            f"{JOB_TITLES[jobs[0]]}; median of the rounds, bars: min-max\n{title}", fontsize=8
        )
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
    for metric, scale, xlabel, name in PLOT_METRICS if keys and len(jobs) > 1 else []:
        fig, ax = plt.subplots(figsize=(8.5, 0.5 * len(keys) + 1.5))
        _bars(ax, summary, jobs, keys, metric, scale)
        _loader_ticks(ax, keys)
        ax.set_xlabel(f"{xlabel}; median of the rounds, bars: min-max", fontsize=8)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_{name}.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
    ram = results.get("ram")
    if ram:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for r in ram["runs"]:
            t = [s[0] for s in r["series"]]
            v = [s[1] / MIB for s in r["series"]]
            ax.plot(t, v, label=r["container"], lw=1.5)
        ax.set_xlabel("seconds since the workers started", fontsize=8)
        ax.set_ylabel("total PSS, MiB", fontsize=8)
        ax.set_title(
            f"{ram['runs'][0]['n']:,} COCO-like annotations, {ram['layout']}: "
            f"PSS of all processes over time\n{results['machine']}",
            fontsize=8,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_ram.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def report(results: dict[str, Any], out_dir: Path, name: str = "compare") -> None:
    """Write ``{name}.md`` and the plots into ``out_dir``; print the tables."""
    md = write_markdown(out_dir, name, markdown(results))
    written = plots(results, out_dir, name)
    print(f"results: {out_dir / f'{name}.json'}, {md}")
    print("plots: " + ", ".join(str(p) for p in written))
