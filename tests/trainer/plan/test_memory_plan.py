"""`fullres plan`: memory read from the compiled step, and communication found in its HLO."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from trainer.engine import placement, program, step
from trainer.models import losses
from trainer.parallel import device_mesh, partitioning
from common import sizes
from trainer.plan import compiled_step, gathers, layout_search, memory_plan, plan_row, plan_text

SMALL_RETINANET = {"model.stackwise_num_blocks": "1,1,1,1", "model.stackwise_num_filters": "64,32,32,32",
                   "model.head_filters": 32, "model.head_conv_layers": 2, "image_size": "256,256"}
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _unet_config(spatial_dims=3, **settings):
    return compiled_step.plan_config("unet3d" if spatial_dims == 3 else "unet2d",
                                   overrides={"model.num_levels": 3, "model.base_filters": 8, "model.stem": "none",
                                             **settings})


@pytest.fixture(scope="module")
def rows():
    config = _unet_config()
    return layout_search.plan(config, compiled_step.example_shape(config, (32, 32, 32)), [1, 2, 4],
                            device_memory=8 * 2**20)


@pytest.mark.slow
def test_memory_per_device_falls_with_partitions(rows):
    temps = [r.temp_bytes for r in rows]
    assert temps[0] > temps[1] > temps[2]
    for r in rows:
        assert r.efficiency == pytest.approx(rows[0].temp_bytes / (r.partitions * r.temp_bytes), abs=1e-4)
        assert r.total_bytes >= r.temp_bytes
    assert [r.fits for r in rows] == [r.total_bytes <= 8 * 2**20 for r in rows]


@pytest.mark.slow
def test_unet_step_has_halo_exchange_and_no_activation_all_gather(rows):
    assert [r.activation_all_gathers for r in rows] == [0, 0, 0]
    assert rows[0].halo_bytes == 0 and rows[1].halo_bytes > 0 and rows[2].halo_bytes > 0


def test_all_gather_of_an_activation_is_counted():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("replica", "depth"))
    split = NamedSharding(mesh, PartitionSpec("replica", "depth"))

    def gather(x):  # forces every device to hold the whole (1, 16, 8, 8, 4) activation
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, PartitionSpec())) + 1

    compiled = jax.jit(gather, in_shardings=split).lower(jnp.zeros((1, 16, 8, 8, 4))).compile()
    found, _ = compiled_step.communication(compiled.as_text(), replica_batch=1)
    assert [(g.shape, g.bytes, g.layer) for g in found] == [((1, 16, 8, 8, 4), 16 * 8 * 8 * 4 * 4, "")]


def test_transposed_convolution_gradient_is_caught():
    """Keras's own transposed convolution, traced outside fullres's split step (`split_ops`, which computes it without
    gathers): XLA's partitioned gradient gathers the activation, and the gather is named by its layer."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, None, None, 4))
    outputs = keras.layers.Conv3D(3, 1)(keras.layers.Conv3DTranspose(4, 2, strides=2, name="upsampling")(inputs))
    model = keras.Model(inputs, outputs)
    state = program.initial_state(model, keras.optimizers.SGD(0.1))
    distribution = device_mesh.make_distribution(partitioning.PartitionConfig((1, 4, 1, 1, 1)), jax.devices()[:4])
    placed = placement.place_state(state, distribution)
    images, labels = placement.place_batch(distribution, np.zeros((1, 16, 8, 8, 4), np.float32), np.zeros((1, 32, 16, 16), np.int32))
    function = jax.jit(step.make_loss_and_grads(model, losses.dice_cross_entropy),
                       in_shardings=(placement.state_shardings(placed, distribution), images.sharding, labels.sharding))
    lowered = function.lower(placed, images, labels)
    compiled = lowered.compile()
    assert compiled_step.communication(compiled.as_text(), replica_batch=1)[0]
    # Named by the layer whose gradient gathers (from a fresh compile: a cached program may carry another's names).
    assert {g.layer for g in gathers.of_step(lowered, compiled, replica_batch=1)} == {"upsampling"}


@pytest.mark.parametrize("text, expected", [("16GiB", 16 * 2**30), ("32 GB", 32 * 10**9), ("512MiB", 512 * 2**20),
                                            ("1e9", 10**9)])
def test_parse_bytes(text, expected):
    assert sizes.parse_bytes(text) == expected


