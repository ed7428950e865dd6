"""`fullres plan` on a network whose receptive-field probe cannot run on this host (issue 52: UNETR at 256³, a fixed
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
