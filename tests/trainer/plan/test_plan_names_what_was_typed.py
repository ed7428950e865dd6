"""`fullres plan` answers in the options the user typed: `--input-partition-dims` (not the `--partitions` it
becomes), `--batch-size` and `--in-channels` (not `TrainConfig.batch_size`, `UNetConfig.in_channels`); and a count
given twice in `--partitions` is planned and shown once."""

import json

import pytest
from typer.testing import CliRunner


def _plan(*arguments):
    from pipelines import cli

    return CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", *arguments])


def _sentence(result) -> str:
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    [line] = result.stderr.strip().splitlines()
    return line.removeprefix("fullres: error: ")


@pytest.mark.parametrize("arguments, sentence", [
    (["--input-partition-dims", "1,2,1,1,1", "--target", "h100x1"],
     "--target h100x1 has 1 device; --input-partition-dims 1,2,1,1,1 splits each example over 2 devices: choose a "
     "larger slice or more GPUs, or dims whose product is at most 1."),
    (["--partitions", "1,2", "--target", "h100x1"],
     "--target h100x1 has 1 device; --partitions 2 needs more: choose a larger slice or more GPUs, or counts of at "
     "most 1."),
    (["--batch-size", "0"], "--batch-size 0: batch_size must be >= 1, got 0."),
    (["--in-channels", "0"], "--in-channels 0: in_channels must be >= 1, got 0."),
    (["--num-levels", "0"], "--num-levels 0: num_levels must be >= 1, got 0."),
    (["--set", "model.in_channels=0"], "--set model.in_channels=0: in_channels must be >= 1, got 0."),
], ids=["dims-over-the-target", "count-over-the-target", "batch-size", "in-channels", "num-levels", "set"])
def test_plan_names_the_option_as_typed(arguments, sentence):
    assert _sentence(_plan("--image-size", "16,16,16", *arguments)) == sentence


@pytest.mark.slow  # one smoke UNet compiled on the CPU (before: twice) and its receptive field: about 10 s here
def test_a_count_given_twice_is_planned_and_shown_once():
    result = _plan("--image-size", "8,8,8", "--partitions", "1,1", "--json")
    assert result.exit_code == 0, result.output
    assert [row["input_partition_dims"] for row in json.loads(result.stdout)["rows"]] == [[1, 1, 1, 1, 1]]
    assert "--partitions 1,1 names 1 more than once; each count is planned once" in result.stderr
