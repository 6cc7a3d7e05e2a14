"""Train a small model with JAX on batches from ferrofeed's DataLoader.

Run: python examples/jax_train.py [--steps 100] [--smoke]

A logistic regression on generated data (two Gaussian blobs); batches arrive as JAX
arrays, taken from ferrofeed's 64-byte aligned buffers by DLPack without a copy.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from ferrofeed import DataLoader


def make_samples(n: int) -> list[dict[str, np.ndarray | int]]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=n)
    centers = np.where(labels[:, None] == 1, 1.5, -1.5)
    features = (centers + rng.normal(size=(n, 8))).astype(np.float32)
    return [{"x": features[i], "y": int(labels[i])} for i in range(n)]


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)


@jax.jit
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help="a few steps, for CI")
    args = parser.parse_args()
    steps = 10 if args.smoke else args.steps
    loader = DataLoader(make_samples(2048), batch_size=128, shuffle=True, output="jax")
    params = {"w": jnp.zeros(8), "b": jnp.zeros(())}
    done, losses = 0, []
    while done < steps:
        for batch in loader:
            params, loss = step(params, batch["x"], batch["y"].astype(jnp.float32))
            losses.append(float(loss))
            done += 1
            if done == steps:
                break
    print(f"trained {steps} steps; first loss {losses[0]:.3f}, last {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
