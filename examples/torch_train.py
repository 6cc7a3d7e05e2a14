"""Train a small CNN with PyTorch on batches from ferrofeed's DataLoader.

Run: python examples/torch_train.py [--steps 50] [--smoke]

The dataset makes 32x32 RGB images at run time (a bright square on noise; the label is the
quadrant the square sits in), so the example needs no download. Batches arrive as torch
tensors, handed over by DLPack without a copy, and move to the GPU when there is one.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from ferrofeed import DataLoader
from torch import nn


class Quadrants(torch.utils.data.Dataset):  # a plain map-style dataset: len + getitem
    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray | int]:
        rng = np.random.default_rng(self.seed * 1_000_003 + i)
        image = rng.integers(0, 64, size=(32, 32, 3), dtype=np.uint8)
        label = int(rng.integers(0, 4))
        y, x = divmod(label, 2)
        image[y * 16 + 4 : y * 16 + 12, x * 16 + 4 : x * 16 + 12] = 255
        return {"image": image, "label": label}


def to_input(images: torch.Tensor) -> torch.Tensor:
    """HWC uint8 -> CHW float in [0, 1]."""
    return images.permute(0, 3, 1, 2).float().div_(255)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="a few steps, for CI")
    args = parser.parse_args()
    steps = 20 if args.smoke else args.steps
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 4),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(
        Quadrants(4096),
        batch_size=64,
        shuffle=True,
        seed=0,
        num_threads=2,
        output="torch",
        device=device if device == "cuda" else None,
    )
    step, losses = 0, []
    while step < steps:
        for batch in loader:  # one epoch; the next pass reshuffles
            logits = model(to_input(batch["image"]))
            loss = nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % 10 == 0 or step == steps:
                print(f"step {step:4d}  loss {np.mean(losses[-10:]):.3f}")
            if step == steps:
                break
    print(f"trained {steps} steps on {device}; first loss {losses[0]:.3f}, last {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
