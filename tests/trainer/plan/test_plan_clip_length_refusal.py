"""`fullres plan --data CLIPS` refuses a split the clip length cannot take in the words `fullres train` uses (the
clip length, `fullres preprocess video --clip-length`), not in CT's ("depth")."""

from typer.testing import CliRunner

from tests import files
from tests.trainer.predict import video_runs


def test_a_plan_whose_clip_length_does_not_fit_the_split_names_the_clip_length(tmp_path):
    """Before: clips of 4 frames split 2 ways in time were told to "use depth 8 or more, or do not split depth"."""
    from pipelines import cli

    short = video_runs.write_clips(tmp_path / "short", ["cat", "dog"], clip=(4, 16, 16))
    before = files.snapshot(tmp_path)
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--in-channels", "3", "--image-size", "4,16,16",
                                          "--input-partition-dims", "1,2,1,1,1",
                                          "--data", short])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "fullres: error: clip length 4 (input_partition_dims[1] = 2) is 2 frames at resolution level 2, 1 on each of "
        "its 2 devices, where XLA gathers whole activations and can compute wrong gradients; use clips of 8 or more "
        "frames (fullres preprocess video --clip-length 8), or do not split the clip length.\n")
    assert files.snapshot(tmp_path) == before
