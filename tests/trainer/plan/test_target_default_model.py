"""The default UNet compiled for a TPU slice by libtpu, on this CPU machine (the target tier, with the `tpu` group).

Its own file: this one compile takes longer than the rest of the target tier's files on one xdist worker, so the
two workers (`--dist loadfile`) take it and the rest side by side (tests/conftest.py: LONGEST_FIRST).
"""

import pytest

from trainer.plan import compiled_step, layout_search, targets

pytestmark = [pytest.mark.slow, pytest.mark.target]


def test_the_default_model_fills_the_tpus_lanes():
    """Issue #22 item 4: the default UNet's TPU figure stays within 2× of the CPU plan's, activations included.

    At 64³ split 4 ways the plain UNet (4 levels of 16-128 filters, no stem) took 485.8 MiB per v5e core
    against 85.8 MiB on the CPU (5.7×; its temp alone more); the default's stem and 128+ filters fill the
    128-lane tiles. Compiles the real default (21.7 M parameters): the TPU compile alone took 181-201 s on this
    2-core machine, quiet (2026-11-26); 274-319 s for the test beside the rest of the tier.
    """
    config = compiled_step.plan_config("unet3d", "default", {"partition.input_partition_dims": "1,4,1,1,1"})
    assert (config.model.stem, config.model.base_filters) == ("space_to_depth", 128)
    shape = compiled_step.example_shape(config, (64,) * 3)
    cpu = layout_search.compile_layout(config, shape, targets.parse("cpu"))
    tpu = layout_search.compile_layout(config, shape, targets.parse("v5e:2x2"))
    assert tpu.total_bytes <= 2 * cpu.total_bytes, (tpu.total_bytes, cpu.total_bytes)
    assert tpu.temp_bytes <= 2 * cpu.temp_bytes, (tpu.temp_bytes, cpu.temp_bytes)
    assert tpu.activation_all_gathers == 0 and tpu.halo_bytes > 0
