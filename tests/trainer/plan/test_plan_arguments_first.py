"""Every `fullres plan` argument is checked before the first compile: `--partitions 1,2,3` on a
volume 3 cannot divide compiled 1 and 2 (about 20 s here) before refusing 3. Since then an N that
cannot divide no longer ends the plan: it is said before the first compile and the other N are planned."""

import pytest


from trainer import presets
from trainer.parallel import partitioning
from trainer.plan import compiled_step, layout_measure, layout_search


def test_a_plan_whose_every_count_cannot_divide_is_refused_before_anything_compiles(monkeypatch):
    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_measure, "measure", no_compile)
    monkeypatch.setattr(compiled_step, "StepBuilder", no_compile)  # nor is the model built
    with pytest.raises(partitioning.PartitionError) as refused:
        layout_search.search(presets.smoke(), (16, 16, 16, 1), [3], layouts_to_try="default",
                             log=lambda line: None)
    assert str(refused.value) == (
        "--partitions 3 (split 1,3,1,1,1): depth 16 (input_partition_dims[1] = 3) does not fit a model with 1 "
        "downsampling: at the input it is 16, which does not divide by 3; use depth 12 or 18 (multiples of 6). No "
        "other split of 3 cores divides [16, 16, 16] either.")


def test_a_count_that_cannot_divide_is_said_before_the_others_compile(monkeypatch):
    """Before: `--partitions 1,2,3` refused the whole plan at 3; now 3 is said first, and 1 and 2 are planned."""
    said = []

    def no_compile(builder, dims, *arguments, **keywords):
        said.append(f"compile {','.join(map(str, dims))}")
        raise RuntimeError("stop after the first compile")

    monkeypatch.setattr(layout_measure, "measure", no_compile)
    with pytest.raises(RuntimeError, match="stop after the first compile"):
        layout_search.search(presets.smoke(), (16, 16, 16, 1), [1, 2, 3], layouts_to_try="default",
                             log=said.append)
    assert said[0].startswith("N=3: --partitions 3 (split 1,3,1,1,1): depth 16 (input_partition_dims[1] = 3)")
    assert said[-1] == "compile 1,1,1,1,1"


def test_records_that_are_not_there_are_named_before_anything_compiles(monkeypatch, tmp_path):
    from trainer.plan import memory_plan

    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_measure, "measure", no_compile)
    with pytest.raises(FileNotFoundError, match=r"^no TFRecord files match --data '.*/nowhere'; pass a data set "):
        memory_plan.run(preset="smoke", image_size=(16, 16, 16), partitions=(1, 2), data=str(tmp_path / "nowhere"),
                        log=lambda line: None)


def test_records_of_another_size_are_named_before_anything_compiles(monkeypatch, demo_data):
    """`fullres plan --image-size 8,16,64 --data <16³ records>` compiled every layout (45 s here) before saying so."""
    from trainer.plan import memory_plan

    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_measure, "measure", no_compile)
    with pytest.raises(ValueError) as refused:
        memory_plan.run(preset="smoke", image_size=(8, 16, 64), partitions=(1, 2), data=demo_data["train"],
                        log=lambda line: None)
    assert str(refused.value) == (f"--data {demo_data['train']} holds volumes of 16x16x16 but the plan is for 8x16x64; "
                                  "plan with --image-size 16,16,16, or pass records of that size.")
