"""benchmarks/peer/hlo_kernels.py reads the GPU compiler's program: every convolution found, by layer kind and direction.

A three-convolution network (a Conv3D, a strided Conv3D, a Conv3DTranspose, a 1×1×1 head) at 8³ is compiled for an
H100 without one (JAX's CUDA plug-in, the `cuda` group), in fullres's training step, float32 and bfloat16. Each of
its convolutions has a forward pass and a weight gradient, and each but the first an input gradient (the image has
none). cuDNN's call names are not the directions (a transposed convolution's forward pass is `convBackwardInput`,
its weight gradient a `convForward`): the classifier must tell them apart by the metadata and the kernel's shape.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.target]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NETWORK = '''
import keras
from keras import layers


def build(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, in_channels))
    x = layers.Conv3D(4, 3, padding="same", name="first")(inputs)
    x = layers.Conv3D(8, 3, strides=2, padding="same", name="down")(x)
    x = layers.Conv3DTranspose(4, 2, strides=2, name="up")(x)
    return keras.Model(inputs, layers.Conv3D(num_classes, 1, name="head")(x))
'''
SCRIPT = '''
import json, sys
sys.path.insert(0, {repository!r}); sys.path.insert(0, {repository!r} + "/benchmarks/peer")
import jax
jax.config.update("jax_platforms", "cpu")
import trainer
import hlo_kernels
from trainer.plan import compiled_step, target_compile, targets
out = {{}}
for precision in ("float32", "bfloat16"):
    config = compiled_step.plan_config({source!r}, "default", {{"precision": precision, "augmentation": "none"}})
    builder = compiled_step.StepBuilder(config, compiled_step.example_shape(config, (8, 8, 8)))
    with target_compile.compile_only():
        compiled, _ = builder.compile_layout((1,) * 5, targets.devices(targets.parse("h100x1"))[:1])
    table = hlo_kernels.classify(compiled.as_text(), hlo_kernels.layer_classes(builder.model))
    out[precision] = [(r["layer"], r["direction"], r["implementation"], r["weight_converts"])
                      for r in table["instructions"].values() if r["implementation"]]
print("RESULT " + json.dumps(out))
'''


def test_every_convolution_of_a_step_is_found_with_its_direction_and_cudnn_call(tmp_path):
    source = tmp_path / "three_convolutions.py"
    source.write_text(textwrap.dedent(NETWORK))
    code = SCRIPT.format(repository=REPOSITORY, source=f"{source}:build")
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                            cwd=REPOSITORY, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    found = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for precision, rows in found.items():
        directions = sorted((layer, direction) for layer, direction, _, _ in rows)
        assert directions == sorted([("first", "forward"), ("first", "weight gradient"),
                                     ("down", "forward"), ("down", "input gradient"), ("down", "weight gradient"),
                                     ("up", "forward"), ("up", "input gradient"), ("up", "weight gradient"),
                                     ("head", "forward"), ("head", "input gradient"), ("head", "weight gradient")]), \
            (precision, rows)
        assert all(how.startswith("cuDNN ") for _, _, how, _ in rows), rows
        calls = {(layer, direction): how for layer, direction, how, _ in rows}
        assert calls[("up", "forward")] == "cuDNN convBackwardInput"  # a transposed convolution's forward pass
        assert calls[("down", "weight gradient")] == "cuDNN convBackwardFilter"
    # bfloat16: the float32 weights are converted next to their convolutions (each layer's forward pass at least);
    # float32 needs no convert of a weight.
    assert sum(converts for *_, converts in found["bfloat16"]) >= 4
    assert sum(converts for *_, converts in found["float32"]) == 0
