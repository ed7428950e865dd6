"""One config path: `config_resolution.resolve` turns (task, preset, data, dotted overrides) into a validated TrainConfig."""

import json

import pytest

from common import parsing
from trainer import config
from trainer import config_resolution
from trainer import presets
from trainer.augment import recipe as augment_recipe


def test_dotted_overrides_reach_the_model_the_partition_and_the_run():
    resolved = config_resolution.resolve(preset="demo", train_data="d/train-*.tfrecord", output_dir="run",
                              overrides={"model.num_levels": "2", "partition.input_partition_dims": "1,2,1,1,1",
                                         "steps": "10", "remat": "true", "learning_rate": "1e-2"})
    assert resolved.model.num_levels == 2 and resolved.model.base_filters == presets.demo().model.base_filters
    assert resolved.partition.input_partition_dims == (1, 2, 1, 1, 1)
    assert (resolved.steps, resolved.remat, resolved.learning_rate) == (10, True, 1e-2)
    assert (resolved.train_data, resolved.output_dir) == ("d/train-*.tfrecord", "run")


def test_none_keeps_the_preset_value_and_none_as_text_clears_an_optional_setting():
    resolved = config_resolution.resolve(preset="demo", overrides={"steps": None, "partition.label_partition_dims": "none"})
    assert resolved.steps == presets.demo().steps
    assert resolved.partition.label_partition_dims is None


def test_none_is_a_value_of_a_text_setting_that_cannot_be_cleared():
    """`--stem none` / `--set model.normalization=none` name a choice; they are not an empty setting."""
    resolved = config_resolution.resolve(overrides={"model.stem": "none", "model.normalization": "none"})
    assert (resolved.model.stem, resolved.model.normalization) == ("none", "none")
    assert resolved.model.downsampling_levels == resolved.model.num_levels - 1
    with pytest.raises(ValueError, match="train override model.stem needs a value"):
        config_resolution.resolve(overrides={"model.stem": " "})
    with pytest.raises(ValueError, match="train override steps needs a value"):
        config_resolution.resolve(overrides={"steps": "none"})


def test_kfp_numbers_and_nested_dicts_are_read_as_dotted_keys():
    # KFP hands a dict parameter over as a protobuf Struct: every number a double.
    resolved = config_resolution.resolve(preset="smoke", overrides={"model": {"num_classes": 2.0}, "batch_size": 4.0})
    assert resolved.model.num_classes == 2 and isinstance(resolved.model.num_classes, int)
    assert resolved.batch_size == 4 and isinstance(resolved.batch_size, int)


def test_unknown_key_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError) as refused:
        config_resolution.resolve(overrides={"model.num_level": 5})
    message = str(refused.value)
    assert message.startswith("unknown train override model.num_level; valid ones: ")
    assert "model.num_levels" in message and "partition.input_partition_dims" in message and "steps" in message


def test_detection_keys_are_the_detector_s():
    with pytest.raises(ValueError, match="unknown train override model.num_levels; valid ones: .*model.head_filters"):
        config_resolution.resolve(task="detection", overrides={"model.num_levels": 3})


@pytest.mark.parametrize("overrides, message", [
    ({"steps": "2.5"}, "train override steps must be a whole number, got 2.5; write it like 2."),
    ({"remat": "maybe"}, "train override remat is true or false, got 'maybe'."),
    ({"partition.input_partition_dims": "1,x,1"}, "partition.input_partition_dims '1,x,1' is not a comma-separated "
                                                  "list of ints; write it like 1,4,1,1,1."),
    # nan passed `learning_rate <= 0` and would have trained into nan losses; every float setting is finite (#43)
    ({"learning_rate": "nan"}, "train override learning_rate must be a finite number, got 'nan'; give a number such "
                               "as 0.5."),
    ({"learning_rate": "inf"}, "train override learning_rate must be a finite number, got 'inf'; give a number such "
                               "as 0.5."),
    ({"weight_decay": "nan"}, "train override weight_decay must be a finite number, got 'nan'; give a number such as "
                              "0.5."),
])
def test_bad_values_are_one_sentence(overrides, message):
    with pytest.raises(ValueError) as refused:
        config_resolution.resolve(overrides=overrides)
    assert str(refused.value) == message


