"""From a plan to a run: what to rent and what to pass, for the layout a plan chose on a target.

`launch` names the layout (`input_partition_dims`), the replicas the target's
devices make of it, the hosts and processes, and how Vertex AI custom training
rents that hardware (`hardware.json`'s `vertex`): the parameters
`fullres pipeline submit` takes (`parameters`; `fullres plan --json` writes
them, and `pipeline submit --plan FILE` reads them back).

On Vertex a TPU slice is one worker pool of `machine_type` and `tpu_topology`
(Vertex starts every host of the slice; JAX finds them itself); GPUs are
`accelerator_count` per host and `replica_count` hosts.
"""

from __future__ import annotations

import math

from trainer.parallel import kernels
from trainer.plan import targets

TPU_ACCELERATOR = {"v4": "TPU_V4_POD", "v5e": "TPU_V5_LITEPOD", "v5p": "TPU_V5P", "v6e": "TPU_V6E",
                   "tpu7x": "TPU7X"}  # the pipeline trains on a slice when tpu_topology is set (any non-CPU name)


def _tpu(target: targets.Target, vertex: dict | None) -> tuple[dict | None, int, str | None]:
    """(Vertex placement or None, hosts, why not on Vertex) for a TPU slice."""
    chips = math.prod(target.shape)
    topology = "x".join(map(str, target.shape))
    if vertex is None:
        return None, max(1, chips // 4), (f"Vertex AI custom training does not offer {target.kind} slices; rent it as "
                                          f"a TPU VM or a GKE node pool (topology {topology}).")
    single = vertex["machine_type_by_chips"].get(str(chips))
    machine = single or vertex["multi_host_machine_type"]
    hosts = 1 if single else max(1, chips // vertex["chips_per_host"])
    return ({"accelerator_type": TPU_ACCELERATOR[target.kind], "machine_type": machine, "tpu_topology": topology,
             "accelerator_count": 1, "replica_count": 1}, hosts, None)


def _gpu(target: targets.Target, vertex: dict | None) -> tuple[dict | None, int, str | None]:
    per_host, hosts = target.shape
    machine = None if vertex is None else vertex["machine_type_by_gpus"].get(str(per_host))
    if machine is None:
        offered = ", ".join(f"{n} per host" for n in (vertex or {}).get("machine_type_by_gpus", {}))
        return None, hosts, (f"Vertex AI custom training offers {target.kind} GPUs as {offered or 'no machine'}, "
                             f"not {per_host} per host.")
    return ({"accelerator_type": vertex["accelerator_type"], "machine_type": machine, "accelerator_count": per_host,
             "replica_count": hosts}, hosts, None)


def _as_it_runs(target: targets.Target, overrides: dict) -> tuple[dict, list[str]]:
    """`overrides` without the kernel settings a program on `target` does not compute (`kernels.for_platform`: a
    TPU program keeps XLA's weight gradients), and a sentence for each one left out."""
    given = {key.removeprefix("kernels."): value for key, value in overrides.items() if key.startswith("kernels.")}
    asked = kernels.KernelsConfig(**{name: str(value).strip() for name, value in given.items()})
    runs = kernels.for_platform(asked, target.platform)
    left = [name for name in given if getattr(runs, name) != getattr(asked, name)]
    said = [f"--set kernels.{name}={getattr(asked, name)} is left out of the launch: a TPU program computes {name} as "
            f"{getattr(runs, name)} whatever it says (the TPU compiler pads each narrow channel of the per-tap products "
            f"to 128 lanes), which is what this plan sized on {target.name}" for name in left]
    return {key: value for key, value in overrides.items() if key not in {f"kernels.{n}" for n in left}}, said


def launch(target: targets.Target, input_partition_dims, batch_per_replica: int, precision: str,
           preset: str | None = None, overrides: dict | None = None) -> dict:
    """What to launch for `input_partition_dims` on all of `target`'s devices (a `cpu` target: None).

    Args:
        target: the plan's target (`targets.parse`).
        input_partition_dims: the layout the plan chose (cores per replica = its product).
        batch_per_replica: examples per replica (the plan's batch size).
        precision: "float32" or "bfloat16".
        preset, overrides: the training preset and any other settings the plan was made with
            (passed on as the pipeline's `preset` and `train_overrides`).

    Returns:
        {"input_partition_dims", "cores_per_replica", "replicas", "devices", "hosts", "processes",
        "vertex" (the placement, or None with "not_on_vertex" saying why), "parameters" (the pipeline's,
        by name: what runs on `target`), "left_out" (a sentence for each override a program there does not take)}.

    Raises:
        ValueError: the layout's cores do not divide the target's devices.
    """
    if target.platform == "cpu":
        return None
    dims = [int(d) for d in input_partition_dims]
    cores = math.prod(dims)
    devices = target.device_count
    if devices % cores:
        raise ValueError(f"--target {target.name} has {devices} devices, which {cores} cores per replica "
                         f"({','.join(map(str, dims))}) do not divide; choose a slice of a multiple of {cores}.")
    replicas = devices // cores
    vertex_figures = targets.hardware(target.kind).get("vertex")
    placement, hosts, why = (_tpu if target.platform == "tpu" else _gpu)(target, vertex_figures)
    parameters = {"input_partition_dims": ",".join(map(str, dims)), "batch_size": batch_per_replica * replicas,
                  "precision": precision}
    if preset and preset != "default":
        parameters["preset"] = preset
    overrides, left_out = _as_it_runs(target, overrides or {})
    if overrides:
        parameters["train_overrides"] = dict(overrides)
    if placement is not None:
        parameters.update(placement)
    return {"target": target.name, "input_partition_dims": dims, "cores_per_replica": cores, "replicas": replicas,
            "devices": devices, "hosts": hosts, "processes": hosts, "vertex": placement, "not_on_vertex": why,
            "parameters": parameters, "left_out": left_out}


def param_lines(parameters: dict) -> list[str]:
    """`--param KEY=VALUE` for each parameter, as `fullres pipeline submit` takes them (dicts as JSON)."""
    import json
    import shlex

    lines = []
    for key, value in parameters.items():
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else (
            str(value).lower() if isinstance(value, bool) else str(value))
        lines.append(f"--param {shlex.quote(f'{key}={text}')}")
    return lines
