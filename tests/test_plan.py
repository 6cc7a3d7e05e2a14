"""The epoch plan: which samples each batch holds, for every configuration.

plan_golden.json pins the batches the loader gave before the plan moved into the core
(tests/fixtures/make_plan_golden.py wrote it): the move must not change one of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ferrofeed import DataLoader

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "plan_golden.json").read_text())


# The golden configurations' keys that are DataLoader keywords of the same name.
KEYWORDS = ("shuffle", "seed", "drop_last", "rank", "world_size", "batches_per_epoch")


def _make(config: dict[str, Any]) -> DataLoader:
    loader = DataLoader(
        list(range(config["n"])),
        config["batch_size"],
        num_threads=1,
        **{k: config[k] for k in KEYWORDS},
    )
    loader.set_epoch(config["epoch"])
    return loader


def _id(case: dict[str, Any]) -> str:
    c = case["config"]
    return (
        f"n{c['n']}-b{c['batch_size']}-{'shuf' if c['shuffle'] else 'seq'}"
        f"-{'drop' if c['drop_last'] else 'keep'}-r{c['rank']}of{c['world_size']}"
        f"-bpe{c['batches_per_epoch']}-s{c['seed']}-e{c['epoch']}"
    )


def test_golden_covers_the_grid() -> None:
    assert len(GOLDEN) == 960
    assert any(case["len"] == 0 for case in GOLDEN)
    assert any(case["config"]["batches_per_epoch"] for case in GOLDEN)


@pytest.mark.parametrize("case", GOLDEN, ids=_id)
def test_loader_batches_match_golden(case: dict[str, Any]) -> None:
    loader = _make(case["config"])
    assert len(loader) == case["len"]
    for done, expected in case["batches"].items():
        loader = _make(case["config"])
        loader.load_state_dict({**loader.state_dict(), "batches_done": int(done)})
        assert [b.tolist() for b in loader] == expected, f"resumed at batch {done}"
