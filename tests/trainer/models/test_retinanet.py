"""The partitionable RetinaNet: target layout, loss, and partitioned-step parity."""

import jax
import keras
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from trainer.engine import placement, program, step
from trainer.models import retinanet
from trainer.parallel import device_mesh, partitioning

TOLERANCE = 1e-4
CONFIG = retinanet.RetinaNetConfig(num_classes=3, stackwise_num_blocks=(1, 1, 1, 1),
                                   stackwise_num_filters=(64, 32, 32, 32), head_filters=32, head_conv_layers=2)


def test_level_targets_line_up_with_anchor_positions():
    """Cell (row, column) of each level map holds the anchors of that cell, in row-major order."""
    generator, _ = retinanet.anchor_tools(CONFIG)
    anchors = generator(np.zeros((128, 96, 3)))  # {"P3": (H·W·A, 4) yxyx}
    flat = np.concatenate([np.asarray(anchors[level]) for level in CONFIG.levels])[None]  # (1, N, 4)
    levels = retinanet.targets_to_levels(flat, np.zeros(flat.shape[:2]), (128, 96), CONFIG)
    for number, level in zip(range(CONFIG.min_level, CONFIG.max_level + 1), CONFIG.levels):
        grid = levels[f"boxes/{level}"][0].reshape(128 // 2**number, 96 // 2**number, -1, 4)  # (H, W, A, yxyx)
        centre_y = (grid[..., 0] + grid[..., 2]) / 2
        centre_x = (grid[..., 1] + grid[..., 3]) / 2
        stride = 2**number
        offset = centre_y[0, 0, 0]  # KerasHub centres anchors on cell corners (offset 0)
        assert offset in (0.0, stride / 2)
        rows, columns = np.meshgrid(np.arange(grid.shape[0]), np.arange(grid.shape[1]), indexing="ij")
        expected_y = (rows * stride + offset)[..., None] * np.ones(grid.shape[2])
        expected_x = (columns * stride + offset)[..., None] * np.ones(grid.shape[2])
        np.testing.assert_allclose(centre_y, expected_y, atol=1e-3)
        np.testing.assert_allclose(centre_x, expected_x, atol=1e-3)


@pytest.mark.slow
def test_loss_prefers_the_right_class():
    boxes = np.array([[[32, 32, 64, 64]]], np.float32)
    targets = retinanet.encode_targets(boxes, np.array([[1]]), (128, 128), CONFIG)
    anchors = CONFIG.anchors_per_position

    def outputs_scoring(class_id):
        result = {}
        for level in CONFIG.levels:
            classes = targets[f"classes/{level}"]  # (1, H, W, A)
            logits = np.full((*classes.shape, 3), -8.0, np.float32)
            logits[..., class_id] = np.where(classes >= 0, 8.0, -8.0)
            result[f"classes/{level}"] = logits.reshape(*classes.shape[:-1], anchors * 3)
            result[f"boxes/{level}"] = targets[f"boxes/{level}"]
        return result

    right = float(retinanet.detection_loss(outputs_scoring(1), targets, CONFIG))
    wrong = float(retinanet.detection_loss(outputs_scoring(2), targets, CONFIG))
    assert right < 0.05 < 1.0 < wrong


@pytest.fixture(scope="module")
def detector():
    keras.utils.set_random_seed(0)
    model = retinanet.build_retinanet(CONFIG)
    state = program.initial_state(model, keras.optimizers.SGD(0.1))
    rng = np.random.default_rng(0)
    images = rng.normal(size=(1, 128, 128, 3)).astype(np.float32)
    boxes = np.array([[[10, 12, 40, 50], [60, 30, 100, 90], [0, 0, 0, 0]]], np.float32)
    targets = retinanet.encode_targets(boxes, np.array([[0, 2, -1]]), (128, 128), CONFIG)
    return model, state, images, targets


def _loss_and_grads(model, state, images, targets, dims, devices):
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims), devices)
    placed_state = placement.place_state(state, distribution)
    image_sharding = distribution.get_data_layout(images.shape).backend_layout
    whole = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec("replica"))  # labels unpartitioned
    function = jax.jit(
        step.make_loss_and_grads(model, lambda outputs, labels: retinanet.detection_loss(outputs, labels, CONFIG)),
        in_shardings=(placement.state_shardings(placed_state, distribution), image_sharding,
                      {k: whole for k in targets}),
    )
    compiled = function.lower(placed_state, images, targets).compile()
    loss, grads, _ = compiled(placed_state, images, targets)
    return float(loss), [np.asarray(g) for g in grads], compiled


@pytest.mark.slow
@pytest.mark.parametrize("dims", [(1, 4, 1, 1), (1, 2, 2, 1)])
def test_partitioned_detection_step_matches_unpartitioned(detector, dims):
    model, state, images, targets = detector
    reference_loss, reference_grads, _ = _loss_and_grads(model, state, images, targets, (1, 1, 1, 1), jax.devices()[:1])
    loss, grads, compiled = _loss_and_grads(model, state, images, targets, dims, jax.devices()[:4])
    assert abs(loss - reference_loss) / abs(reference_loss) <= TOLERANCE
    worst = max(float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)) for g, r in zip(grads, reference_grads))
    assert worst <= TOLERANCE, f"largest relative gradient difference {worst:.2e}"
    assert "collective-permute" in compiled.as_text()
