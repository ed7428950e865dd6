"""One process of the late-process test: `python late_process_worker.py ADDRESS ID DELAY_SECONDS`.

Two processes with one CPU device each sum an array split across them; process
1 reaches the sum `DELAY_SECONDS` late, as a process does that compiles on a
loaded host. Prints the sum.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trainer import distributed  # noqa: E402


def main(address: str, process_id: int, delay: float) -> None:
    distributed.initialize(distributed.ProcessGroup(address, 2, process_id))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((2,), ("x",))
    values = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("x")),
                                                    np.full((1,), process_id + 1, np.float32))
    total = distributed.RunTogether(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec())), "sum")
    if process_id == 1:
        time.sleep(delay)
    print(f"sum {float(total(values))}", flush=True)


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
