"""Train a small CNN with PyTorch on JPEG files, through ferrofeed's native image chain.

Run: python examples/torch_train.py [--steps 50] [--smoke]

The example first writes its dataset as JPEG files (with Pillow) into a temporary folder,
one subfolder per class, as ImageNet is laid out: 32x32 images of a bright square on
noise, the label being the quadrant the square sits in; so it needs no download. The
DataLoader reads that folder natively (files read, decoded and collated in Rust, as
float32 NCHW in [0, 1]); batches arrive as torch tensors, handed over by DLPack without a
copy, and move to the GPU when there is one.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from ferrofeed import DataLoader, ops
from PIL import Image
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


def write_folder(dataset: Quadrants, root: str) -> None:
    """Write the dataset as root/quadrant_<label>/<i>.jpg."""
    for i in range(len(dataset)):
        sample = dataset[i]
        folder = os.path.join(root, f"quadrant_{sample['label']}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(sample["image"]).save(os.path.join(folder, f"{i}.jpg"), quality=90)


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
    with tempfile.TemporaryDirectory(prefix="ferrofeed-torch-train-") as root:
        write_folder(Quadrants(1024 if args.smoke else 4096), root)
        loader = DataLoader(
            root,  # a folder of class subfolders: the native image chain
            batch_size=64,
            shuffle=True,
            seed=0,
            transform=ops.decode_image(size=32),
            collate=ops.collate(64, layout="NCHW", dtype="float32"),
            num_threads=2,
            output="torch",
            device=device if device == "cuda" else None,
        )
        step, losses = 0, []
        while step < steps:
            for images, labels in loader:  # one epoch; the next pass reshuffles
                logits = model(images)
                loss = nn.functional.cross_entropy(logits, labels)
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