def test_parse_bytes_refuses_nonsense():
    with pytest.raises(ValueError, match=r"--device-memory 'lots' is not a size; write e.g. 16GiB"):
        sizes.parse_bytes("lots")


@pytest.mark.slow
def test_plan_command_json():
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "--image-size", "16,16,16", "--partitions", "1,2",
         "--num-levels", "2", "--base-filters", "4", "--json"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan["target"] == "cpu" and plan["launch"] is None and plan["refused"] == []
    rows = plan["rows"]
    assert [r["partitions"] for r in rows] == [1, 2]
    assert set(rows[0]) == {"partitions", "input_partition_dims", "temp_bytes", "argument_bytes", "total_bytes",
                            "efficiency", "activation_all_gathers", "halo_bytes", "fits", "halo_bound_bytes",
                            "halo_ratio", "rank", "near_tie", "compile_seconds", "flops", "bytes_accessed",
                            "compiler_seconds", "cpu_total_bytes", "estimate", "cached", "gathered",
                            "all_to_all_bytes", "compiler_options", "compiler_total_bytes", "device_terms",
                            "expected_compile_seconds", "ring_bytes", "attention_score_bytes", "unsplit_score_bytes"}
    assert rows[1]["ring_bytes"] == rows[1]["attention_score_bytes"] == 0  # a UNet has no attention
    assert rows[1]["flops"] > 0 and rows[1]["estimate"] is None  # the CPU's counts; no estimate for virtual devices
    assert [r["input_partition_dims"] for r in rows] == [[1, 1, 1, 1, 1], [1, 2, 1, 1, 1]]
    assert rows[1]["activation_all_gathers"] == 0 and rows[1]["gathered"] == [] and rows[1]["halo_bytes"] > 0
    assert rows[1]["all_to_all_bytes"] == 0  # nothing moves a split between axes in a step without rotations


@pytest.mark.slow
def test_retinanet_plan_partitions_without_all_gathers():
    config = compiled_step.plan_config("retinanet", overrides=SMALL_RETINANET)
    rows = layout_search.plan(config, compiled_step.example_shape(config, (256, 256)), [1, 4])
    assert rows[1].temp_bytes < rows[0].temp_bytes
    assert [r.activation_all_gathers for r in rows] == [0, 0]
    assert rows[1].halo_bytes > 0 and rows[1].input_partition_dims == (1, 4, 1, 1)


def test_plan_refuses_an_image_the_pyramid_cannot_split():
    config = compiled_step.plan_config("retinanet", overrides={**SMALL_RETINANET, "image_size": "200,256"})
    with pytest.raises(partitioning.PartitionError, match=r"height 200 \(input_partition_dims\[1\] = 8\)"):
        layout_search.plan(config, compiled_step.example_shape(config, None), [8])


# ---------------------------------------------------------------- plan compiles the step train runs


def _train_lowering(config, shape, devices):
    """The step exactly as `train.train` (`run_setup.set_up`) builds, places and jits it, lowered on real (random) arrays."""
    from trainer.data import batches as batches_lib
    from trainer.engine import program
    from trainer.tasks import registry

    task = registry.make_task(config)
    image_shape = (config.batch_size, *shape)
    distribution = device_mesh.make_distribution(config.partition, devices)
    keras.utils.set_random_seed(config.seed)
    with distribution.scope():
        model, optimizer, _, state = program.build_model(config, task, config.steps)
    state = placement.place_state(state, distribution)
    train_step = step.jit_step(task, model, optimizer, distribution, state, len(image_shape))
    rng = np.random.default_rng(0)
    batch = batches_lib.HostBatch(
        {"image": rng.integers(-100, 100, image_shape).astype(np.int16), "scale": np.ones(image_shape[:1], np.float32)},
        rng.integers(0, 3, image_shape[:-1]).astype(np.uint8), ids=[])
    inputs, labels = task.place(distribution, batch)
    number = jax.device_put(np.int32(0), distribution.replicated_layout(0).backend_layout)
    return train_step.lower(state, inputs, labels, number), state


