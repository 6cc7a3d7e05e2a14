"""Train a small model with JAX on batches from ferrofeed's DataLoader, data-parallel.

Run: python examples/jax_train.py [--steps 100] [--smoke]
On a CPU, see it on 8 devices:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/jax_train.py

A logistic regression on generated data (two Gaussian blobs). Each batch arrives as global
JAX arrays laid out over every device (``sharding=``: the batch cut along a "data" mesh
axis, each device holding its rows, placed two batches ahead of the step); the parameters
are replicated, and `jax.jit` runs the step where the data is, averaging the gradients
over the devices itself.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from ferrofeed import DataLoader
from jax.sharding import NamedSharding, PartitionSpec


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
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    batch_size = 16 * jax.local_device_count()  # this process's part of each global batch
    loader = DataLoader(
        make_samples(2048),
        batch_size=batch_size,
        shuffle=True,
        output="jax",
        sharding=NamedSharding(mesh, PartitionSpec("data")),
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.device_put({"w": jnp.zeros(8), "b": jnp.zeros(())}, replicated)
    done, losses = 0, []
    while done < steps:
        for batch in loader:
            params, loss = step(params, batch["x"], batch["y"].astype(jnp.float32))
            losses.append(float(loss))
            done += 1
            if done == steps:
                break
    print(
        f"trained {steps} steps on {jax.device_count()} device(s); "
        f"first loss {losses[0]:.3f}, last {losses[-1]:.3f}"
    )


if __name__ == "__main__":
    main()
