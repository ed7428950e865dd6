"""`fullres plan` refuses sizes no model can be built for, in one sentence, before building one."""

import json

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize("arguments, sentence", [
    (["--model", "unet3d", "--image-size", "0,32,32"],
     "--image-size 0,32,32 gives the depth as 0; every size is a number of voxels and must be 1 or more, e.g. "
     "--image-size 32,32,32."),
    (["--model", "unet2d", "--image-size", "64,-1"],
     "--image-size 64,-1 gives the width as -1; every size is a number of voxels and must be 1 or more, e.g. "
     "--image-size 64,64."),
    (["--model", "retinanet", "--image-size", "0,64"],
     "--image-size 0,64 gives the height as 0; every size is a number of voxels and must be 1 or more, e.g. "
     "--image-size 64,64."),
    (["--model", "unet3d", "--image-size", "32,32"],
     "--image-size needs 3 sizes for a 3D UNet, got [32, 32]; write it like --image-size 256,256,256 (D,H,W), or "
     "size a 2D UNet with --model unet2d."),
    (["--model", "unet2d", "--image-size", "32,32,32"],
     "--image-size needs 2 sizes for a 2D UNet, got [32, 32, 32]; write it like --image-size 256,256 (H,W), or "
     "size a 3D UNet with --model unet3d."),
    (["--model", "retinanet", "--image-size", "32,32,32"],
     "--image-size needs 2 sizes (height,width) for RetinaNet, got [32, 32, 32]; write it like --image-size "
     "1024,1024."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--partitions", "0"],
     "--partitions 0 asks for 0 cores; each entry is a number of cores per replica and must be 1 or more, e.g. "
     "--partitions 1,2,4,8."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--partitions", "1,-2"],
     "--partitions 1,-2 asks for -2 cores; each entry is a number of cores per replica and must be 1 or more, e.g. "
     "--partitions 1,2,4,8."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--input-partition-dims", "1,4,1,1"],
     "--input-partition-dims 1,4,1,1 has 4 entries; this model's inputs have 5 (batch, 3 spatial, channels), e.g. "
     "1,4,1,1,1."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--input-partition-dims", "1,0,1,1,1"],
     "--input-partition-dims 1,0,1,1,1 has an entry below 1; each is how many parts an axis is cut into, e.g. "
     "1,4,1,1,1."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--max-minutes", "0"],
     "--max-minutes 0 must be more than 0, e.g. --max-minutes 30."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--device-memory", "0"],
     "--device-memory 0 must be more than 0, e.g. --device-memory 16GiB."),
    (["--model", "unet3d", "--image-size", "16,16,16", "--patch-size", "8,32,8"],
     "--patch-size 8,32,8 is larger than the 16x16x16 volumes of --image-size 16,16,16; give a patch at most the "
     "volume's size along every axis, or leave --patch-size out to train on whole volumes."),
], ids=["zero-depth", "negative-width", "zero-canvas", "3d-count", "2d-count", "retinanet-count", "zero-cores",
        "negative-cores", "dims-count", "dims-zero", "zero-minutes", "zero-memory", "patch-too-large"])
def test_plan_refuses_a_size_no_model_takes_in_one_sentence(arguments, sentence):
    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["plan", *arguments])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"fullres: error: {sentence}"


@pytest.mark.slow
def test_plan_compiles_exactly_the_layout_given():
    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16",
                                          "--input-partition-dims", "1,2,2,1,1", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["rows"]
    assert row["input_partition_dims"] == [1, 2, 2, 1, 1] and row["partitions"] == 4 and row["halo_bytes"] > 0


@pytest.mark.slow
def test_a_patch_plan_sizes_the_step_on_the_patch_and_reads_the_data_as_crops(demo_data):
    """`--patch-size` plans the step `fullres train --patch-size` compiles (crops, not the volumes it used to size),
    measures `--data` as that run reads it (crops of the records), and still measures the field over the volumes."""
    from pipelines import cli

    def plan(*arguments):
        result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16",
                                              "--input-partition-dims", "1,2,1,1,1", "--json", *arguments])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    whole, patches = plan(), plan("--patch-size", "8,8,8", "--data", demo_data["train"])
    assert patches["header"].startswith("segmentation UNetConfig [8, 8, 8] patches of [16, 16, 16] volumes")
    assert patches["rows"][0]["total_bytes"] < whole["rows"][0]["total_bytes"] / 2
    share = patches["input"]["share"]
    assert share["patch"] == [8, 8, 8] and share["depth"] == [0, 8] and share["bytes_per_example"] == 8**3 * 3
    assert patches["input"]["records"]["examples_per_second"] > 0 and "of 8x8x8 crops" in patches["input"]["line"]
    assert patches["receptive_field"]["size"] == [16, 16, 16]


