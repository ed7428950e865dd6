"""One process of the multi-process parity test: `python multiprocess_parity_worker.py ADDRESS N ID OUT`.

Joins the run (`distributed.initialize`, 4 CPU devices here), then for each
layout computes one step's loss and gradients on the global mesh, each process
placing only its share of the batch, the rows and depths its devices hold
(`placement.process_share`), as the input path reads them, and process 0 writes them to OUT/<dims>.npz. The batch and the model are the ones
`test_multiprocess.py` builds in one process.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from trainer.parallel import distributed  # noqa: E402

LAYOUTS = ((1, 8, 1, 1, 1), (1, 4, 1, 1, 1))
BATCH_SHAPE = (2, 32, 16, 16)  # (B, D, H, W)


def model_and_state():
    import keras

    from trainer.engine import program
    from trainer.models import unet

    keras.utils.set_random_seed(0)
    model = unet.build_unet(unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=3, base_filters=4, stem="none"))
    return model, program.initial_state(model, keras.optimizers.Adam(1e-3))


def batch():
    import numpy as np

    rng = np.random.default_rng(1)
    images = rng.normal(size=(*BATCH_SHAPE, 1)).astype(np.float32)  # (B, D, H, W, 1)
    labels = rng.integers(0, 3, size=BATCH_SHAPE).astype(np.int32)  # (B, D, H, W)
    return images, labels


def loss_and_grads(model, state, dims, images, labels, share=None):
    """One step's loss and gradients (host arrays) with `dims`, from this process's `share` of the global batch
    (`batches.Share`: rows and depths; None: all of it), placed as training places its input."""
    import jax
    import numpy as np

    from trainer.engine import placement, step
    from trainer.models import losses
    from trainer.parallel import device_mesh, partitioning

    distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims))
    placed_state = placement.place_state(state, distribution)
    rows = None if share is None else list(share.rows)
    depth = None if share is None else share.depth
    image_sharding = distribution.get_data_layout(images.shape).backend_layout
    label_sharding = placement.sharding(distribution, distribution.get_data_layout(images.shape).axes[:-1])  # as images
    placed_images = placement.global_array(image_sharding, images, BATCH_SHAPE[0], rows, depth, BATCH_SHAPE[1])
    placed_labels = placement.global_array(label_sharding, labels, BATCH_SHAPE[0], rows, depth, BATCH_SHAPE[1])
    function = distributed.RunTogether(jax.jit(
        step.make_loss_and_grads(model, losses.dice_cross_entropy),
        in_shardings=(placement.state_shardings(placed_state, distribution), placed_images.sharding, placed_labels.sharding),
    ), "parity step")
    loss, grads, _ = function(placed_state, placed_images, placed_labels)
    return float(loss), [np.asarray(g) for g in grads], placed_images


def main(address: str, num_processes: int, process_id: int, output: str) -> None:
    distributed.initialize(distributed.ProcessGroup(address, num_processes, process_id))
    import jax
    import numpy as np

    from trainer.engine import placement
    from trainer.parallel import device_mesh, partitioning

    model, state = model_and_state()
    images, labels = batch()
    for dims in LAYOUTS:
        distribution = device_mesh.make_distribution(partitioning.PartitionConfig(dims))
        share = placement.process_share(distribution.get_data_layout(images.shape).backend_layout, images.shape)
        rows, (start, stop) = list(share.rows), share.depth_of(BATCH_SHAPE[1])
        # This process holds only its rows, and of them only its depths: what the input path reads.
        loss, grads, placed = loss_and_grads(model, state, dims, images[rows, start:stop], labels[rows, start:stop],
                                             share)
        # What this process's devices hold: (global row, depth start) of every block.
        blocks = sorted((s.index[0].start or 0, s.index[1].start or 0) for s in placed.addressable_shards)
        print(f"process {process_id} dims {dims}: rows {rows}, depths {start}-{stop}, blocks {blocks}, "
              f"loss {loss:.6f}", flush=True)
        if jax.process_index() == 0:
            name = "x".join(str(d) for d in dims)
            np.savez(os.path.join(output, f"{name}.npz"), loss=loss, rows=np.array(rows),
                     **{f"grad{i:03d}": g for i, g in enumerate(grads)})


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # read when JAX's backend starts, in main
    os.environ["JAX_PLATFORMS"] = "cpu"
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
