"""What `fullres plan` prints: the table of layouts per N (`table`) and, on a target, the lines it ends with
(`launch_lines`: the compilers modelled, the device's terms, the layout to launch and the submit parameters).

`memory_plan.run` finds the plan (`memory_plan.Plan`); this module only writes it out.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import sizes
from trainer.parallel import xla_compile
from trainer.plan import device_bytes, launch, layout_search, ring_traffic


def _step_time(seconds: float | None) -> str:
    """'~12.3 ms': a roofline estimate (`roofline`), marked as one."""
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"~{seconds * 1e6:.3g} µs"
    return f"~{seconds * 1e3:.3g} ms" if seconds < 1 else f"~{seconds:.3g} s"


def table(results: Sequence[layout_search.Search], header: str, device_memory: str | None = None) -> list[str]:
    """The plan as text lines: one block per N, rows best first (≈ marks near-ties), what was pruned, the pick.

    On a target, two columns more: the same layout's total on this machine's CPU, and the estimated step time
    (`roofline`; "~" marks it an estimate).
    """
    on_target = any(r.cpu_total_bytes is not None for result in results for r in result.rows)
    extra = f" {'CPU plan':>10} {'step (est.)':>11}" if on_target else ""
    attention = ring_traffic.has_attention([r for result in results for r in result.rows])
    lines = [header]
    lines.append(f"{'rank':>4} {'N':>4} {'dims':<16} {'activations':>12} {'arguments':>10} {'total':>10}{extra} "
                 f"{'E(N)':>6} {'all-gathers':>11} {'halo/step':>10} {'÷ bound':>8}"
                 f"{ring_traffic.HEADER if attention else ''} {'all-to-all':>10}  fits")
    for result in results:
        for r in result.rows:
            efficiency = "" if r.efficiency is None else f"{r.efficiency:.3f}"
            ratio = "" if r.halo_ratio is None else f"{r.halo_ratio:.2f}"
            fits = "" if r.fits is None else ("yes" if r.fits else "no")
            mark = f"{r.rank}{'≈' if r.near_tie else ''}" if r.rank else ""
            more = ""
            if on_target:
                cpu = "" if r.cpu_total_bytes is None else sizes.human_bytes(r.cpu_total_bytes)
                more = f" {cpu:>10} {_step_time((r.estimate or {}).get('seconds')):>11}"
            lines.append(f"{mark:>4} {r.partitions:>4} {','.join(map(str, r.input_partition_dims)):<16} "
                         f"{sizes.human_bytes(r.temp_bytes):>12} {sizes.human_bytes(r.argument_bytes):>10} "
                         f"{sizes.human_bytes(r.total_bytes):>10}{more} "
                         f"{efficiency:>6} {r.activation_all_gathers:>11} {sizes.human_bytes(r.halo_bytes):>10} {ratio:>8}"
                         f"{ring_traffic.cells(r) if attention else ''} {sizes.human_bytes(r.all_to_all_bytes):>10}  {fits}")
        for r in result.rows:
            warning = device_bytes.compile_warning(r.expected_compile_seconds)
            if warning:
                lines.append(f"     N={result.partitions}: {','.join(map(str, r.input_partition_dims))}: {warning}")
            if r.compiler_options:
                lines.append(f"     N={result.partitions}: {','.join(map(str, r.input_partition_dims))} "
                             f"{xla_compile.describe(r.compiler_options)}; fullres train does the same")
            if r.gathered:
                layers = ", ".join(f"{layer or '(outside any layer)'} ({sizes.human_bytes(size)} per device)"
                                   for layer, size in r.gathered)
                lines.append(f"     N={result.partitions}: {','.join(map(str, r.input_partition_dims))} all-gathers "
                             f"whole activations in {layers}; fullres train refuses it without --allow-gathers")
        for dims, cpu_bytes in result.over_estimate:
            lines.append(f"     N={result.partitions}: {','.join(map(str, dims))} not compiled for the target: its CPU "
                         f"figure, {sizes.human_bytes(cpu_bytes)} per device, "
                         f"{result.over_estimate_why or f'already exceeds {device_memory}'}")
        if result.not_compiled:
            lines.append(f"     N={result.partitions}: not compiled within --max-minutes: "
                         f"{' '.join(','.join(map(str, d)) for d in result.not_compiled)}")
        if result.cannot_divide:
            lines.append(f"     N={result.partitions}: not planned: {result.cannot_divide}")
        elif result.replaced:
            lines.append(f"     N={result.partitions}: {result.replaced}")
        elif result.pruned:
            lines.append(f"     N={result.partitions}: {layout_search.pruned_line(result.pruned)}")
        if len(result.rows) > 1 and result.rows[0].rank:
            best = result.rows[0]
            if device_memory is None:
                leanest = min(r.total_bytes for r in result.rows)
                lines.append(f"     N={result.partitions}: no --device-memory, so layouts within 2 % of the leanest "
                             f"({sizes.human_bytes(leanest)}) rank first, by halo; give --device-memory to rank all that fit by halo")
            ties = [r for r in result.rows if r.near_tie and r is not best]
            lines.append(f"     N={result.partitions}: best {','.join(map(str, best.input_partition_dims))} "
                         f"({sizes.human_bytes(best.halo_bytes)} halo, {sizes.human_bytes(best.total_bytes)} per device; "
                         f"{len(result.rows)} layouts compiled in {result.seconds:.0f} s)"
                         + (f"; within 2 % on halo: {' '.join(','.join(map(str, r.input_partition_dims)) for r in ties)}"
                            if ties else ""))
        for refused in result.refused:
            lines.append(f"     N={result.partitions}: {','.join(map(str, refused.input_partition_dims))} "
                         f"{refused.describe()}: the target's compiler refuses it")
    rows = [r for result in results for r in result.rows]
    if device_memory is not None:
        fitting = [r for r in rows if r.fits]
        if fitting:
            smallest = min(fitting, key=lambda r: (r.partitions, r.rank or 0))
            lines.append(f"smallest partitioning that fits {device_memory} per device: {smallest.partitions} "
                         f"(input_partition_dims {list(smallest.input_partition_dims)}, {sizes.human_bytes(smallest.total_bytes)})")
        else:
            tried = sorted({r.partitions for result in results for r in [*result.rows, *result.refused]})
            left = sum(len(result.not_compiled) for result in results)
            lines.append(f"none of {tried} fits {device_memory} per device; "
                         + (f"{left} layout(s) were not compiled within --max-minutes (give it more time), or "
                            if left else "") + "try more partitions, bfloat16 or --remat")
    return lines


def launch_lines(plan) -> list[str]:
    """What the table of `plan` (a `memory_plan.Plan`) ends with on a target: the compilers it modelled, what the
    device adds to their figures, the layout to launch and the `fullres pipeline submit` parameters."""
    lines = [] if plan.compiler is None else [device_bytes.versions_line(plan.compiler["compiler_versions"]),
                                              plan.compiler["device_bytes"]]
    lines += [] if plan.receptive_field is None else [f"receptive field, measured: {plan.receptive_field}"]
    lines += [] if plan.input is None else [plan.input["line"]]
    if plan.launch is None:
        return lines
    found = plan.launch
    lines.append(f"launch on {found['target']}: input_partition_dims {','.join(map(str, found['input_partition_dims']))}, "
                 f"{found['replicas']} replica(s) of {found['cores_per_replica']} devices; "
                 f"{found['hosts']} host(s), one process each")
    host = found.get("host")
    if host:
        count = host.get("cores_for_input")
        cores = (f"{count} core{'s' if count != 1 else ''} to feed its devices (at this host's rate per core), "
                 if count else "")
        lines.append(f"each host: {cores}{sizes.human_bytes(host['cache_bytes_per_process'])} of memory for the "
                     "decoded cache")
    lines += ([found["not_on_vertex"]] if found["vertex"] is None else []) + found.get("left_out", [])
    model = [f"--model {found['model']}"] if found.get("model") else []
    lines.append("fullres pipeline submit ... " + " ".join([*model, *launch.param_lines(found["parameters"])]))
    return lines
