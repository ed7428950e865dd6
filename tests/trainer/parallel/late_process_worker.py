"""One process of the late-process test: `python late_process_worker.py ADDRESS ID DELAY_SECONDS`.

Two processes with two CPU devices each. Process 1 comes `DELAY_SECONDS` late,
as a process does that compiles on a loaded host, twice: to placing a state on
the mesh (JAX checks with a collective between the processes' first devices
that both put the same values) and to a sum over all four devices (a program
whose collective spans a new set of devices). Prints the sum. Then process 1
compiles a program that only it runs (`written_by_process_1`), for the test
that every process of a CPU run writes the compilation cache.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from trainer.parallel import distributed  # noqa: E402


def main(address: str, process_id: int, delay: float) -> None:
    distributed.initialize(distributed.ProcessGroup(address, 2, process_id))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from trainer.engine import placement
    from trainer.parallel import device_mesh, partitioning

    distribution = device_mesh.make_distribution(partitioning.PartitionConfig((1, 4, 1, 1, 1)))
    if process_id == 1:
        time.sleep(delay)
    state = placement.place_state(placement.TrainState([np.arange(3, dtype=np.float32)], [], []), distribution)

    mesh = jax.make_mesh((4,), ("x",))
    values = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("x")),
                                                    np.full((2,), process_id + 1, np.float32))
    total = distributed.RunTogether(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec())), "sum")
    if process_id == 1:
        time.sleep(delay)
    print(f"sum {float(total(values))}, state {state.trainable[0].sharding.is_fully_replicated}", flush=True)
    if process_id == 1:  # a program only this process compiles, on its own device: process 0 cannot write it
        def written_by_process_1(x):
            return jnp.cos(x) * 3 + 1

        print(f"process 1 alone: {float(jax.jit(written_by_process_1)(np.ones(3, np.float32)).sum()):.3f}",
              flush=True)


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
