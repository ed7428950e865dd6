"""What `device_check.py` sets beside each row: the plan's bytes as the device's (`trainer/plan/device_bytes.py`),
the compilers the plan modelled against the device's, and the autotuning choice of each row.

A plan file (`device_plan.py`) holds, per row, the target compiler's figure (`compiler_total_bytes`; files written
before the device's terms hold it as `total_bytes`) and the plan's total. The device check recomputes the total from the
compiler's figure and the terms the row measured of its own program (`state_bytes`, the convolutions' tensors, the
weights placed before compiling, whether it autotuned), through the same `device_bytes.planned` the plan uses, so
a row run without autotuning is planned without workspace, and a file written before the terms existed is read
with them.
"""

from __future__ import annotations

import re

TERM_FIELDS = ("state_bytes", "largest_convolution_bytes", "autotuning_convolution_bytes",
               "placed_before_compile_bytes")


def planned_for(plan: dict | None, row: dict, size: int) -> dict | None:
    """The plan file's row for `row` at `size`³ (`device_plan.py`): bytes, roofline seconds, whether it fits."""
    for entry in (plan or {}).get("rows", []):
        if all(entry.get(k) == row[k] for k in ("part", "model", "precision", "augmentation")) and entry["size"] == size:
            found = {"total_bytes": entry["total_bytes"], "step_seconds": entry["step_seconds"],
                     "bound": entry.get("bound"), "fits": entry.get("fits"), "source": plan["source"]}
            if entry["total_bytes"] is None and entry.get("target_total_bytes"):  # past fullres plan's CPU pre-filter
                found.update(total_bytes=entry["target_total_bytes"], note=entry.get("note"))
            found["compiler_total_bytes"] = entry.get("compiler_total_bytes", found["total_bytes"])
            if entry.get("expected_compile_seconds") is not None:
                found["expected_compile_seconds"] = entry["expected_compile_seconds"]
            if entry.get("step_source"):
                found["step_source"] = entry["step_source"]
            return found
    return None


def with_device_terms(planned: dict | None, measured: dict, target_kind: str) -> dict | None:
    """`planned` with the device's bytes for the program the row ran: the compiler's figure of the plan plus
    `device_bytes.planned`'s terms for the row's own state, convolutions and autotuning; unchanged where the row
    measured no terms (it did not run, or a stand-in answered)."""
    if not planned or not planned.get("compiler_total_bytes") or measured.get("state_bytes") is None:
        return planned
    from trainer.plan import device_bytes, targets

    terms = device_bytes.planned(planned["compiler_total_bytes"], "cuda", **{k: measured.get(k) or 0 for k in
                                 TERM_FIELDS}, autotune=measured.get("autotune", True))
    limit = device_bytes.usable_bytes(targets.hardware(target_kind)["memory_bytes"], "cuda")
    return {**planned, "plan_file_total_bytes": planned["total_bytes"], "total_bytes": terms.total_bytes,
            "device_terms": terms.to_json(), "fits": terms.total_bytes <= limit,
            "source": f"{planned['source']}; + device_bytes terms for the program this row ran"}


def autotune_choice(planned: dict | None, roofline_seconds: float | None, limit_seconds: float) -> tuple[bool, str]:
    """(autotune, why) for a row: off where the plan expects the autotuning alone to pass the row's time limit
    (the largest cubes: the 512³ float32 step had not compiled after 450 s on an H200), so the row compiles and
    measures within its limit; the row records the choice and is planned for it."""
    from trainer.plan import device_bytes

    seconds = (planned or {}).get("expected_compile_seconds")
    if seconds is None:
        seconds = device_bytes.expected_compile_seconds(roofline_seconds or (planned or {}).get("step_seconds"),
                                                        "cuda")
    if seconds is not None and seconds > limit_seconds:
        return False, (f"--xla_gpu_autotune_level=0: the plan expects at least {seconds:.0f} s of autotuning, past "
                       f"the row's {limit_seconds:.0f} s")
    return True, "XLA's default autotuning"


def _version(text: str, name: str) -> str | None:
    found = re.search(rf"\b{re.escape(name)} ([0-9][0-9.]*)", text or "")
    return found[1] if found else None


def plan_versions(plan: dict | None) -> dict:
    """The compilers a plan file modelled: its `compiler_versions`, or (files written before the device's terms) those named
    in its `source`."""
    if not plan:
        return {}
    if plan.get("compiler_versions"):
        return dict(plan["compiler_versions"])
    return {name: version for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin")
            if (version := _version(plan.get("source", ""), name))}


def version_drift(planned: dict, device: dict) -> list[str]:
    """Where the device's compiler is not the one the plan modelled: 'jax: plan 0.10.2, device 0.11.2', ...; the CUDA
    plug-in compared by version whatever its CUDA (the plan's cuda12, the device's cuda13)."""
    drift = [f"{name}: plan {planned[name]}, device {device[name]}" for name in ("jax", "jaxlib")
             if planned.get(name) and device.get(name) and planned[name] != device[name]]
    plugin = lambda versions: next(((n, v) for n, v in versions.items() if re.fullmatch(r"jax-cuda\d+-plugin", n)),  # noqa: E731
                                   None)
    ours, theirs = plugin(planned), plugin(device)
    if ours and theirs and ours != theirs:
        drift.append(f"CUDA plug-in: plan {ours[0]} {ours[1]}, device {theirs[0]} {theirs[1]}")
    return drift
