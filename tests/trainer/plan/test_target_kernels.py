"""The kernel candidates (`trainer/parallel/kernels.py`) on the TPU's compiled training step, without a TPU: per-device
bytes within ±5% of XLA's own ops and no new all-gather, split 2×2 on a v5e:2x2 slice (libtpu, the `tpu` group).

The step is the one `fullres train` runs (`compiled_step.StepBuilder`) for a user's network of every op the
candidates replace (`tests/trainer/kernel_network.py:build3d`: convolutions, InstanceNorm, GroupNorm, BatchNorm,
`Conv3DTranspose` k2 s2 and k3 s2) at 16³ (split 2×2, XLA differentiates its dilated convolution right from
16 voxels: `thin_shards`), batch 1: small, so that four TPU compiles stay cheap. Split, a transposed convolution
is already sub-pixel (`split_ops`), so `conv_transpose=subpixel` lowers to the very same program, and a TPU program
keeps XLA's weight gradients, `taps` and `float32` alike, and XLA's transposed convolutions for `padded`
(`kernels.for_platform`: the per-tap products took 8.29 MiB per device here, the interior-padded activations 7.77 MiB,
against 0.77 MiB, narrow channels padded to 128 lanes); `norm=fused` changes it.
"""

import re

import pytest

from trainer.plan import compiled_step, gathers, target_compile, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]

NETWORK = "tests/trainer/kernel_network.py:build3d"
DIMS = (1, 2, 2, 1, 1)
CANDIDATES = {"xla": {}, "taps": {"kernels.conv_weight_grad": "taps"},
              "float32": {"kernels.conv_weight_grad": "float32"}, "subpixel": {"kernels.conv_transpose": "subpixel"},
              "padded": {"kernels.conv_transpose": "padded"}, "fused": {"kernels.norm": "fused"}}


def _compiled(overrides: dict, devices, by_program: dict) -> dict:
    """The candidate's step compiled for the TPU; a program lowered to the same text as one compiled before (four
    of the six: `kernels.for_platform`) is that program, so its figures are read from `by_program` rather than from
    a second compile of the same text (45 s of the test's 71)."""
    config = compiled_step.plan_config(NETWORK, "default", {**overrides, "batch_size": 1, "augment": False,
                                                            "partition.input_partition_dims": "1,2,2,1,1"})
    builder = compiled_step.StepBuilder(config, compiled_step.example_shape(config, (16, 16, 16)))
    with target_compile.compile_only():
        lowered, _ = builder.lower_layout(DIMS, devices[:4])
        program = lowered.as_text()
        if program in by_program:
            return by_program[program]
        compiled = lowered.compile()
    text = compiled.as_text()
    memory = compiled.memory_analysis()
    by_program[program] = {
        "bytes": memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes,
        "activation_gathers": gathers.of_step(lowered, compiled, 1, gathers.weight_shapes(builder.state)),
        "all_gathers": len(re.findall(r"all-gather(?:-start)?\(", text)), "lowered": program}
    return by_program[program]


def test_each_candidate_keeps_the_tpus_bytes_and_adds_no_gather():
    devices = targets.devices(targets.parse("v5e:2x2"))
    by_program: dict = {}
    steps = {name: _compiled(overrides, devices, by_program) for name, overrides in CANDIDATES.items()}
    assert len(by_program) == 2  # XLA's program and the fused normalization's: the other four lower to XLA's
    print({name: (step["bytes"], step["all_gathers"]) for name, step in steps.items()})  # the figures docs/layers.md quotes
    xla = steps["xla"]
    assert xla["activation_gathers"] == [] and xla["bytes"] > 0
    for name, step in steps.items():
        assert abs(step["bytes"] / xla["bytes"] - 1) <= 0.05, (name, step["bytes"], xla["bytes"])
        assert step["activation_gathers"] == [] and step["all_gathers"] <= xla["all_gathers"], name
    assert steps["fused"]["lowered"] != xla["lowered"]
    assert steps["subpixel"]["lowered"] == xla["lowered"]  # split: sub-pixel already
    assert steps["taps"]["lowered"] == xla["lowered"]  # a TPU program keeps XLA's weight gradients
    assert steps["float32"]["lowered"] == xla["lowered"]
    assert steps["padded"]["lowered"] == xla["lowered"]  # and its transposed convolutions (7.77 MiB per device)