def test_preset_and_task_must_agree():
    with pytest.raises(ValueError, match="preset detection_demo is a detection preset but the task is segmentation"):
        config_resolution.resolve(preset="detection_demo")
    with pytest.raises(ValueError, match="preset 'huge' is not known; use default or one of ct_256, demo"):
        config_resolution.resolve(preset="huge")


def test_detection_class_count_comes_from_the_label_map_unless_given(tmp_path):
    (tmp_path / "label_map.json").write_text(json.dumps({"circle": 1, "square": 2, "triangle": 5}))
    pattern = str(tmp_path / "train-*.tfrecord")
    assert config_resolution.resolve(task="detection", train_data=pattern).model.num_classes == 5
    assert config_resolution.resolve(task="detection", train_data=pattern,
                          overrides={"model.num_classes": "7"}).model.num_classes == 7


def test_auto_partition_dims_pass_the_list_parser():
    assert config.setting_types("segmentation")["partition.input_partition_dims"] is not None
    resolved = config_resolution.resolve(preset="demo", overrides={"partition.input_partition_dims": " Auto"})
    assert resolved.partition.input_partition_dims == "auto"


def test_set_flags_are_key_value_pairs():
    assert parsing.parse_settings(["model.num_levels=5", "partition.input_partition_dims=1,4,1,1,1"]) == {
        "model.num_levels": "5", "partition.input_partition_dims": "1,4,1,1,1"}
    with pytest.raises(ValueError, match="--set 'steps' is not key=value; write it like --set model.num_levels=5."):
        parsing.parse_settings(["steps"])




def test_augmentation_is_a_preset_then_fields_and_mirroring_is_per_axis():
    resolved = config_resolution.resolve(preset="demo", overrides={"augmentation": "nnunet", "augmentation.mirror_axes": "0,1",
                                                       "augmentation.noise_probability": "0.3"})
    assert resolved.augmentation.mirror_axes == (0, 1)  # left-right (W) kept as it is
    assert resolved.augmentation.noise_probability == 0.3 and resolved.augmentation.rotation_probability == 0.2
    assert config.from_dict(config.to_dict(resolved)) == resolved
    assert config_resolution.resolve(overrides={"augmentation.mirror_axes": "none"}).augmentation.mirror_axes == ()
    assert config_resolution.resolve(preset="nnunet").augmentation == augment_recipe.preset("nnunet")
    assert config_resolution.resolve().augmentation == augment_recipe.preset("flips")  # the default: flips, as before


def test_a_run_from_before_the_augmentation_setting_reads_back_with_flips():
    values = config.to_dict(presets.smoke())
    del values["augmentation"]
    assert config.from_dict(values).augmentation == augment_recipe.preset("flips")


@pytest.mark.parametrize("overrides, message", [
    ({"augmentation": "heavy"}, r"augmentation 'heavy' is not known; use one of nnunet, flips, intensity, video, none"),
    ({"augmentation.mirror_axes": "0,3"}, r"mirror_axes \[0, 3\] names axis 3, which a 3D model does not have"),
    ({"augmentation.scale": "1.4,0.7"}, r"augmentation.scale|AugmentationConfig.scale must be a range LOW,HIGH"),
    ({"augmentation.rotation_degrees": "60"}, r"rotation_degrees must be in \[0, 45\)"),
    ({"augmentation.blur_probability": "1.5"}, r"blur_probability must be in \[0, 1\], got 1.5"),
])
def test_bad_augmentation_settings_are_refused_in_a_sentence(overrides, message):
    with pytest.raises(ValueError, match=message):
        config_resolution.resolve(overrides=overrides)


def test_detection_has_no_device_augmentation_setting():
    with pytest.raises(ValueError, match="unknown train override augmentation; valid ones"):
        config_resolution.resolve(task="detection", overrides={"augmentation": "nnunet"})
