"""What benches/ram_loaders.py makes of its runs: the result document (`results`: the
medians per start method and loader, the targets' verdicts, the checks that every loader
read each item once) and its text report (`format_report`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable

from _ram_common import Json, mib, render
from bench_machine import loadavg

LOADER_NAMES = {
    "ferrofeed": "ferrofeed DataLoader + SharedList",
    "torch": "PyTorch DataLoader + list",
}
ONE_COPY_TARGET = 0.10  # ferrofeed within 10% of arena + baseline footprint
TORCH_RATIO_TARGET = 0.5  # ferrofeed <= 0.5x PyTorch's


def results(info: Json, params: Json, configs: list[Json], notes: list[str], wall: float) -> Json:
    """The result document from the configurations run so far."""
    if "loadavg_end" not in info:  # (a results file being rendered again keeps its own)
        info = {**info, "loadavg_end": loadavg()}
    summary = summarise(configs)
    return {
        "machine": info,
        "params": params,
        "wall_s": round(wall, 1),
        "configs": configs,
        "summary": summary,
        "targets": compute_targets(summary),
        "checks": checks(configs, params["n"], params["ranks"]),
        "notes": notes,
    }


def _median(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return int(statistics.median(vals)) if vals else None


def summarise(configs: list[Json]) -> dict[str, dict[str, Json]]:
    """Per method and loader: medians over the rounds of peak / steady / end total PSS."""
    out: dict[str, dict[str, Json]] = {}
    for r in configs:
        entry = out.setdefault(r["method"], {}).setdefault(
            r["loader"], {"runs": 0, "baseline_runs": 0, "aborted": 0, "failed": 0}
        )
        if r.get("error"):
            entry["failed"] += 1
            continue
        key = "baseline" if r["baseline"] else "data"
        entry.setdefault(key, []).append(r)
        entry["baseline_runs" if r["baseline"] else "runs"] += 1
        entry["aborted"] += bool(r.get("aborted"))
    for per_loader in out.values():
        for entry in per_loader.values():
            data, base = entry.pop("data", []), entry.pop("baseline", [])
            for prefix, runs in (("", data), ("baseline_", base)):
                for field in (
                    "peak_total_pss",
                    "steady_total_pss",
                    "end_total_pss",
                    "steady_total_pss_nonfile",
                    "peak_total_pss_nonfile",
                ):
                    entry[prefix + field] = _median(r.get(field) for r in runs)
                    entry[prefix + field + "_all"] = [r.get(field) for r in runs]
            arenas = [s.get("arena_bytes") for r in data for s in r["ranks"]]
            entry["arena_bytes"] = next((a for a in arenas if a), None)
            entry["lower_bound"] = any(r.get("aborted") for r in data)
    return out


def compute_targets(summary: dict[str, dict[str, Json]]) -> list[Json]:
    targets = []
    for method, per_loader in summary.items():
        ff, pt = per_loader.get("ferrofeed"), per_loader.get("torch")
        if ff is None or ff.get("steady_total_pss") is None:
            continue
        t: Json = {"method": method}
        for kind in ("steady", "peak", "steady_nonfile"):
            field = "steady_total_pss_nonfile" if kind == "steady_nonfile" else f"{kind}_total_pss"
            ours = ff[field]
            base = ff[f"baseline_{field}"]
            if base is not None and ff["arena_bytes"]:
                expected = ff["arena_bytes"] + base
                t[f"{kind}_expected"] = expected
                t[f"{kind}_one_copy_ratio"] = round(ours / expected, 4)
            theirs = pt.get(field) if pt is not None else None
            if pt is not None and theirs is None and pt.get("lower_bound") and kind == "steady":
                # Stopped before its last epoch: its peak so far is a lower bound of its
                # steady state (and of everything after).
                theirs = pt.get("peak_total_pss")
            if theirs:
                t[f"{kind}_torch_pss"] = theirs
                t[f"{kind}_torch_ratio"] = round(ours / theirs, 4)
        t["ferrofeed_pss"] = ff["steady_total_pss"]
        t["arena_bytes"] = ff["arena_bytes"]
        t["footprint"] = ff["baseline_steady_total_pss"]
        # The file-backed part of the footprint (the libraries' pages) is the same job's in
        # both runs, but its PSS drops whenever other processes on the machine map the same
        # files (another job importing the same torch), and rises when they exit. So the
        # target also compares like with like: the baseline's anonymous + shmem PSS plus the
        # file-backed PSS of the data run itself.
        data_nonfile, base_nonfile = (
            ff["steady_total_pss_nonfile"],
            ff["baseline_steady_total_pss_nonfile"],
        )
        if None not in (data_nonfile, base_nonfile) and ff["arena_bytes"]:
            file_pss = ff["steady_total_pss"] - data_nonfile
            expected = ff["arena_bytes"] + base_nonfile + file_pss
            t["same_libs_expected"] = expected
            t["same_libs_file_pss"] = file_pss
            t["baseline_file_pss"] = ff["baseline_steady_total_pss"] - base_nonfile
            t["same_libs_one_copy_ratio"] = round(ff["steady_total_pss"] / expected, 4)
        raw = t.get("steady_one_copy_ratio")
        t["one_copy_met_raw"] = None if raw is None else abs(raw - 1.0) <= ONE_COPY_TARGET
        ratio = t.get("same_libs_one_copy_ratio", raw)
        t["one_copy_met"] = None if ratio is None else abs(ratio - 1.0) <= ONE_COPY_TARGET
        torch_ratio = t.get("steady_torch_ratio")
        # PyTorch's figure from an aborted run is a lower bound: the ratio an upper bound.
        t["torch_ratio_upper_bound"] = bool(pt and pt.get("lower_bound"))
        t["torch_met"] = None if torch_ratio is None else torch_ratio <= TORCH_RATIO_TARGET
        targets.append(t)
    return targets


def checks(configs: list[Json], n: int, ranks: int) -> list[Json]:
    """Both loaders read every item: per epoch, the ranks' items, id sums and point counts."""
    out: list[Json] = []
    complete = [r for r in configs if r.get("ok") and not r["baseline"]]
    seen: dict[tuple[int, int, int], list[str]] = {}
    for r in complete:
        for e in range(r["epochs"]):
            per_rank = [s["epochs"][e] for s in r["ranks"]]
            items, ids, points = (
                sum(p[f] for p in per_rank) for f in ("items", "id_sum", "points")
            )
            key = (items, ids, points)
            seen.setdefault(key, []).append(f"{r['label']}#{r['round']}/epoch{e}")
    if complete:
        even = n % ranks == 0
        expected_ids = n * (n + 1) // 2
        ok = len(seen) == 1 and (not even or next(iter(seen))[:2] == (n, expected_ids))
        out.append(
            {
                "name": "every epoch of every loader read each item once (items, id sum, points)",
                "ok": ok,
                "detail": json.dumps({str(k): v for k, v in seen.items()})[:2000],
            }
        )
    failed = [r["label"] for r in configs if r.get("error")]
    out.append({"name": "no configuration failed", "ok": not failed, "detail": ", ".join(failed)})
    return out


