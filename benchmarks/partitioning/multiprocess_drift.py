"""Where 2-process and 1-process weights part after N steps: per-step gradients, Adam against SGD.

Runs the same N training steps (the parity test's model and fixed batch,
`1,8,1,1,1`, learning rate 1e-2 as the smoke preset) three times per
optimizer: 1 process × 8 devices twice (is it reproducible bit for bit?) and
2 processes × 4 devices (gloo between them). Prints, per step, the largest
per-tensor relative difference of the gradients and of the weights between the
runs, and at the end how many gradient elements of step 1 changed sign.

    uv run python benchmarks/partitioning/multiprocess_drift.py [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPOSITORY)

DIMS = (1, 8, 1, 1, 1)


def _steps(address: str, num_processes: int, process_id: int, optimizer_name: str, steps: int, output: str) -> None:
    """One process: `steps` steps, saving each step's gradients and the final weights (process 0)."""
    from trainer.parallel import distributed

    if num_processes > 1:
        distributed.initialize(distributed.ProcessGroup(address, num_processes, process_id))
    import jax
    import keras
    import numpy as np

    from tests.trainer.parallel import multiprocess_parity_worker as worker
    from trainer.engine import placement, program, step
    from trainer.models import losses, unet
    from trainer.parallel import device_mesh, partitioning

    keras.utils.set_random_seed(0)
    model = unet.build_unet(unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=4, stem="none"))
    optimizer = keras.optimizers.Adam(1e-2) if optimizer_name == "adam" else keras.optimizers.SGD(1e-2)
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(DIMS))
    state = placement.place_state(program.initial_state(model, optimizer), distribution)
    images, labels = worker.batch()
    rows = placement.process_rows(distribution.get_data_layout(images.shape).backend_layout, images.shape)
    placed = placement.place_batch(distribution, images[rows], labels[rows], batch_size=images.shape[0], rows=rows)
    shardings = (placement.state_shardings(state, distribution), placed[0].sharding, placed[1].sharding)
    grads_of = jax.jit(step.make_loss_and_grads(model, losses.dice_cross_entropy), in_shardings=shardings)
    train_step = jax.jit(step.make_train_step(model, optimizer, losses.dice_cross_entropy),
                         in_shardings=(*shardings, None))  # the step number: unused without `prepare`
    saved = {}
    for number in range(steps):
        _, grads, _ = grads_of(state, *placed)
        saved.update({f"grad{number:03d}_{i:03d}": np.asarray(g) for i, g in enumerate(grads)})
        state, _ = train_step(state, *placed, np.int32(number))
        saved.update({f"weight{number:03d}_{i:03d}": np.asarray(w) for i, w in enumerate(state.trainable)})
    if jax.process_index() == 0:
        np.savez(output, **saved)


def _run(optimizer_name: str, num_processes: int, steps: int, output: str) -> None:
    from trainer.parallel import local_launcher

    address = f"localhost:{local_launcher.free_port()}"
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    environment.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // num_processes}", JAX_PLATFORMS="cpu",
                       KERAS_BACKEND="jax", PYTHONPATH=REPOSITORY)
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", address, str(num_processes), str(i),
                                   optimizer_name, str(steps), output], env=environment, cwd=REPOSITORY)
                 for i in range(num_processes)]
    assert [p.wait() for p in processes] == [0] * num_processes


def _largest(a, b, prefix: str, number: int) -> float:
    import numpy as np

    keys = sorted(k for k in b.files if k.startswith(f"{prefix}{number:03d}_"))
    return max(float(np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k])) for k in keys if np.linalg.norm(b[k]) > 0)


def main() -> None:
    from common import parsing

    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        address, n, i, name, steps, output = sys.argv[2:]
        _steps(address, int(n), int(i), name, int(steps), output)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--keep", help="keep the runs' arrays in this folder (default: a temporary one)")
    arguments = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as temporary:
        directory = arguments.keep or temporary
        for name in parsing.parse_list(arguments.optimizers, str, "--optimizers"):
            paths = {}
            for label, processes in (("1x8", 1), ("1x8 again", 1), ("2x4", 2)):
                paths[label] = os.path.join(directory, f"{name}-{label.replace(' ', '_')}.npz")
                _run(name, processes, arguments.steps, paths[label])
            runs = {label: np.load(path) for label, path in paths.items()}
            reference = runs["1x8"]
            print(f"{name}: largest per-tensor relative difference against 1 process x 8 devices")
            print("step  grads(1x8 again)  weights(1x8 again)  grads(2x4)  weights(2x4)")
            for number in range(arguments.steps):
                print(f"{number + 1:4d}  {_largest(runs['1x8 again'], reference, 'grad', number):16.2e}  "
                      f"{_largest(runs['1x8 again'], reference, 'weight', number):18.2e}  "
                      f"{_largest(runs['2x4'], reference, 'grad', number):10.2e}  "
                      f"{_largest(runs['2x4'], reference, 'weight', number):12.2e}")
            keys = [k for k in reference.files if k.startswith("grad000_")]
            flipped = sum(int(np.sum(np.sign(runs["2x4"][k]) != np.sign(reference[k]))) for k in keys)
            total = sum(reference[k].size for k in keys)
            print(f"{name}: step-1 gradient elements of another sign in 2x4: {flipped} of {total}")
            first = next(n for n in range(arguments.steps) if _largest(runs["2x4"], reference, "grad", n) > 1e-4)
            for key in sorted(k for k in reference.files if k.startswith(f"grad{first:03d}_")):
                a, b = runs["2x4"][key], reference[key]
                changed = np.abs(a - b) > 1e-3 * np.abs(b).max()
                if changed.any():
                    print(f"{name} step {first + 1} {key[8:]} {b.shape}: {int(changed.sum())} of {b.size} elements "
                          f"differ by > 1e-3 of the largest; relative {np.linalg.norm(a - b) / np.linalg.norm(b):.1e}")


if __name__ == "__main__":
    main()
