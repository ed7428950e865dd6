"""Every numeric setting is finite before anything runs: nan passes every `<` a range check makes,
so `--set augmentation.scale=nan,nan` trained on destroyed examples and exited 0."""

import math

import pytest


from trainer import config_resolution

from trainer import presets
from trainer.augment import recipe


@pytest.mark.parametrize("key, value, sentence", [
    ("augmentation.scale", "nan,nan", "train override augmentation.scale[0] must be a finite number, got nan; give "
                                      "a number such as 0.5."),
    ("augmentation.gamma", "0.7,inf", "train override augmentation.gamma[1] must be a finite number, got inf; give "
                                      "a number such as 0.5."),
    ("augmentation.blur_probability", "nan", "train override augmentation.blur_probability must be a finite number, "
                                             "got 'nan'; give a number such as 0.5."),
    ("momentum", "-inf", "train override momentum must be a finite number, got '-inf'; give a number such as 0.5."),
    ("model.num_levels", "nan", "train override model.num_levels must be a whole number, got 'nan'."),
    ("steps", "inf", "train override steps must be a whole number, got 'inf'."),
])
def test_a_setting_that_is_not_a_finite_number_is_one_sentence(key, value, sentence):
    with pytest.raises(ValueError) as refused:
        config_resolution.resolve(preset="smoke", overrides={key: value})
    assert str(refused.value) == sentence


def test_an_augmentation_range_of_nan_is_refused_from_python_too():
    with pytest.raises(ValueError, match=r"^AugmentationConfig.scale must be a range LOW,HIGH of finite numbers with "
                                         r"0 <= LOW <= HIGH, got \[nan, nan\]\.$"):
        recipe.AugmentationConfig(scale=(math.nan, math.nan))
    with pytest.raises(ValueError, match=r"^AugmentationConfig.noise_sigma must be a range .* got \[0.0, inf\]\.$"):
        recipe.AugmentationConfig(noise_sigma=(0.0, math.inf))


@pytest.mark.parametrize("field, value, sentence", [
    ("learning_rate", math.nan, "TrainConfig.learning_rate must be a finite number > 0, got nan."),
    ("learning_rate", math.inf, "TrainConfig.learning_rate must be a finite number > 0, got inf."),
    ("weight_decay", math.nan, "TrainConfig.weight_decay must be a finite number >= 0, got nan."),
])
def test_the_config_itself_refuses_what_python_gives_it(field, value, sentence):
    with pytest.raises(ValueError) as refused:
        presets.smoke(**{field: value})
    assert str(refused.value) == sentence


@pytest.mark.parametrize("command, given, sentence", [
    ("train", ["--set", "learning_rate=nan"], "--set learning_rate=nan: learning_rate must be a finite number, got "
                                              "'nan'; give a number such as 0.5."),
    ("train", ["--learning-rate", "nan"], "--learning-rate nan: learning_rate must be a finite number, got nan; give a "
                                          "number such as 0.5."),
    ("train", ["--set", "augmentation.scale=nan,nan"], "--set augmentation.scale=nan,nan: augmentation.scale[0] must "
                                                       "be a finite number, got nan; give a number such as 0.5."),
    ("train", ["--set", "steps=inf"], "--set steps=inf: steps must be a whole number, got 'inf'."),
    ("train", ["--set", "learning_rat=0.1"], "unknown setting --set learning_rat=0.1; valid ones: "),
    ("plan", ["--set", "weight_decay=inf"], "--set weight_decay=inf: weight_decay must be a finite number, got 'inf'; "
                                            "give a number such as 0.5."),
])
def test_the_sentence_names_the_option_as_typed_not_an_internal_name(command, given, sentence, demo_data, tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    where = (["--train", demo_data["train"], "--output", str(tmp_path / "run")] if command == "train" else
             ["--image-size", "16,16,16", "--partitions", "1"])
    result = CliRunner().invoke(cli.app, [command, "--preset", "smoke", *where, *given])
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output
    assert result.stderr.startswith(f"fullres: error: {sentence}"), result.stderr
    assert "train override" not in result.stderr
    assert not (tmp_path / "run").exists()
