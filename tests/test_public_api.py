"""The public API (`import fullres`): a Keras distribution for any network, and plan / train taking a network's
function or FILE.py:FUNCTION, refusing in one sentence what cannot work."""

import os

import jax
import keras
import pytest

import fullres
from tests.trainer import user_networks
from trainer.parallel import partitioning


def test_spatial_parallel_lays_out_images_sparse_labels_and_the_rest():
    distribution = fullres.SpatialParallel([1, 2, 2, 1, 1])  # 8 devices: 2 replicas × 4 cores
    assert isinstance(distribution, keras.distribution.ModelParallel)  # what keras.distribution.set_distribution takes
    assert distribution.get_data_layout((2, 32, 16, 16, 1)).axes == ("replica", "depth", "height", None, None)
    assert distribution.get_data_layout((2, 32, 16, 16)).axes == ("replica", None, None, None)  # labels: whole
    assert distribution.get_data_layout((2, 3)).axes == ("replica", None)  # e.g. sample weights per class
    split_labels = fullres.SpatialParallel([1, 4, 1, 1, 1], label_partition_dims=[1, 4, 1, 1])
    assert split_labels.get_data_layout((2, 32, 16, 16)).axes == ("replica", "depth", None, None)
    assert fullres.SpatialParallel([1, 4, 1, 1], devices=jax.devices()[:4]).num_replicas == 1


@pytest.mark.parametrize("dims, message", [
    ([1, 4, 1, 1, 2], r"input_partition_dims\[4\] = 2 partitions the channels"),
    ([2, 4, 1, 1, 1], r"input_partition_dims\[0\] = 2 partitions the batch dimension"),
    ([1, 4, 1], r"input_partition_dims \[1, 4, 1\] has 3 entries; fullres partitions 4-D .* or 5-D"),
    ([1, 3, 1, 1, 1], r"asks for 3 cores per replica, which does not divide the 8 devices present"),
])
def test_spatial_parallel_refuses_a_split_that_cannot_work(dims, message):
    with pytest.raises(partitioning.PartitionError, match=message):
        fullres.SpatialParallel(dims)


def test_a_network_is_named_by_its_file_and_a_function_without_one_is_refused():
    assert fullres.source_of(user_networks.residual_groupnorm) == f"{user_networks.__file__}:residual_groupnorm"
    with pytest.raises(ValueError, match=r"^<lambda> is not a function at the top level of a Python file"):
        fullres.source_of(lambda num_classes, in_channels: None)


def test_train_reaches_fullres_training_with_the_network(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no TFRecord files match --train '/nowhere/data-\*'"):
        fullres.train(user_networks.residual_groupnorm, train="/nowhere/data-*", output=str(tmp_path / "run"),
                      input_partition_dims=(1, 4, 1, 1, 1), steps=1)
    assert not os.path.exists(tmp_path / "run")
    with pytest.raises(ValueError, match=r"unknown setting fullres.train\(model.num_levels=3\) with --model "
                                         r".*user_networks.py"):
        fullres.train(user_networks.residual_groupnorm, train="/nowhere/data-*", output=str(tmp_path / "run"),
                      **{"model.num_levels": 3})


@pytest.mark.parametrize("setting, sentence", [
    ({"learning_rate": float("nan")}, "fullres.train(learning_rate=nan): learning_rate must be a finite number, got "
                                      "nan; give a number such as 0.5."),
    ({"steps": 2.5}, "fullres.train(steps=2.5): steps must be a whole number, got 2.5; write it like 2."),
])
def test_a_bad_setting_is_named_as_the_argument_given(tmp_path, setting, sentence):
    """It was named as the internal override ("train override learning_rate must be ...")."""
    with pytest.raises(ValueError) as refused:
        fullres.train(user_networks.residual_groupnorm, train="/nowhere/data-*", output=str(tmp_path / "run"),
                      **setting)
    assert str(refused.value) == sentence
    assert not os.path.exists(tmp_path / "run")