@pytest.mark.slow
def test_plan_lowers_exactly_the_step_train_runs_and_keeps_remat():
    config = compiled_step.plan_config("unet3d", overrides={"model.num_levels": 2, "model.base_filters": 4,
                                                          "partition.input_partition_dims": "1,2,1,1,1",
                                                          "remat": True})
    shape = compiled_step.example_shape(config, (16, 16, 16))
    devices = jax.devices()[:2]
    planned, _ = compiled_step.lower_step(config, shape, devices)
    trained, state = _train_lowering(config, shape, devices)
    assert planned.as_text() == trained.as_text()
    parameters = sum(int(np.prod(w.shape)) for w in state.trainable)
    planned_parameters = sum(int(np.prod(a.shape)) for a in planned.args_info[0][0].trainable)
    assert planned_parameters == parameters > 0
    # remat is part of the compiled step: without it, the module has only the barrier that orders the batch metrics
    # before the loss (`engine.step`, forward and backward), none of remat's
    plain, _ = compiled_step.lower_step(dataclasses.replace(config, remat=False), shape, devices)
    assert planned.as_text().count("optimization_barrier") > plain.as_text().count("optimization_barrier")


def test_plan_refuses_remat_for_retinanet_as_training_does():
    config = compiled_step.plan_config("retinanet", overrides={**SMALL_RETINANET, "remat": True})
    with pytest.raises(ValueError, match="remat is implemented for the UNet only"):
        layout_search.search(config, compiled_step.example_shape(config, None), [1], layouts_to_try="default",
                           efficiency=False)


# ---------------------------------------------------------------- layouts: enumerate, prune, rank


def test_layouts_of_n_over_the_spatial_dimensions():
    assert layout_search.layouts(4, 2) == [(1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1)]
    three = layout_search.layouts(8, 3)
    assert len(three) == 10 and len(set(three)) == 10
    assert all(np.prod(d) == 8 and d[0] == d[-1] == 1 for d in three)
    assert len(layout_search.layouts(64, 3)) == 28


def _row(dims, halo, total, fits=None):
    return plan_row.PlanRow(int(np.prod(dims)), dims, total, 0, total, None, 0, halo, fits)


def test_ranking_fits_first_then_halo_then_memory_with_near_ties_marked():
    rows = [_row((1, 8, 1, 1), 100, 10), _row((1, 2, 4, 1), 60, 12), _row((1, 4, 2, 1), 61, 11),
            _row((1, 1, 8, 1), 50, 99), _row((1, 1, 1, 8), 80, 10)]
    ranked = layout_search.rank_rows(rows, device_memory=50)
    # 61 is within 2 % of 60: a near-tie, and memory (11 < 12) orders the two; the row over budget comes last.
    assert [r.input_partition_dims for r in ranked] == [(1, 4, 2, 1), (1, 2, 4, 1), (1, 1, 1, 8), (1, 8, 1, 1),
                                                        (1, 1, 8, 1)]
    assert [r.rank for r in ranked] == [1, 2, 3, 4, 5]
    assert [r.near_tie for r in ranked] == [True, True, False, False, False]


def test_without_a_budget_the_leanest_layouts_rank_first_by_halo():
    rows = [_row((1, 8, 1, 1), 100, 10), _row((1, 2, 4, 1), 60, 12), _row((1, 4, 2, 1), 61, 11),
            _row((1, 1, 8, 1), 50, 99), _row((1, 1, 1, 8), 80, 10.1)]
    ranked = layout_search.rank_rows(rows)
    # the budget is 10 + 2 %: (1,1,1,8) and (1,8,1,1) fit it and halo orders them; the rest follow by memory.
    assert [r.input_partition_dims for r in ranked] == [(1, 1, 1, 8), (1, 8, 1, 1), (1, 4, 2, 1), (1, 2, 4, 1),
                                                        (1, 1, 8, 1)]
    assert not any(r.near_tie for r in ranked)


def _compiled_dims(lines):
    return {tuple(int(v) for v in line.split()[2].split(",")) for line in lines if " compiling " in line}


