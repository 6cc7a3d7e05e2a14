"""What benches/remote_compare.py runs: each configuration (`Config`: which loader, where
the shards are, how they are reached; `CONFIGS`) and the pairs it compares round by round.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """One configuration: which loader, where the shards are, how they are reached."""

    key: str
    label: str
    family: str  # ferrofeed | webdataset
    where: str  # local | s3 | http
    latency: bool = False
    cache: bool = False
    index: bool = False  # ferrofeed over S3: read through the bucket's sample index
    baseline: str = ""  # the configuration its images/s are set against, round by round


CONFIGS = [
    Config("local", "ferrofeed, local disk", "ferrofeed", "local"),
    Config("s3", "ferrofeed, S3 (moto)", "ferrofeed", "s3", baseline="local"),
    Config(
        "s3-latency", "ferrofeed, S3 + 20 ms/request", "ferrofeed", "s3", True, baseline="local"
    ),
    Config(
        "s3-latency-cache",
        "ferrofeed, S3 + 20 ms/request, cache_dir",
        "ferrofeed",
        "s3",
        True,
        True,
        baseline="local",
    ),
    Config(
        "s3-latency-index",
        "ferrofeed, S3 + 20 ms/request, sample index",
        "ferrofeed",
        "s3",
        True,
        index=True,
        baseline="local",
    ),
    Config("webdataset-local", "webdataset, local disk", "webdataset", "local"),
    Config(
        "webdataset-http",
        "webdataset, HTTP (curl)",
        "webdataset",
        "http",
        baseline="webdataset-local",
    ),
    Config(
        "webdataset-http-latency",
        "webdataset, HTTP (curl) + 20 ms/request",
        "webdataset",
        "http",
        True,
        baseline="webdataset-local",
    ),
]
BY_KEY = {c.key: c for c in CONFIGS}
# ferrofeed against webdataset where both read the same place the same way.
PAIRS = [
    ("local", "webdataset-local"),
    ("s3", "webdataset-http"),
    ("s3-latency", "webdataset-http-latency"),
]
COLORS = {"ferrofeed": "#7570b3", "webdataset": "#d95f02"}
