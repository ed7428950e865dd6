"""`fullres plan` refuses sizes no model can be built for, in one sentence, before building one (issue #23 item 9)."""

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
], ids=["zero-depth", "negative-width", "zero-canvas", "3d-count", "2d-count", "retinanet-count", "zero-cores",
        "negative-cores", "dims-count", "dims-zero", "zero-minutes"])
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
