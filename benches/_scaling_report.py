"""What benches/scaling.py makes of its runs: the targets' verdicts, the tables
(``{name}.md``, which BENCHMARKS.md quotes) and the line printed as each run ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _rounds import fmt, fmt_ratio, write_markdown
from _scaling_rows import JOB_NAMES, LABELS, PROXY_BASE, SOURCES, Config, note


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with what this run measured (from the medians)."""
    cores, summary = results["cores"], results["summary"]
    configs = {k: Config(**c) for k, c in results["configs"].items()}
    lines = []
    for p in results["proxy"]:
        if p["loader"] != "ferrofeed":
            continue
        r = p["ratio"]["median"]
        lines.append(
            f"{p['batch']} images a batch on {p['threads']} thread{'s' * (p['threads'] > 1)} "
            f"(2 per thread) give {r:.2f}x the images/s of batches of {p['base_batch']} "
            f"(target >= 0.95x): {'met' if r >= 0.95 else 'NOT met'}"
        )
    # The serial target is about the training job's batches of 32 (the batch size
    # of the 16-core runs); smaller batches are the proxy's, and their share is shown apart.
    for source in SOURCES:
        for small in (False, True):
            shares = [
                (summary[k]["serial_share"]["median"], k)
                for k, c in configs.items()
                if c.loader == "ferrofeed"
                and c.source == source
                and (c.batch < PROXY_BASE if small else c.batch == PROXY_BASE)
                and summary[k]["serial_share"] is not None
                and all(r["decode_in_pool"] for r in results["runs"][k])
            ]
            if not shares:
                continue
            worst, key = max(shares)
            if small:
                lines.append(
                    f"serial part at batches under {PROXY_BASE} ({source}; no target, for "
                    f"reference): largest median share {worst:.1%} ({key})"
                )
            else:
                lines.append(
                    f"serial part (CPU outside the decode pool) at batches of {PROXY_BASE} "
                    f"({source}), largest median share: {worst:.1%} ({key}; target <= 2%): "
                    f"{'met' if worst <= 0.02 else 'NOT met'}"
                )
    full = [
        (summary[k]["threads_busy"]["median"], k)
        for k, c in configs.items()
        if c.loader == "ferrofeed" and c.threads == 16 and cores >= 16
    ]
    if full:
        least, key = min(full)
        lines.append(
            f"threads busy at 16 threads on {cores} cores, smallest median: {least:.0%} "
            f"({key}; target >= 95%): {'met' if least >= 0.95 else 'NOT met'}"
        )
    else:
        lines.append(
            f"threads busy at 16 threads on 16 cores: not measurable here ({cores} cores; "
            "the proxy rows stand in for it)"
        )
    return lines


def _cell(stat: dict[str, float] | None, scale: float = 1.0, digits: int = 0) -> str:
    """`fmt`, or ``-`` for a figure this row does not have."""
    return "-" if stat is None else fmt(stat, scale, digits)


