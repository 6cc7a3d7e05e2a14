"""benches/compare.py (``make compare``): a smoke run on tiny sizes produces its results.

The run goes through the script's own path (fresh interpreters per loader, alternating
rounds, the RAM job through benches/ram_loaders.py, the JSON, the tables, the plots), with
only the loaders installed here; the figures themselves are not checked (benchmarks are not
tests), but their presence, shapes and consistency are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import BENCHES, import_bench

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow

pytest.importorskip("PIL")
pytest.importorskip("skimage")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def runs_here(key: str) -> bool:
    """Whether compare.py finds loader ``key`` usable here (installed, and SPDL's FFmpeg)."""
    loaders = import_bench("_compare_loaders")
    return bool(loaders.available(loaders.BY_KEY[key], None)[0])


class Smoke(NamedTuple):
    results: dict[str, Any]
    out: Path
    ran: list[str]  # the loaders that must have run
    not_run: list[str]  # the loaders asked for that must be reported as not run
    stdout: str


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    out = tmp_path_factory.mktemp("compare")
    ran = ["ferrofeed-native", "ferrofeed-native-flip"]
    ran += [k for k in ("pytorch-w0", "spdl") if runs_here(k)]
    # Never installed in the test environment's interpreter: it must be reported, not run.
    not_run = ["dataloader-rs"]
    # torchvision's loader runs where a torchvision built for the installed torch is there,
    # and is reported as not run where it is not.
    (ran if runs_here("torchvision-w2") else not_run).append("torchvision-w2")
    results, stdout = run_compare(
        out, "compare", ran + not_run, "--ram-n=3000", "--ram-ranks=1", "--ram-workers=2"
    )
    return Smoke(results, out, ran, not_run, stdout)


def run_compare(out: Path, name: str, loaders: list[str], *args: str) -> tuple[Any, str]:
    """Run compare.py ``--quick`` on 32 images, 2 epochs, ``loaders`` and ``args``, into
    ``out``; return its ``{name}.json`` and what it printed."""
    cmd = [
        sys.executable,
        str(BENCHES / "compare.py"),
        "--quick",
        "--n=32",
        "--epochs=2",
        "--pss-interval=0.05",
        f"--loaders={','.join(loaders)}",
        f"--out-dir={out}",
        "--no-progress",
        "--no-torch-import",
        *args,
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads((out / f"{name}.json").read_text()), proc.stdout


def test_every_installed_loader_ran_both_jobs(smoke: Smoke) -> None:
    results, ran = smoke.results, smoke.ran
    assert set(results["summary"]) == {"exact", "train"}
    assert set(results["summary"]["train"]) == set(ran)
    # The native chain's flip variant is a training-job configuration only.
    assert set(results["summary"]["exact"]) == set(ran) - {"ferrofeed-native-flip"}
    for job, by_loader in results["runs"].items():
        for key, runs in by_loader.items():
            assert len(runs) == 1, (job, key)
            r = runs[0]
            assert r["images"] == 32 * 2
            assert len(r["epoch_s"]) == 2
            assert len(r["pss_epoch_end"]) == 2
            assert r["images_per_s"] > 0
            assert r["ttfb_s"] > 0
            # The whole tree's CPU time, seen from outside (exit included), covers the
            # loader's, seen from inside.
            assert r["cpu_tree_s"] >= r["cpu_loader_s"] + r["cpu_before_loader_s"] - 0.05
            assert r["cpu_s_per_1000"] > 0
            assert r["peak_pss"] >= max(r["pss_epoch_end"]) > 0


def test_ratios_pair_ferrofeed_with_each_peer(smoke: Smoke) -> None:
    results = smoke.results
    peers = [k for k in smoke.ran if not k.startswith("ferrofeed")]
    if not peers:
        pytest.skip("no peer loader installed (torch, torchvision, spdl)")
    for job, table in results["ratios"].items():
        ours = [k for k in results["summary"][job] if k.startswith("ferrofeed")]
        assert set(table) == {f"{f} vs {p}" for f in ours for p in peers}
        for f_vs_p, r in table.items():
            f, p = f_vs_p.split(" vs ")
            mine = results["runs"][job][f][0]["images_per_s"]
            theirs = results["runs"][job][p][0]["images_per_s"]
            assert r["throughput"]["median"] == pytest.approx(mine / theirs)


def test_missing_loader_is_said_not_faked(smoke: Smoke) -> None:
    results, out = smoke.results, smoke.out
    assert set(results["not_run"]) == set(smoke.not_run)
    assert "Python >= 3.13" in results["not_run"]["dataloader-rs"]
    for key in smoke.not_run:
        assert key not in results["summary"]["exact"]
        assert key not in results["summary"]["train"]
        # Said when the run starts, and in the tables.
        assert f"skipped {key} (" in smoke.stdout
    said = [
        line for line in (out / "compare.md").read_text().splitlines() if "needs Python" in line
    ]
    assert len(said) == 1
    assert said[0].startswith("- dataloader-rs")
    if "torchvision-w2" in smoke.not_run:
        why = results["not_run"]["torchvision-w2"]
        assert "torchvision is not installed" in why or "fails here" in why


def test_torchvision_loader_gives_the_pillow_rows_batches(smoke: Smoke) -> None:
    """Where it runs: both jobs, its version recorded; the child checked its batches' shape
    and dtype (uint8 NHWC, as the Pillow rows) and count, or the run would have failed."""
    if "torchvision-w2" not in smoke.ran:
        pytest.skip("no torchvision built for the installed torch here")
    results = smoke.results
    assert results["versions"]["torchvision"]
    for job in ("exact", "train"):
        (run,) = results["runs"][job]["torchvision-w2"]
        assert run["children_left"] == 0
        assert run["images"] == 32 * 2


def test_every_figure_names_its_cpu(smoke: Smoke) -> None:
    results, out = smoke.results, smoke.out
    cpu = import_bench("bench_machine").cpu_model()
    assert results["cpu"] == cpu
    assert cpu in results["machine"]
    assert cpu in results["title"]
    headings = [
        line for line in (out / "compare.md").read_text().splitlines() if line.startswith("####")
    ]
    assert len(headings) == 3  # exact, train, metadata only
    assert all(line.endswith(f", on {cpu}") for line in headings), headings


def test_ram_job_and_outputs(smoke: Smoke) -> None:
    results, out = smoke.results, smoke.out
    ram = results["ram"]
    expected = {"ferrofeed DataLoader + SharedList, fork"}
    if importlib.util.find_spec("torch") is not None:
        expected.add("PyTorch DataLoader + list, fork")
    assert {r["container"] for r in ram["runs"]} == expected
    assert ram["layout"] == "1 ranks x 2 workers"
    for r in ram["runs"]:
        assert r["footprint"] is not None
        assert r["footprint"] > 0
        assert r["n"] == 3000
        assert len(r["series"]) >= 2
        assert r["peak_total_pss"] >= r["total_pss_end"] > 0
    md = (out / "compare.md").read_text()
    assert "#### exact 224" in md
    assert "#### training" in md
    assert "#### metadata only" in md
    for name in ("throughput", "cpu", "pss", "ram"):
        png = out / f"compare_{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name


def test_peer_pairs_are_compared_round_by_round() -> None:
    """torchvision's loader against the Pillow one with as many workers: per round, in the
    JSON and in the tables (figures made up: only the arithmetic is checked)."""
    report = import_bench("_compare_report")

    def run(ips: float, cpu: float) -> dict[str, Any]:
        return {"images_per_s": ips, "cpu_s_per_1000": cpu}

    runs = {
        "train": {
            "torchvision-w2": [run(1200, 1.0), run(1100, 1.2)],
            "pytorch-w2": [run(1000, 1.5), run(1000, 1.2)],
            "torchvision-w4": [run(900, 1.0)],  # its peer did not run: no pair
        }
    }
    pairs = report.peer_ratios(runs)
    assert set(pairs) == {"train"}
    assert set(pairs["train"]) == {"torchvision-w2 vs pytorch-w2"}
    r = pairs["train"]["torchvision-w2 vs pytorch-w2"]
    assert r["throughput"]["min"] == pytest.approx(1.1)
    assert r["throughput"]["max"] == pytest.approx(1.2)
    assert r["cpu_per_image_less"]["max"] == pytest.approx(1.5)
    md = report.markdown(
        {
            "cpu": "Some CPU",
            "machine": "Some CPU, x86_64, 2 CPUs, 8 GiB",
            "summary": {"train": {}},
            "ratios": {},
            "peer_ratios": pairs,
            "not_run": {},
        }
    )
    assert "#### training (RandomResizedCrop 224 + random flip), on Some CPU" in md
    row = next(line for line in md.splitlines() if "transforms.v2, 2 workers |" in line)
    assert "| PyTorch DataLoader + Pillow, 2 workers |" in row
    assert "| 1.15x (1.10-1.20) | 1.25x (1.00-1.50) |" in row


def test_torchvision_loader_not_installed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchvision its loaders are not run and say why (the smoke run checks that
    the reason is printed and listed, with dataloader-rs)."""
    loaders = import_bench("_compare_loaders")
    real = loaders.importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "torchvision" else real(name, *args)

    monkeypatch.setattr(loaders.importlib.util, "find_spec", find_spec)
    for key in ("torchvision-w2", "torchvision-w4"):
        assert loaders.available(loaders.BY_KEY[key], None) == (
            False,
            "torchvision is not installed",
        )


@pytest.mark.parametrize(
    ("torch_version", "requirement"),
    [
        ("2.3.1", "torchvision==0.18.*"),
        ("2.9.0+cpu", "torchvision==0.24.*"),
        ("2.13.0", "torchvision==0.28.*"),
        ("2.14.1", "torchvision>=0.29,<0.30"),
        ("2.15.0+cu132", "torchvision>=0.29,<0.31"),
    ],
)
def test_torchvision_requirement_follows_torch(torch_version: str, requirement: str) -> None:
    loaders = import_bench("_compare_loaders")
    assert loaders.torchvision_requirement(torch_version) == requirement


@pytest.mark.parametrize("torch_version", ["1.13.1", "2.2.0", "3.0.0", "nightly"])
def test_torchvision_requirement_refuses_unknown_torch(torch_version: str) -> None:
    loaders = import_bench("_compare_loaders")
    with pytest.raises(ValueError, match="no known torchvision"):
        loaders.torchvision_requirement(torch_version)


# torchvision 0.29 deprecates its image decoders (for TorchCodec's); they still work.
@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_torchvision_job_is_the_pillow_job(tmp_path: Path) -> None:
    """The exact-224 job through torchvision's decoder and v2 transforms gives the Pillow
    rows' images (torch's antialiased uint8 bilinear resize follows Pillow's), HWC uint8;
    the training job gives 224x224x3 uint8 samples that vary from draw to draw."""
    pytest.importorskip("torchvision")
    if not runs_here("torchvision-w2"):
        pytest.skip("torchvision here is not built for the installed torch")
    import numpy as np
    import torch

    loaders, common = import_bench("_compare_loaders"), import_bench("_common")
    files, _ = common.make_jpegs(str(tmp_path), 12, seed=3, varied=True)
    exact, pillow = loaders.TorchvisionJob(files, "exact"), common.PillowExact(files)
    for i in range(len(files)):
        image, label = exact[i]
        want, want_label = pillow[i]
        assert label == want_label
        assert tuple(image.shape) == (224, 224, 3)
        assert image.dtype == torch.uint8
        diff = np.abs(image.numpy().astype(np.int16) - want.astype(np.int16))
        assert diff.mean() < 0.5, (files[i], diff.mean())
    train = loaders.TorchvisionJob(files, "train")
    torch.manual_seed(0)
    draws = [train[0][0] for _ in range(4)]
    assert all(tuple(d.shape) == (224, 224, 3) and d.dtype == torch.uint8 for d in draws)
    assert any(not torch.equal(draws[0], d) for d in draws[1:])


def test_varied_jpegs_are_seeded_and_mixed(tmp_path: Path) -> None:
    make_jpegs = import_bench("_common").make_jpegs
    from PIL import Image

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files, info = make_jpegs(str(tmp_path / "a"), 60, seed=5, varied=True)
    again, _ = make_jpegs(str(tmp_path / "b"), 60, seed=5, varied=True)
    assert [label for _, label in files] == [label for _, label in again]
    assert all(
        Path(a).read_bytes() == Path(b).read_bytes()
        for (a, _), (b, _) in zip(files, again, strict=True)
    )
    modes, progressive, large = set(), 0, 0
    for path, _ in files:
        with Image.open(path) as im:
            modes.add(im.mode)
            progressive += bool(im.info.get("progressive"))
            large += max(im.size) > 500
            assert max(im.size) <= 1000
    assert modes == {"RGB", "L"}
    assert progressive > 0
    assert large > 0
    assert info["grey"] > 0
    assert info["subsampling"]["4:2:0"] > 40


@pytest.fixture(scope="module")
def shards_smoke(tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    """The shards job alone (``--jobs shards --name shards_compare``), as
    ``make compare-shards`` runs it: ferrofeed's three sources, and the peers installed."""
    out = tmp_path_factory.mktemp("shards-compare")
    ran = ["ferrofeed-folder", "ferrofeed-tar"]
    ran += [k for k in ("ferrofeed-parquet", "webdataset-w2", "hf-w2") if runs_here(k)]
    results, stdout = run_compare(
        out,
        "shards_compare",
        ran,
        "--jobs=shards",
        "--name=shards_compare",
        "--shard-size=8",
        "--shuffle-window=12",
    )
    return Smoke(results, out, ran, [], stdout)


@pytest.mark.timeout(360)
def test_the_shards_job_runs_each_source_on_the_same_images(shards_smoke: Smoke) -> None:
    results, out, ran = shards_smoke.results, shards_smoke.out, shards_smoke.ran
    assert set(results["summary"]) == {"shards"}
    assert set(results["summary"]["shards"]) == set(ran)
    shards = results["data"]["shards"]
    assert (shards["shards"], shards["per_shard"], shards["window"]) == (4, 8, 12)
    for key, (r,) in results["runs"]["shards"].items():
        # The child checked every batch's shape and dtype and each epoch's count.
        assert r["images"] == 32 * 2, key
        assert r["children_left"] == 0, key
    # Each ferrofeed source against the image-folder path, round by round.
    pairs = results["peer_ratios"]["shards"]
    assert "ferrofeed-tar vs ferrofeed-folder" in pairs
    assert ("ferrofeed-parquet vs ferrofeed-folder" in pairs) == ("ferrofeed-parquet" in ran)
    peers = [k for k in ran if not k.startswith("ferrofeed")]
    if peers:
        ours = {k for k in ran if k.startswith("ferrofeed")}
        assert set(results["best_peer"]["shards"]) == ours
        assert set(results["ratios"]["shards"]) == {f"{f} vs {p}" for f in ours for p in peers}
    md = (out / "shards_compare.md").read_text()
    assert "#### training (RandomResizedCrop 224 + random flip) from shards" in md
    assert md.splitlines()[0].endswith(f", on {results['cpu']}")
    # One job: one plot with the three metrics side by side.
    assert (out / "shards_compare.png").read_bytes()[:8] == PNG_MAGIC
    assert not (out / "compare.json").exists()


def test_best_peer_is_taken_round_by_round() -> None:
    report = import_bench("_compare_report")

    def run(ips: float) -> dict[str, Any]:
        return {"images_per_s": ips}

    runs = {
        "shards": {
            "ferrofeed-tar": [run(900), run(1000)],
            "webdataset-w2": [run(300), run(450)],
            "hf-w4": [run(400), run(250)],
        }
    }
    best = report.best_peer_ratios(runs)["shards"]["ferrofeed-tar"]
    # Round 1: against hf-w4 (400); round 2: against webdataset-w2 (450).
    assert best["min"] == pytest.approx(1000 / 450)
    assert best["max"] == pytest.approx(900 / 400)
