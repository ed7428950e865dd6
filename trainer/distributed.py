"""Multi-host start-up: `jax.distributed` from the environment a cluster gives each process.

* Vertex AI custom jobs (GPU hosts) set `CLUSTER_SPEC`: worker pool 0 is the
  chief, whose first address is the coordinator.
* Cloud TPU slices are found by `jax.distributed.initialize()` itself.
* One host: nothing to do.
"""

from __future__ import annotations

import json
import os

COORDINATOR_PORT = 8476


def cluster_from_spec(spec: str) -> dict | None:
    """`jax.distributed.initialize` arguments from a Vertex `CLUSTER_SPEC`, or None for a single process.

    Processes are numbered pool by pool (workerpool0 first), then by index.
    """
    values = json.loads(spec)
    cluster, task = values.get("cluster", {}), values.get("task", {})
    pools = sorted(name for name in cluster if name.startswith("workerpool"))
    hosts = [(pool, index) for pool in pools for index in range(len(cluster[pool]))]
    if len(hosts) <= 1:
        return None
    chief = cluster[pools[0]][0].split(":")[0]
    return {"coordinator_address": f"{chief}:{COORDINATOR_PORT}", "num_processes": len(hosts),
            "process_id": hosts.index((task["type"], int(task["index"])))}


def initialize_from_environment() -> None:
    """Starts `jax.distributed` when this process is one of several; before any JAX computation."""
    import jax

    spec = os.environ.get("CLUSTER_SPEC")
    if spec:
        arguments = cluster_from_spec(spec)
        if arguments:
            jax.distributed.initialize(**arguments)
        return
    if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:  # a multi-host TPU slice
        jax.distributed.initialize()
