"""fullres as a library: your own Keras 3 network, each input split in space over the devices, without changing it.

Three names, in Keras's own idiom:

* `SpatialParallel(input_partition_dims)`: a Keras distribution (`keras.distribution.ModelParallel`). Set it with
  `keras.distribution.set_distribution(...)` before the model is built, and `model.fit` splits each batch over
  the replicas and each example over its replica's cores (`[1, 4, 1, 1, 1]`: every volume in 4 along depth, as
  Cloud TPU's `input_partition_dims`); XLA's SPMD partitioner exchanges the borders.
* `plan(network, image_size, partitions)`: per-device memory, halo traffic and the all-gathers (by Keras layer)
  of the training step for each split, compiled ahead of time on this machine's CPU or for a TPU slice or GPUs
  (`target="v5e:2x2"`), without running anything.
* `train(network, train=..., output=...)`: fullres's own loop on records of `fullres preprocess ct`: checkpoints,
  preemption-safe resume, TensorBoard, evaluation, a run folder `fullres predict --model` reads (it keeps a copy
  of the network's file); a step that all-gathers activations is refused unless `allow_gathers=True`.

`network` is a function `network(num_classes=..., in_channels=...)` that returns an uncompiled `keras.Model`
(channels-last `(B, D, H, W, C)` or `(B, H, W, C)` in, `num_classes` logits out at the input's resolution),
defined at the top level of a Python file, or that file and its name as `"FILE.py:FUNCTION"`, as `fullres train
--model` takes it. A run keeps a copy of the file, which `fullres predict` imports in its own process: keep the
file's top level to definitions (a script's own work under `if __name__ == "__main__":`).

Example:
    >>> import keras
    >>> import fullres
    >>> keras.distribution.set_distribution(fullres.SpatialParallel([1, 4, 1, 1, 1]))  # 8 devices: 2 replicas × 4
    >>> keras.distribution.distribution().get_data_layout((2, 64, 32, 32, 1)).axes
    ('replica', 'depth', None, None, None)
    >>> keras.distribution.set_distribution(None)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trainer  # noqa: F401  (chooses Keras's JAX backend before anything imports Keras)
from trainer.parallel.device_mesh import SpatialParallel

__all__ = ["SpatialParallel", "plan", "train"]


def source_of(network: Callable | str) -> str:
    """`FILE.py:FUNCTION` for `network`: a function defined at the top level of a file (used as it is in this
    process, `user_model.register`), or that text already.

    Raises:
        ValueError: a function defined elsewhere (a notebook cell, inside another function, a lambda).
    """
    from trainer.models import user_model

    return network if isinstance(network, str) else user_model.register(network)


def plan(network: Callable | str, image_size: Sequence[int], partitions: Sequence[int] = (1, 2, 4, 8), *,
         layouts: str | Sequence[int] = "default", target: str = "cpu", num_classes: int = 3, in_channels: int = 1,
         batch_size: int = 1, precision: str = "float32", device_memory: str | None = None, **settings):
    """Per-device memory, halo and all-gathers of `network`'s training step for each split, compiled, not run.

    Args:
        network: the function that builds the network, or "FILE.py:FUNCTION".
        image_size: one example's spatial size, (D, H, W) or (H, W): 2D or 3D as its length says.
        partitions: the core counts N to compare.
        layouts: "default" (N-way along the first spatial axis), "all" (every split of N that divides), or one
            layout's input_partition_dims.
        target: "cpu" (this process's devices: `XLA_FLAGS=--xla_force_host_platform_device_count=8` before JAX
            starts gives 8 on one CPU), a TPU slice ("v5e:2x2"; `uv sync --group tpu`) or GPUs ("h100x8";
            `uv sync --group cuda`), whose own compiler then gives the figures.
        num_classes, in_channels, batch_size, precision: as the run would train.
        device_memory: e.g. "16GiB": rows say whether they fit (default on a target: its device's memory).
        settings: any other training setting, as dotted keys (`**{"remat": True}`).

    Returns:
        The plan (`trainer.plan.memory_plan.Plan`): `print(plan)` shows the table `fullres plan` prints;
        `plan.to_json()["rows"]` has per layout `total_bytes`, `halo_bytes`, `activation_all_gathers` and
        `gathered` (the Keras layers that all-gather, with their bytes per device).
    """
    from trainer.plan import memory_plan

    values = {"model.num_classes": num_classes, "model.in_channels": in_channels, "batch_size": batch_size,
              "precision": precision, **settings}
    return memory_plan.run(model=source_of(network), settings=values, image_size=tuple(image_size),
                           partitions=tuple(partitions),
                           layouts_to_try=layouts if isinstance(layouts, str) else tuple(layouts),
                           device_memory=device_memory, target=target)


def train(network: Callable | str, *, train: str, output: str, eval: str | None = None,
          input_partition_dims: Sequence[int] | str | None = None, preset: str = "default",
          allow_gathers: bool = False, log: Callable[[str], None] = print, **settings) -> dict:
    """Trains `network` with fullres's own loop on records of `fullres preprocess ct`; returns metrics.json's content.

    Args:
        network: the function that builds the network, or "FILE.py:FUNCTION".
        train, eval: data sets (a folder or a pattern of records, as `fullres train --train/--eval`).
        output: the run folder (new, or an earlier run's, which is resumed).
        input_partition_dims: e.g. (1, 4, 1, 1, 1), or "auto" (default: the preset's).
        preset: a training preset (`trainer.config.PRESETS`): steps, batch size, learning rate, ...
        allow_gathers: train even when the compiled step all-gathers whole activations.
        settings: any other training setting, as dotted keys: `steps=100`, `**{"model.num_classes": 4}`.

    Raises:
        ValueError: one sentence for a bad network, setting, partitioning or data set (as `fullres train`).
    """
    from trainer import config_resolution, train as train_lib

    dims = input_partition_dims if input_partition_dims is None or isinstance(input_partition_dims, str) else \
        ",".join(map(str, input_partition_dims))
    # Each setting's sentence names the argument as given here (`fullres.train(learning_rate=nan)`).
    given = {key: f"fullres.train({key}={value!r})" for key, value in settings.items()}
    config = config_resolution.resolve("segmentation", preset, train, output, eval,
                                       overrides={"partition.input_partition_dims": dims, "allow_gathers": allow_gathers,
                                                  **settings}, model_source=source_of(network), given=given)
    return train_lib.train(config, log=log)
