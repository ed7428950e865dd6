"""Map where XLA's SPMD partitioner computes a wrong convolution gradient (pure JAX).

A stack of 'SAME' convolutions on an NDHWC volume is differentiated once on one
device and once with the input split across a mesh of virtual CPU devices
(`jax.jit` with a sharded input, GSPMD decides the rest); the script prints,
per case, each layer's voxels per device along each split axis and the largest
relative difference of any kernel gradient against the one-device gradient.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/partitioning/gspmd_min_voxels.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

CHANNELS = 2


def conv_stack_loss(kernels, volume, strides):
    """Sum of squares of a stack of 'SAME' convolutions (NDHWC / DHWIO)."""
    activation = volume
    for kernel, stride in zip(kernels, strides):
        spatial = activation.ndim - 2
        activation = jax.lax.conv_general_dilated(
            activation, kernel, (stride,) * spatial, "SAME",
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC") if spatial == 3 else ("NHWC", "HWIO", "NHWC"))
        activation = jnp.tanh(activation)
    return jnp.sum(activation**2)


def worst_gradient_error(shape, parts, layers, seed=0):
    """Largest relative kernel-gradient difference, split against one device.

    Args:
        shape: spatial shape of the volume, e.g. (8, 4, 4).
        parts: parts per spatial axis, e.g. (2, 2, 1).
        layers: (kernel, stride) per convolution.
    Returns:
        (float, list of per-layer relative differences)
    """
    rng = np.random.default_rng(seed)
    spatial = len(shape)
    volume = jnp.asarray(rng.standard_normal((1, *shape, CHANNELS)), jnp.float32)
    kernels = [jnp.asarray(rng.standard_normal((k,) * spatial + (CHANNELS, CHANNELS)) * 0.3, jnp.float32)
               for k, _ in layers]
    strides = tuple(s for _, s in layers)
    grad = jax.grad(conv_stack_loss)
    reference = jax.jit(grad, static_argnums=2)(kernels, volume, strides)

    split_axes = [i for i, p in enumerate(parts) if p > 1]
    count = int(np.prod([parts[i] for i in split_axes]))
    mesh = Mesh(np.array(jax.devices()[:count]).reshape([parts[i] for i in split_axes]),
                [f"a{i}" for i in split_axes])
    spec = PartitionSpec(None, *[f"a{i}" if parts[i] > 1 else None for i in range(spatial)], None)
    split_volume = jax.device_put(volume, NamedSharding(mesh, spec))
    replicated = NamedSharding(mesh, PartitionSpec())
    split_kernels = [jax.device_put(k, replicated) for k in kernels]
    split = jax.jit(grad, static_argnums=2)(split_kernels, split_volume, strides)
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / (np.max(np.abs(np.asarray(a))) + 1e-30))
              for a, b in zip(reference, split)]
    return max(errors), errors


def voxels_per_device(shape, parts, layers):
    """Each layer's input voxels per device along the split axes ('SAME' padding)."""
    rows, size = [], list(shape)
    for _kernel, stride in layers:
        rows.append(tuple(size[i] / parts[i] for i in range(len(shape)) if parts[i] > 1))
        size = [-(-s // stride) for s in size]
    return rows


CASES = [
    # (label, shape, parts, layers)
    ("zoo repro", (8, 4, 4), (2, 2, 1), [(3, 2), (3, 1)]),
    ("zoo repro, 3D mesh", (8, 4, 4), (2, 2, 2), [(3, 2), (3, 1)]),
    ("2-way D only", (8, 4, 4), (2, 1, 1), [(3, 2), (3, 1)]),
    ("2-way H only (1 vox)", (8, 4, 4), (1, 2, 1), [(3, 2), (3, 1)]),
    ("4-way D (1 vox)", (8, 4, 4), (4, 1, 1), [(3, 2), (3, 1)]),
    ("8-way D (1 vox)", (8, 4, 4), (8, 1, 1), [(3, 1), (3, 1)]),
    ("4-way D, no stride, 1 vox", (4, 4, 4), (4, 1, 1), [(3, 1), (3, 1)]),
    ("2x2 no stride, 1 vox", (4, 2, 4), (2, 2, 1), [(3, 1), (3, 1)]),
    ("2x2 no stride, 1 vox, one conv", (4, 2, 4), (2, 2, 1), [(3, 1)]),
    ("2x2 stride, 2 vox", (8, 8, 4), (2, 2, 1), [(3, 2), (3, 1)]),
    ("2x2 k5, 2 vox (halo>shard)", (4, 4, 4), (2, 2, 1), [(5, 1), (5, 1)]),
    ("2-way k5, 2 vox", (4, 4, 4), (2, 1, 1), [(5, 1), (5, 1)]),
    ("2-way k5, 1 vox", (2, 4, 4), (2, 1, 1), [(5, 1), (5, 1)]),
    ("2x2 k5, 3 vox", (6, 6, 4), (2, 2, 1), [(5, 1), (5, 1)]),
    ("2x2 k3, stride-2 into 1 vox (last layer)", (4, 4, 4), (2, 2, 1), [(3, 2)]),
    ("2x2 stride 2 twice, 1 vox", (16, 8, 4), (2, 2, 1), [(3, 2), (3, 2), (3, 1)]),
    ("2D image 2x2, 1 vox", (4, 4), (2, 2), [(3, 2), (3, 1)]),
    ("2D image 2x2, 2 vox", (8, 8), (2, 2), [(3, 2), (3, 1)]),
]


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    for label, shape, parts, layers in CASES:
        worst, errors = worst_gradient_error(shape, parts, layers)
        per_layer = voxels_per_device(shape, parts, layers)
        verdict = "WRONG" if worst > 1e-4 else "ok"
        print(f"{label:42s} shape={shape} parts={parts} layers={layers} "
              f"vox/dev={per_layer} err={['%.1e' % e for e in errors]} {verdict}")


if __name__ == "__main__":
    main()
