"""`fullres plan` goes on past an N its default layout cannot divide.

Before: `fullres plan --image-size 64,1080,1920 --in-channels 3` (the issue's 1080p clip) stopped at N=16 with
"--partitions 16 (split 1,16,1,1,1): depth 64 ... does not divide by 16" and planned nothing, though width splits
16 ways (`--layouts all` ranked `1,1,1,16,1` first). Now the default plan stands in the dividing split of least halo
for such an N, says so in its row, and an N that no split divides is a row with its reason; only a plan of which
no N divides is refused.
"""

import pytest
from typer.testing import CliRunner

from trainer.plan import compiled_step, layout_measure, layout_search


def test_the_issues_1080p_clip_at_16_devices_is_planned_split_along_width():
    """The exact shape of the issue's plan command, the default model with 3 channels: nothing is compiled."""
    config = compiled_step.plan_config(None, "default", {"model.in_channels": 3})
    shape = compiled_step.example_shape(config, (64, 1080, 1920))
    builder = compiled_step.StepBuilder(config, shape)
    found = layout_search.candidates("default", 16, config, shape, lambda: builder)
    assert found.kept == [(1, 1, 1, 16, 1)] and not found.cannot_divide
    assert found.replaced.startswith("1,16,1,1,1 cannot divide: depth 64 (input_partition_dims[1] = 16) does not fit")
    assert "Planned 1,1,1,16,1 instead: of the 4 splits of 16 cores that divide, the least halo" in found.replaced
    # the stand-in has the least halo bound of every split of 16 that divides
    dividing, _ = layout_search.prune(layout_search.layouts(16, 3), config, shape)
    bounds = {dims: layout_measure.lower_bound(builder.windows(), dims) for dims in dividing}
    assert bounds[(1, 1, 1, 16, 1)] == min(bounds.values()) and len(bounds) == 4
    # where the default divides, it is kept as it was
    assert layout_search.candidates("default", 8, config, shape, lambda: builder).kept == [(1, 8, 1, 1, 1)]


def test_a_plan_of_which_no_count_divides_is_one_sentence(monkeypatch):
    from pipelines import cli

    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_measure, "measure", no_compile)
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "8,16,32", "--in-channels", "3",
                                          "--partitions", "3,5", "--layouts", "all"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        "fullres: error: no layout of 3 cores divides [8, 16, 32] at every resolution level: width 32 "
        "(input_partition_dims[3] = 3) does not fit a model with 1 downsampling: at the input it is 32, which does "
        "not divide by 3; use width 30 or 36 (multiples of 6).")


@pytest.mark.slow  # two compiles of the smoke UNet on a tiny clip: ~15 s on the shared 2-core machine
def test_a_clip_plan_goes_on_past_counts_that_cannot_divide():
    """A tiny clip, 8 frames of 16x32 RGB, the smoke UNet (1 downsampling): N=2 splits time; N=8 cannot (8 frames
    are 4 after one halving) and stands in a split that divides; N=3 divides nothing and is a row with its reason."""
    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "8,16,32", "--in-channels", "3",
                                          "--partitions", "2,3,8"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    rows = {int(line.split()[0]): line.split()[1] for line in lines[2:] if not line.lstrip().startswith("N=")
            and line.split()[0].isdigit()}
    assert sorted(rows) == [2, 8] and rows[2] == "1,2,1,1,1"
    stand_in = rows[8]
    assert stand_in.split(",")[1] != "8" and len(stand_in.split(",")) == 5
    said = [line.strip() for line in lines if line.lstrip().startswith("N=")]
    assert said[0].startswith("N=3: not planned: --partitions 3 (split 1,3,1,1,1): depth 8 (input_partition_dims[1] "
                              "= 3) does not fit") and said[0].endswith("No other split of 3 cores divides [8, 16, 32] "
                                                                        "either.")
    assert said[1].startswith("N=8: 1,8,1,1,1 cannot divide: depth 8 (input_partition_dims[1] = 8)")
    assert f"Planned {stand_in} instead: of the " in said[1]
    assert lines.index(next(line for line in lines if "N=3: not planned" in line)) < lines.index(
        next(line for line in lines if line.split()[:2] == ["8", stand_in]))  # in N's place in the table