def format_report(res: Json) -> str:
    p, info = res["params"], res["machine"]
    out = [
        f"ferrofeed RAM of real loaders: {p['ranks']} ranks x {p['workers']} workers, "
        f"N={p['n']:,} COCO-like annotations, {p['epochs']} epoch(s), batch {p['batch_size']}, "
        f"{p['repeats']} round(s)",
        f"machine: {info['cpu_model']}, {info['cpu_count']} cores, "
        f"{info['mem_total_bytes'] / 2**30:.1f} GiB, Python {info['python']}, ferrofeed "
        f"{info['ferrofeed']}, numpy {info['numpy']}, torch {info.get('torch', '-')}; load "
        f"average {info['loadavg_start'][0]:.2f} at start, {info['loadavg_end'][0]:.2f} at end",
        "",
        "Total PSS of the ranks' process trees (MiB; medians over the rounds)",
    ]
    header = [
        "method",
        "loader",
        "peak",
        "steady",
        "end",
        "baseline",
        "arena",
        "vs 1 copy+imports",
        "vs PyTorch",
    ]
    rows = []
    targets = {t["method"]: t for t in res["targets"]}
    for method, per_loader in res["summary"].items():
        for loader, e in per_loader.items():
            t = targets.get(method, {})
            mark = " (>=, aborted)" if e.get("lower_bound") else ""
            one = ""
            if loader == "ferrofeed" and "steady_one_copy_ratio" in t:
                one = f"{t['steady_one_copy_ratio']:.3f}"
            elif loader == "torch" and e["steady_total_pss"] and t.get("steady_expected"):
                one = f"{e['steady_total_pss'] / t['steady_expected']:.2f}"
            vs = (
                ("<= " if t["torch_ratio_upper_bound"] else "") + f"{t['steady_torch_ratio']:.3f}"
                if loader == "ferrofeed" and "steady_torch_ratio" in t
                else ""
            )
            rows.append(
                [
                    method,
                    LOADER_NAMES[loader] + mark,
                    mib(e["peak_total_pss"]),
                    mib(e["steady_total_pss"]),
                    mib(e["end_total_pss"]),
                    mib(e["baseline_steady_total_pss"]),
                    mib(e["arena_bytes"]),
                    one,
                    vs,
                ]
            )
    out.append(render(header, rows, left=2))
    out.append(
        "  steady: median over the last epoch (every rank iterating) to the end; baseline: "
        f"the same job over {p['baseline_n']:,} items (its steady PSS)"
    )
    out.append("")
    for t in res["targets"]:
        if t.get("steady_one_copy_ratio") is not None:
            verdict = "met" if t.get("one_copy_met_raw") else "MISSED"
            out.append(
                f"{t['method']}: ferrofeed {mib(t['ferrofeed_pss'])} MiB vs arena "
                f"{mib(t['arena_bytes'])} + footprint {mib(t['footprint'])} = "
                f"{mib(t['steady_expected'])} MiB -> {t['steady_one_copy_ratio']:.3f}x "
                f"(target within 10%): {verdict} as measured; peak "
                f"{t.get('peak_one_copy_ratio', 0):.3f}x"
            )
        if t.get("same_libs_one_copy_ratio") is not None:
            verdict = "met" if t["one_copy_met"] else "MISSED"
            out.append(
                f"{t['method']}: the same with the libraries' file-backed PSS taken from the "
                f"data run ({mib(t['same_libs_file_pss'])} MiB; the baseline's: "
                f"{mib(t['baseline_file_pss'])}): {mib(t['ferrofeed_pss'])} vs "
                f"{mib(t['same_libs_expected'])} MiB -> {t['same_libs_one_copy_ratio']:.3f}x: "
                f"{verdict}"
            )
        if t.get("steady_torch_ratio") is not None:
            verdict = "met" if t["torch_met"] else "MISSED"
            bound = (
                " (PyTorch's run was stopped: an upper bound)"
                if t["torch_ratio_upper_bound"]
                else ""
            )
            out.append(
                f"{t['method']}: ferrofeed / PyTorch = {t['steady_torch_ratio']:.3f}x steady, "
                f"{t.get('peak_torch_ratio', 0):.3f}x peak (target <= 0.5x): {verdict}{bound}"
            )
    for t in res["targets"]:
        if t.get("steady_nonfile_one_copy_ratio") is not None:
            line = (
                f"{t['method']}, without file-backed pages (libraries): ferrofeed "
                f"{t['steady_nonfile_one_copy_ratio']:.3f}x one copy + footprint"
            )
            if t.get("steady_nonfile_torch_ratio") is not None:
                line += f", {t['steady_nonfile_torch_ratio']:.3f}x PyTorch"
            out.append(line)
    for c in res["checks"]:
        out.append(
            f"  {'ok  ' if c['ok'] else 'FAIL'}  {c['name']}"
            + ("" if c["ok"] else f"  [{c['detail']}]")
        )
    for note in res["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)