def markdown(results: dict[str, Any]) -> str:
    """The tables: every row, the proxy, ferrofeed against the peers, the targets."""
    cpu, cores = results["cpu"], results["cores"]
    configs = {k: Config(**c) for k, c in results["configs"].items()}
    summary = results["summary"]
    epochs, rounds = results["args"]["epochs"], results["args"]["rounds"]
    data = results["data"]
    lines = [
        f"#### Scaling of the native chain, on {cpu} ({cores} cores)",
        "",
        f"{data['n']:,} JPEGs (image folder"
        + (f", and tar shards of {data['per_shard']}" if data.get("shards") else "")
        + f"), {epochs} timed epoch{'s' * (epochs != 1)} after a "
        f"warm-up, {rounds} round{'s' * (rounds != 1)}: medians (min-max). Threads busy: CPU "
        "of the process tree / wall / T; pool busy: the decode pool's CPU / wall / its threads "
        "at work (per thread); pool runnable: the same with the time they waited for a core; "
        "pool busy (own count): ferrofeed's counter; serial share: CPU outside the decode pool "
        "/ the process's CPU. Rows with more threads than the machine's "
        f"{cores} cores say so.",
        "",
        "| loader | source | job | threads | batch | images/thread/batch | images/s "
        "| threads busy (%) | pool busy (%) | pool runnable (%) | pool busy, own count (%) "
        "| serial share (%) | CPU ms/image | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, cfg in configs.items():
        s, runs = summary[key], results["runs"][key]
        in_pool = cfg.loader != "ferrofeed" or all(r["decode_in_pool"] for r in runs)
        label = LABELS[cfg.loader]
        label = f"**{label}**" if cfg.loader == "ferrofeed" else label
        per_thread = _cell(s["pool_busy"], 100) if in_pool else "-"
        runnable = _cell(s["pool_runnable"], 100) if in_pool else "-"
        serial = _cell(s["serial_share"], 100, 1) if in_pool else "-"
        lines.append(
            f"| {label} | {cfg.source} | {JOB_NAMES[cfg.job]} | {cfg.threads} | {cfg.batch} "
            f"| {cfg.per_thread:g} | {fmt(s['images_per_s'])} | {_cell(s['threads_busy'], 100)} "
            f"| {per_thread} | {runnable} | {_cell(s['decode_busy'], 100)} | {serial} "
            f"| {fmt(s['cpu_ms_per_image'], digits=2)} | {results['notes'].get(key, '')} |"
        )
    lines.append("")
    if results["proxy"]:
        lines += [
            "Two images per thread per batch (what batches of 32 on 16 threads give each "
            "thread), against batches of 32 on as many threads: training job, image folder "
            "(ratios per round, then median and range):",
            "",
            "| loader | threads | batch | images/s | batch 32, images/s | small batch / batch 32 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for p in results["proxy"]:
            lines.append(
                f"| {LABELS[p['loader']]} | {p['threads']} | {p['batch']} "
                f"| {fmt(summary[p['small']]['images_per_s'])} "
                f"| {fmt(summary[p['base']]['images_per_s'])} | {fmt_ratio(p['ratio'])} |"
            )
        lines.append("")
    if results["peer_ratios"]:
        lines += [
            "ferrofeed's native chain against each peer with as many worker processes as it "
            "has threads, same batch size, image folder (per round, then median and range; "
            "above 1 is better for ferrofeed):",
            "",
            "| job | threads | batch | against | images/s | less CPU per image |",
            "|---|---:|---:|---|---:|---:|",
        ]
        for key, by_peer in results["peer_ratios"].items():
            cfg = configs[key]
            for peer, r in by_peer.items():
                lines.append(
                    f"| {JOB_NAMES[cfg.job]} | {cfg.threads} | {cfg.batch} | {LABELS[peer]} "
                    f"| {fmt_ratio(r['throughput'])} | {fmt_ratio(r['cpu_per_image_less'])} |"
                )
        lines.append("")
    if results["not_run"]:
        lines += ["Not run:", ""]
        lines += [f"- {LABELS[k]}: {why}" for k, why in results["not_run"].items()]
        lines.append("")
    lines += ["Targets:", ""] + [f"- {t}" for t in results["targets"]] + [""]
    return "\n".join(lines)


def report(results: dict[str, Any], out_dir: Path, name: str) -> None:
    """Write ``{name}.md`` into ``out_dir`` and print it."""
    md = write_markdown(out_dir, name, markdown(results))
    print(f"results: {out_dir / f'{name}.json'}, {md}")


def progress_line(cfg: Config, r: dict[str, Any], cores: int) -> str:
    """One run's figures, as printed when it ends."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    # Where the pool did not decode (one thread), its figures mean nothing: "-", as in the table.
    in_pool = bool(r["decode_in_pool"])
    serial = r["serial_share"] if in_pool else None
    return (
        f"{cfg.key:34s} {r['images_per_s']:7.0f} images/s, threads busy "
        f"{pct(r['threads_busy'])}, pool busy {pct(r['pool_busy'] if in_pool else None)}, "
        f"serial {'-' if serial is None else f'{serial:.1%}'}, {r['cpu_ms_per_image']:5.2f} CPU "
        f"ms/image" + (f" ({note(cfg, [r], cores)})" if note(cfg, [r], cores) else "")
    )
