"""A 2560×2560 RetinaNet training step compiles *and runs* split 8-way along the height."""

import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec


from trainer import presets
from trainer.engine import placement, program
from trainer.models import retinanet
from trainer.parallel import partitioning
from trainer.plan import compiled_step

pytestmark = pytest.mark.slow  # compiles a 2560² detection step


SIZE = (2560, 2560)
DIMS = (1, 8, 1, 1)
# A small backbone keeps the step to seconds on 2 CPU cores; the structure (ResNet + FPN P3–P5 + heads) is the real one.
SMALL = retinanet.RetinaNetConfig(num_classes=3, stackwise_num_blocks=(1, 1, 1, 1),
                                  stackwise_num_filters=(64, 32, 32, 32), head_filters=32, head_conv_layers=1)


def test_2560_step_runs_on_8_cores_and_reports_memory():
    devices = jax.devices()[:8]
    # No warm-up: the first step's learning rate would be 0 and the weights would not move.
    config = presets.detection(model=SMALL, image_size=SIZE, batch_size=1, warmup_steps=0,
                                  partition=partitioning.PartitionConfig(DIMS))
    # The step as `compile_step` compiles it, from a builder whose model and optimizer (built as training builds
    # them, the optimizer on the learning-rate schedule) give the step its state: one RetinaNet build, not two.
    builder = compiled_step.StepBuilder(config, compiled_step.example_shape(config, SIZE))
    compiled, distribution = builder.compile_layout(DIMS, devices)
    memory = compiled.memory_analysis()
    # fullres's own detector passes the check training makes of every network: no activation all-gathered.
    assert compiled_step.communication(compiled.as_text(), replica_batch=1)[0] == []

    state = placement.place_state(program.initial_state(builder.model, builder.optimizer), distribution)
    before = [np.asarray(w) for w in state.trainable[:3]]
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(1, *SIZE, 3)).astype(np.float32)
    # One box per split line (rows 320, 640, ...) and one away from all of them.
    boxes = np.array([[[line - 40, 100 + 300 * k, line + 40, 180 + 300 * k] for k, line in enumerate(range(320, 2560, 320))]
                      + [[100, 2000, 200, 2100]]], np.float32)
    classes = np.array([[k % 3 for k in range(boxes.shape[1])]])
    targets = retinanet.encode_targets(boxes, classes, SIZE, SMALL)
    whole = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec(partitioning.REPLICA_AXIS))
    placed_targets = {k: jax.device_put(v, whole) for k, v in targets.items()}
    placed_images = placement.place_batch(distribution, images)
    assert {s.data.shape for s in placed_images.addressable_shards} == {(1, SIZE[0] // 8, SIZE[1], 3)}

    step = jax.device_put(np.int32(0), NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec()))
    new_state, metrics = compiled(state, placed_images, placed_targets, step)
    loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    assert np.isfinite(loss) and loss > 0
    assert np.isfinite(grad_norm) and grad_norm > 0
    assert any(not np.allclose(b, np.asarray(a)) for b, a in zip(before, new_state.trainable[:3]))

    report = {
        "image_size": list(SIZE), "input_partition_dims": list(DIMS), "loss": loss,
        "per_device_temp_bytes": memory.temp_size_in_bytes, "per_device_argument_bytes": memory.argument_size_in_bytes,
    }
    print(json.dumps(report))  # shown with `pytest -s`; the README quotes these figures
    # Each device holds 1/8 of the image (plus replicated weights), not the whole of it.
    image_bytes = images.nbytes
    assert memory.argument_size_in_bytes < image_bytes / 8 + 64 * 2**20