@pytest.mark.slow
def test_2d_search_ranks_a_two_axis_split_above_the_one_axis_splits():
    config = _unet_config(spatial_dims=2, **{"model.num_levels": 2, "model.base_filters": 4})
    lines = []
    # A budget every layout fits: halo alone orders them.
    result = layout_search.search(config, compiled_step.example_shape(config, (32, 32)), [8], device_memory=2**30,
                                log=lines.append)[0]
    by_dims = {r.input_partition_dims: r for r in result.rows}
    assert set(by_dims) == {(1, 1, 8, 1), (1, 2, 4, 1), (1, 4, 2, 1), (1, 8, 1, 1)} and not result.pruned
    assert result.rows[0].input_partition_dims in {(1, 2, 4, 1), (1, 4, 2, 1)}
    assert result.rows[0].halo_bytes < 0.9 * min(by_dims[(1, 8, 1, 1)].halo_bytes, by_dims[(1, 1, 8, 1)].halo_bytes)
    assert [r.rank for r in result.rows] == [1, 2, 3, 4]
    # every measured halo is at least its lower bound, and N = 1 was compiled once for E(N)
    assert all(r.halo_bytes >= r.halo_bound_bytes > 0 for r in result.rows)
    assert all(0 < r.efficiency <= 1.05 for r in result.rows)
    assert _compiled_dims(lines) == {(1, 1, 1, 1), *by_dims}


@pytest.mark.slow
def test_layouts_that_cannot_divide_are_pruned_and_never_compiled():
    # depth 12 with 2 halvings is 3 at the coarsest level: no split of depth by 2 or 4 divides it.
    config = _unet_config(**{"model.base_filters": 4})
    lines = []
    result = layout_search.search(config, compiled_step.example_shape(config, (12, 16, 16)), [4], efficiency=False,
                                log=lines.append)[0]
    assert {d for d, _ in result.pruned} == {(1, 2, 1, 2, 1), (1, 2, 2, 1, 1), (1, 4, 1, 1, 1)}
    assert {r.input_partition_dims for r in result.rows} == {(1, 1, 1, 4, 1), (1, 1, 2, 2, 1), (1, 1, 4, 1, 1)}
    assert _compiled_dims(lines) == {r.input_partition_dims for r in result.rows}
    assert any("3 layout(s) pruned" in line for line in lines)
    assert "depth 12" in dict(result.pruned)[(1, 4, 1, 1, 1)]


def test_no_layout_that_divides_is_refused_with_the_reason():
    config = _unet_config(**{"model.base_filters": 4})
    with pytest.raises(partitioning.PartitionError, match=r"no layout of 8 cores divides \[12, 12, 12\]"):
        layout_search.search(config, compiled_step.example_shape(config, (12, 12, 12)), [8])


def test_recorded_512_search_ranks_an_efficient_low_halo_layout_first():
    """The 3D UNet at 512³ on 64 devices, as benchmarks/partitioning/memory_scaling.py --layout-search measured it."""
    with open(os.path.join(REPOSITORY, "benchmarks", "results", "layout_search.json")) as file:
        cases = json.load(file)
    case = next(c for c in cases if c["model"] == "unet3d" and c["image_size"] == [512] * 3 and c["partitions"] == 64)
    rows = layout_search.rank_rows([plan_row.PlanRow.from_json(r) for r in case["rows"]])
    assert [list(r.input_partition_dims) for r in rows] == [r["input_partition_dims"] for r in case["rows"]]
    one_d = next(r for r in rows if r.input_partition_dims == (1, 64, 1, 1, 1))
    assert len(rows) == 28 and rows[0].efficiency >= 0.95 and rows[0].halo_bytes <= one_d.halo_bytes / 3


@pytest.mark.parametrize("cores, said", [(1, "each host: 1 core to feed its devices"),
                                         (3, "each host: 3 cores to feed its devices"),
                                         (None, "each host: 96.0 MiB of memory")])
def test_the_launch_says_the_cores_each_host_needs_to_feed_its_devices(cores, said):
    """The line after `--data` on a target: the cores (one or several; none where the input keeps up on what
    it has not measured) and the decoded cache's memory per host."""
    found = {"target": "v5e:4x4", "input_partition_dims": [1, 16, 1, 1, 1], "replicas": 1, "cores_per_replica": 16,
             "hosts": 4, "host": {"cores_for_input": cores, "cache_bytes_per_process": 96 * 2**20},
             "vertex": {}, "parameters": {"input_partition_dims": "1,16,1,1,1"}}
    plan = memory_plan.Plan([], "header", "v5e:4x4", None, found)
    (line,) = [line for line in plan_text.launch_lines(plan) if line.startswith("each host:")]
    assert line.startswith(said) and line.endswith("96.0 MiB of memory for the decoded cache")
