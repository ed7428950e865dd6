"""The plan sizes the program `fullres predict` compiles: the weights alone (no optimizer slots), the volume padded
as predict pads it, float32 probabilities out; and it adds the loaded weights the process holds beside it."""

import math

import jax
import numpy as np
import pytest

from trainer.engine import inference, placement, program
from trainer.plan import compiled_step, device_bytes, predict_plan, targets
from trainer.tasks import registry


def _tiny():
    return compiled_step.plan_config("unet3d", "smoke", {"model.num_levels": 2, "model.base_filters": 4})


def _bytes(tree) -> int:
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


@pytest.mark.slow  # two compiles of a tiny UNet's pass: 20-40 s on the shared 2-core machine
def test_the_plans_predict_bytes_are_those_of_the_program_predict_compiles():
    config = _tiny()
    volume = (13, 10, 9, 1)  # not divisible: predict pads it
    plan = predict_plan.predict_bytes(config, volume, targets.parse("cpu"))

    model = registry.make_task(config).build_model()
    weights = placement.weights_state(model)
    predictor = inference.VolumePredictor(model, weights, config.partition, jax.devices(),
                                          config.model.downsampling_levels)
    padded = predictor.padded_shape(volume[:-1])
    assert plan["padded_shape"] == list(padded) and padded != volume[:-1]
    memory = predictor.compiled((1, *padded, 1)).memory_analysis()
    compiled_total = (memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
                      - memory.alias_size_in_bytes)
    assert plan["compiler_total_bytes"] == compiled_total
    # The arguments are the weights and the padded float32 volume (jax.jit leaves unused arguments out, so a training
    # state's optimizer slots would not show here; they would in what is held beside the pass, below).
    image = math.prod(padded) * 4
    assert plan["argument_bytes"] == _bytes(weights) + image
    _, _, _, state = program.build_model(config, registry.make_task(config), 1)
    assert _bytes(state) > 2 * _bytes(weights)
    # Out: float32 probabilities of every class at the padded size.
    assert plan["output_bytes"] == math.prod(padded) * config.model.num_classes * np.dtype(np.float32).itemsize
    # Beside the program, the process holds the loaded weights (trained_run.load builds the model on the devices
    # and places a copy): counted once more.
    terms = plan["device_terms"]
    assert terms["held_state_bytes"] == _bytes(weights)
    assert plan["total_bytes"] == compiled_total + _bytes(weights)
    assert terms["margin"] == 1.0 and terms["workspace_bytes"] == 0  # no cuDNN on a CPU


def test_on_a_gpu_predict_counts_the_autotuning_of_its_largest_convolution_after_the_weights_are_placed():
    terms = device_bytes.planned(1000, "cuda", state_bytes=10, largest_convolution_bytes=400,
                                 autotuning_convolution_bytes=1000, placed_before_compile_bytes=10)
    assert terms.workspace_bytes == 400 and terms.step_peak_bytes == 1410
    assert terms.autotuning_peak_bytes == 10 + 10 + 1000 + 400
    assert terms.total_bytes == math.ceil(1420 * device_bytes.GPU_MARGIN)


def test_a_pass_the_targets_compiler_refuses_for_its_memory_does_not_fit_and_says_what_it_needed(monkeypatch):
    # The TPU compiler refuses a pass over its memory (RESOURCE_EXHAUSTED) rather than sizing it; the bisection of
    # the largest volume must read that as "does not fit", not stop on an error.
    from trainer.parallel import xla_compile

    def refuse(lowered):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 100.58G of 15.75G hbm. "
                           "Exceeded hbm capacity by 84.83G.")

    monkeypatch.setattr(xla_compile, "compile", refuse)
    found = predict_plan.predict_bytes(_tiny(), (16, 16, 16, 1), targets.parse("cpu"))
    assert found["fits"] is False
    assert found["refused"] == {"needed_bytes": round(100.58 * 2**30), "available_bytes": round(15.75 * 2**30)}
    assert found["total_bytes"] == found["refused"]["needed_bytes"]

    def fail(lowered):
        raise RuntimeError("INVALID_ARGUMENT: a bug, not the memory")

    monkeypatch.setattr(xla_compile, "compile", fail)
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        predict_plan.predict_bytes(_tiny(), (16, 16, 16, 1), targets.parse("cpu"))
