"""From a plan to what to rent: the launch parameters pass the pipelines' own parameter checks, for every target."""

import pytest

from pipelines import definitions, vertex
from trainer.plan import launch, roofline, targets


@pytest.mark.parametrize("pipeline", list(definitions.PIPELINES))
@pytest.mark.parametrize("name, dims", [
    ("v5e:2x2", (1, 4, 1, 1, 1)), ("v5e:4x4", (1, 4, 4, 1, 1)), ("v5e:8x8", (1, 8, 8, 1)), ("v5p:2x2x4", (1, 16, 1, 1, 1)),
    ("v6e:2x4", (1, 2, 2, 1, 1)), ("v4:2x2x4", (1, 4, 1, 1, 1)), ("tpu7x:2x2x1", (1, 8, 1, 1, 1)),
    ("a100x8", (1, 2, 2, 1, 1)), ("h100x8x2", (1, 8, 1, 1, 1)), ("h200x8", (1, 8, 1, 1, 1)), ("b200x8", (1, 4, 1, 1, 1)),
])
def test_launch_parameters_pass_the_pipelines_parameter_checks(pipeline, name, dims):
    target = targets.parse(name)
    found = launch.launch(target, dims, 1, "bfloat16", "default", {"remat": True})
    lines = [line.removeprefix("--param ").strip("'") for line in launch.param_lines(found["parameters"])]
    parsed = vertex.parse_parameters(pipeline, lines)  # raises on a name or type the pipeline does not take
    assert parsed["input_partition_dims"] == ",".join(map(str, dims))
    assert parsed["batch_size"] == found["replicas"] == target.device_count // found["cores_per_replica"]
    assert parsed["train_overrides"] == {"remat": True} and parsed["precision"] == "bfloat16"
    if found["vertex"] is None:  # not rented through Vertex custom training: said so, and no machine guessed
        assert "machine_type" not in parsed and found["not_on_vertex"].startswith("Vertex AI custom training ")
    elif target.platform == "tpu":  # the pipeline's TPU-slice branch: a topology, one worker pool
        assert parsed["tpu_topology"] == name.split(":")[1] and parsed["replica_count"] == 1
        assert parsed["accelerator_type"] != "CPU"
    else:  # GPUs: per host, and one replica per host
        assert parsed["accelerator_count"] == target.shape[0] and parsed["replica_count"] == target.shape[1]


@pytest.mark.parametrize("name, machine, hosts", [
    ("v5e:2x2", "ct5lp-hightpu-4t", 1), ("v5e:2x4", "ct5lp-hightpu-8t", 1), ("v5e:4x4", "ct5lp-hightpu-4t", 4),
    ("v5e:16x16", "ct5lp-hightpu-4t", 64), ("v5p:2x2x4", "ct5p-hightpu-4t", 4), ("h100x8x2", "a3-highgpu-8g", 2),
])
def test_machines_and_hosts(name, machine, hosts):
    found = launch.launch(targets.parse(name), (1, 4, 1, 1, 1), 1, "float32")
    assert found["vertex"]["machine_type"] == machine and found["hosts"] == found["processes"] == hosts


def test_a_layout_that_does_not_divide_the_target_is_one_sentence():
    with pytest.raises(ValueError, match=r"^--target v5e:2x2 has 4 devices, which 8 cores per replica \(1,8,1,1,1\) "
                                         r"do not divide; choose a slice of a multiple of 8\.$"):
        launch.launch(targets.parse("v5e:2x2"), (1, 8, 1, 1, 1), 1, "float32")


def test_a_plan_file_without_launch_parameters_is_one_sentence(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"target": "cpu", "rows": [], "launch": null}')
    with pytest.raises(ValueError, match=r"has no launch parameters; only a plan for a TPU slice or GPUs has them"):
        vertex.plan_parameters("ct-segmentation", str(path))


def test_roofline_takes_the_slowest_limit_and_the_precisions_peak():
    h100 = targets.hardware("h100")
    compute_bound = roofline.estimate(1e15, 1e9, 0, h100, "bfloat16")
    assert compute_bound.bound == "compute" and compute_bound.seconds == pytest.approx(1e15 / 989e12)
    assert roofline.estimate(1e15, 1e9, 0, h100, "float32").seconds == pytest.approx(1e15 / 494.5e12)  # TF32
    v5e = targets.hardware("v5e")  # float32 convolutions run as one bfloat16 pass at JAX's default precision
    assert roofline.estimate(1e12, 0, 0, v5e, "float32").seconds == pytest.approx(1e12 / 197e12)
    assert roofline.estimate(1e9, 819e9, 0, v5e, "float32").bound == "memory"
    assert roofline.estimate(1e9, 1e6, 4e9, v5e, "float32").bound == "interconnect"
    assert roofline.estimate(1e9, 1e6, 4e9, targets.hardware("v4"), "float32").interconnect_seconds is None


def test_a_kernel_setting_a_tpu_program_does_not_take_is_left_out_of_the_launch_and_said():
    """A TPU program keeps XLA's weight gradients (`kernels.for_platform`); the launch passed `taps` on anyway, and the
    plan said nothing. A GPU program takes it: passed on there."""
    overrides = {"kernels.conv_weight_grad": "taps", "kernels.norm": "fused", "remat": True}
    tpu = launch.launch(targets.parse("v5e:2x2"), (1, 2, 2, 1, 1), 1, "float32", "smoke", overrides)
    assert tpu["parameters"]["train_overrides"] == {"kernels.norm": "fused", "remat": True}
    assert tpu["left_out"] == [
        "--set kernels.conv_weight_grad=taps is left out of the launch: a TPU program computes conv_weight_grad as "
        "xla whatever it says (the TPU compiler pads each narrow channel of the per-tap products to 128 lanes), which "
        "is what this plan sized on v5e:2x2"]
    gpu = launch.launch(targets.parse("h100x8"), (1, 2, 2, 1, 1), 1, "float32", "smoke", overrides)
    assert gpu["parameters"]["train_overrides"] == overrides and gpu["left_out"] == []
