"""One layout's row of a plan: its per-device figures as the compiler gave them, and (on a target) what the device
adds (`device_bytes`), the CPU's figure beside it and an estimated step time."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """Per-device figures of one layout (bytes).

    `halo_bound_bytes` is `layout_measure.lower_bound` for the layout; `near_tie` marks a
    row whose halo is within 2 % of the best-ranked row of its N (memory
    ordered them); `rank` counts from 1 within its N (0: not ranked).
    """

    partitions: int
    input_partition_dims: tuple[int, ...]
    temp_bytes: int
    argument_bytes: int
    total_bytes: int
    efficiency: float | None
    activation_all_gathers: int
    halo_bytes: int
    fits: bool | None = None
    halo_bound_bytes: int | None = None
    rank: int = 0
    near_tie: bool = False
    compile_seconds: float = 0.0
    flops: float | None = None  # per device per step, the compiler's cost analysis (None: it gives none)
    bytes_accessed: float | None = None
    compiler_seconds: float | None = None  # the TPU compiler's own estimate of a step ("optimal_seconds")
    cpu_total_bytes: int | None = None  # on a target: the same layout's total on this machine's CPU
    estimate: dict | None = None  # on a target: `roofline.Estimate.to_json()`, an estimated step time
    cached: bool = False  # read from the plan cache (`target_compile.PlanCache`), not compiled now
    gathered: tuple[tuple[str, int], ...] = ()  # (Keras layer, largest all-gathered activation, bytes per device)
    all_to_all_bytes: int = 0  # per device per step: splits moved between axes (rotation and scaling)
    compiler_total_bytes: int | None = None  # on a target: the compiler's own figure; total_bytes adds the device's
    device_terms: dict | None = None  # on a target: `device_bytes.Terms.to_json()`, how total_bytes was found
    expected_compile_seconds: float | None = None  # on a GPU: at least this long on the device (autotuning)
    compiler_options: str = ""  # what the compile needed beyond the default ("name=value, ..."; xla_compile.py)
    ring_bytes: int = 0  # per device per step: ring attention's keys, values and their gradients (not in halo_bytes)
    attention_score_bytes: int = 0  # per device: the largest block of attention scores a ring forms (ring_traffic)
    unsplit_score_bytes: int = 0  # that layer's scores unsplit (0: no attention split as a ring)

    @property
    def exchange_bytes(self) -> int:
        """What the layout search weighs: halo and ring traffic per device per step."""
        return self.halo_bytes + self.ring_bytes

    @property
    def halo_ratio(self) -> float | None:
        """Measured halo ÷ its lower bound (None where the bound is 0)."""
        return round(self.halo_bytes / self.halo_bound_bytes, 3) if self.halo_bound_bytes else None

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values["input_partition_dims"] = list(self.input_partition_dims)
        values["halo_ratio"] = self.halo_ratio
        return values

    @classmethod
    def from_json(cls, values: dict) -> PlanRow:
        """A row back from `to_json` (e.g. from a benchmark's results)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        row = {k: v for k, v in values.items() if k in fields}
        return cls(**{**row, "input_partition_dims": tuple(row["input_partition_dims"]),
                      "gathered": tuple((layer, size) for layer, size in row.get("gathered", ()))})