@pytest.mark.parametrize("target, sentence", [
    ("v5e:3x3", "--target 'v5e:3x3': v5e has no 3x3 slice; its slices are 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16 and 16x16."),
    ("v6e:2x8", "--target 'v6e:2x8': v6e has no 2x8 slice; its slices are 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16 and "
                "16x16."),
    ("v5p:3x3x3", "--target 'v5p:3x3x3': v5p has no 3x3x3 slice; its slices are 2x2x1, 2x2x2, 2x2x4, 2x4x4 and, from "
                  "4x4x4 up, AxBxC with A <= B <= C each a multiple of 4 (4x4x8, 4x8x8, 8x8x8, ...)."),
])
def test_a_slice_the_generation_does_not_come_in_is_named_with_those_it_does(target, sentence):
    """Before: v5e:3x3 got "--partitions 16 needs a larger slice" (and without --partitions 16, libtpu's error)."""
    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16", "--target", target])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"fullres: error: {sentence}"


def test_the_default_partitions_are_those_that_divide_the_targets_devices():
    from trainer.plan import targets

    assert {name: targets.default_partitions(targets.parse(name)) for name in (
        "cpu", "v5e:1x1", "v5e:2x2", "tpu7x:2x2x1", "v5e:8x8", "a100x2", "h100x6", "h100x8x2")} == {
        "cpu": (1, 2, 4, 8, 16), "v5e:1x1": (1,), "v5e:2x2": (1, 2, 4), "tpu7x:2x2x1": (1, 2, 4, 8),
        "v5e:8x8": (1, 2, 4, 8, 16), "a100x2": (1, 2), "h100x6": (1, 2), "h100x8x2": (1, 2, 4, 8, 16)}
    assert [name for name in ("v4:4x4x8", "v5p:8x8x16", "v4:4x4x4") if not targets.has_slice(
        name.split(":")[0], tuple(map(int, name.split(":")[1].split("x"))))] == []


def test_plan_for_a_slice_without_partitions_plans_what_the_slice_holds(monkeypatch):
    """`fullres plan --target v5e:2x2` as its own help writes it: the default 1,2,4,8,16 failed with "--partitions 16
    needs a larger slice". Now 1, 2, 4 are planned; with libtpu hidden the plan stops at the compiler, saying how to
    install it, so nothing is compiled here."""
    import sys

    from pipelines import cli

    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` fails, as where the wheel is not installed
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16", "--target", "v5e:2x2"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0] == ("planning 1, 2, 4 cores per replica: those of 1, 2, 4, 8, 16 that divide the 4 devices of "
                        "v5e:2x2 (--partitions chooses others)")
    assert lines[-1].startswith("fullres: error: --target v5e:2x2 compiles with the TPU compiler, libtpu (")


def test_max_minutes_that_compile_nothing_say_so():
    """`--max-minutes 0.0001` compiled nothing for the target, exited 0 and advised "try more partitions, bfloat16
    or --remat". (The end-to-end run, on the CUDA compiler: test_target_search.py.)"""
    from trainer.plan import layout_search, memory_plan, targets

    left = [layout_search.Search(4, [], [], 0.0, not_compiled=[(1, 4, 1, 1, 1), (1, 1, 4, 1, 1)])]
    with pytest.raises(ValueError) as refused:
        memory_plan.check_compiled(left, targets.parse("v5e:2x2"), 0.0001, 12.4)
    assert str(refused.value) == (
        "--max-minutes 0.0001 ran out after the CPU estimates (12 s), before any of the 2 layout(s) was compiled for "
        "v5e:2x2, so nothing was planned on it; give it more time (a v5e:2x2 compile takes about a minute here), e.g. "
        "--max-minutes 30, or leave --max-minutes out.")
    memory_plan.check_compiled([layout_search.Search(4, [], [], 0.0)], targets.parse("v5e:2x2"), None, 1.0)
