"""Every `fullres plan` argument is checked before the first compile (issue #43 item 8): `--partitions 1,2,3` on a
volume 3 cannot divide compiled 1 and 2 (about 20 s here) before refusing 3."""

import pytest

from trainer import config as config_lib
from trainer.parallel import partitioning
from trainer.plan import layout_search


def test_a_count_that_cannot_divide_is_refused_before_anything_compiles(monkeypatch):
    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_search, "measure", no_compile)
    with pytest.raises(partitioning.PartitionError) as refused:
        layout_search.search(config_lib.smoke(), (16, 16, 16, 1), [1, 2, 3], layouts_to_try="default",
                             log=lambda line: None)
    assert str(refused.value) == (
        "--partitions 3 (split 1,3,1,1,1): depth 16 (input_partition_dims[1] = 3) does not fit a model with 1 "
        "downsampling: at the input it is 16, which does not divide by 3; use depth 12 or 18 (multiples of 6).")


def test_records_that_are_not_there_are_named_before_anything_compiles(monkeypatch, tmp_path):
    from trainer.plan import memory_plan

    def no_compile(*arguments, **keywords):
        raise AssertionError("a layout was compiled before the refusal")

    monkeypatch.setattr(layout_search, "measure", no_compile)
    with pytest.raises(FileNotFoundError, match=r"^no TFRecord files match --data '.*/nowhere'; pass a data set "):
        memory_plan.run(preset="smoke", image_size=(16, 16, 16), partitions=(1, 2), data=str(tmp_path / "nowhere"),
                        log=lambda line: None)
