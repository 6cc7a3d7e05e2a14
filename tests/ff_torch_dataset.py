"""A torch Dataset over a SharedList, importable by DataLoader spawn workers.

Not a test module (pytest does not collect it); ``test_multiprocess`` imports it only after
``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any

import torch.utils.data
from ferrofeed import SharedList


class SharedListDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset; each sample is ``(index, sha256 of the item's pickle, worker pid)``."""

    def __init__(self, items: SharedList) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, str, int]:
        item: Any = self.items[index]
        digest = hashlib.sha256(pickle.dumps(item, protocol=5)).hexdigest()
        return index, digest, os.getpid()
