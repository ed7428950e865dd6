"""Predict's pass as `fullres plan` sizes it: the very program `fullres predict` compiles, for any target.

`fullres predict` loads the weights alone (`placement.weights_state`: no optimizer slots), pads each volume to
the shape the model and the split accept (`inference.padded_shape`), and runs one whole-volume forward pass that
returns float32 probabilities (`inference.make_forward(..., "probabilities")`, lowered by
`inference.lower_predict`). This module lowers that same program from the weights' shapes, for this machine's
devices or a target's (compile only), and adds what the device holds beside it (`device_bytes`: the loaded
weights stay on the device beside their placed copy; the autotuning runs after they are placed).

Before, `benchmarks/device/device_plan.py` sized predict through its own copy of the pass, given the training
state; `jax.jit` leaves the unused optimizer slots out, so its compiler figure was the same (4,650,203,760 bytes
at 256³ for the default UNet), but nothing counted the weights held beside it, nor the workspace.
"""

from __future__ import annotations

import math

from trainer import config as config_lib
from trainer.engine import inference, placement
from trainer.parallel import device_mesh, halo, xla_compile
from trainer.plan import device_bytes, target_compile, targets
from trainer.tasks import registry


def _nbytes(tree) -> int:
    import jax

    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


def predict_bytes(config: config_lib.TrainConfig, volume: tuple[int, ...], target: targets.Target,
                  autotune: bool | None = None) -> dict:
    """Bytes per device of `fullres predict`'s whole-volume pass of one `volume` (D, H, W, C) on `target`.

    Returns:
        {"padded_shape", "compiler_total_bytes" (memory_analysis), "argument_bytes", "output_bytes",
        "total_bytes" (the device's: `device_bytes.planned`), "device_terms", "fits"}. Where the target's
        compiler refuses the pass for its memory (a TPU's RESOURCE_EXHAUSTED), "fits" is False, the bytes are the
        ones the compiler says it needed, and "refused" holds those and the bytes it had.
    """
    import jax

    task = registry.make_task(config)
    with jax.default_device(jax.devices("cpu")[0]):
        model = task.build_model()
        weights = placement.weights_state(model)
    dims = config.partition.input_partition_dims
    cores = math.prod(dims)
    devices = targets.devices(target)[:cores]
    spatial = inference.padded_shape(volume[:-1], inference.spatial_multiples(dims, config.model.downsampling_levels))
    batch_shape = (1, *spatial, volume[-1])
    with target_compile.compile_only(target.platform != "cpu"):
        distribution = device_mesh.make_distribution(config.partition, devices)
        shapes = jax.tree_util.tree_map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), weights,
                                        placement.state_shardings(weights, distribution))
        forward = inference.make_forward(model, distribution, shapes, len(batch_shape), "probabilities")
        lowered = inference.lower_predict(forward, shapes, distribution, batch_shape)
        try:
            compiled, _ = xla_compile.compile(lowered)
        except RuntimeError as error:  # a TPU compiler refuses a pass over its memory rather than sizing it
            refused = targets.out_of_memory(str(error))
            if refused is None:
                raise
            return {"padded_shape": list(spatial), "compiler_total_bytes": refused[0], "argument_bytes": None,
                    "output_bytes": None, "total_bytes": refused[0], "device_terms": None, "fits": False,
                    "refused": {"needed_bytes": refused[0], "available_bytes": refused[1]}}
    memory = compiled.memory_analysis()
    total = (memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
             - memory.alias_size_in_bytes)
    largest, tuning = device_bytes.convolution_bytes(halo.windows(model, weights, batch_shape))
    held = _nbytes(weights)
    terms = device_bytes.planned(total, target.platform, state_bytes=held, largest_convolution_bytes=largest // cores,
                                 autotuning_convolution_bytes=tuning // cores, placed_before_compile_bytes=held,
                                 autotune=device_bytes.autotunes() if autotune is None else autotune)
    limit = targets.memory_per_device(target)
    return {"padded_shape": list(spatial), "compiler_total_bytes": int(total),
            "argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
            "total_bytes": terms.total_bytes, "device_terms": terms.to_json(),
            "fits": None if limit is None else terms.total_bytes <= limit}
