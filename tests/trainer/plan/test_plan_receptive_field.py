"""`fullres plan` on a network whose receptive-field probe cannot run on this host (UNETR at 256³, a fixed
input size, asked the CPU for 174 GiB) plans on and says why the field is missing; it ended in a traceback."""

import jax
import pytest

from trainer import presets
from trainer.models import receptive_field
from trainer.plan import memory_plan


def _exhausted(*args, **kwargs):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 186916814848 bytes.")


def test_a_probe_the_host_cannot_hold_is_said_not_raised(monkeypatch):
    monkeypatch.setattr(receptive_field, "measure", _exhausted)
    said = []
    found = memory_plan._receptive_field(presets.smoke(), (16, 16, 16, 1), said.append)
    assert found is None
    assert said == ["receptive field: not measured: probing it at [16, 16, 16] needs more memory than this host has"]


def test_any_other_failure_of_the_probe_still_raises(monkeypatch):
    def broken(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(receptive_field, "measure", broken)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        memory_plan._receptive_field(presets.smoke(), (16, 16, 16, 1), lambda line: None)


@pytest.mark.slow  # two plans of a tiny network on the CPU: about 15 s here
@pytest.mark.parametrize("image_size", ["16,16,16", "16,16,160"], ids=["whole", "thin-per-axis"])
def test_the_field_is_the_architectures_not_what_one_draw_of_weights_switches_on(image_size):
    """Before, the plan measured the gradient through the ReLUs a random initialization left active: a draw that
    switched every path off along an axis read "1 of 64 of width" (about one plan in 17 of the smoke UNet at
    32,64,64). The network here switches its one ReLU off for every input: its field is still two convolutions'."""
    import json

    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["plan", "--model", "tests/trainer/plan/dead_relu_network.py:build",
                                          "--image-size", image_size, "--partitions", "1", "--json"])
    assert result.exit_code == 0, result.output
    field = json.loads(result.stdout)["receptive_field"]
    assert field == {"seen": [5, 5, 5], "size": [int(n) for n in image_size.split(",")]}
