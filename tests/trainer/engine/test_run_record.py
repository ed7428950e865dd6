"""A rerun into a run's folder keeps to what the run means (`engine.run_record`): other data, patches, augmentation
or fewer steps are refused in one sentence before anything is written; `continue_with_changes` goes on and the
run's history records the change."""

import dataclasses
import json

import pytest

from preprocessing.records import data_set
from preprocessing.ct import demo_ct
from trainer import config as config_lib, evaluate, train
from trainer import presets
from trainer.engine import program, run_data, run_record
from tests.files import snapshot


@pytest.fixture
def short_run(segmentation_run):
    """The session's run (tests/conftest.py: 40 steps of the smoke preset): read-only, as a refused rerun leaves it."""
    config, _, lines = segmentation_run
    return config, lines


@pytest.fixture(scope="module")
def coarse_data(tmp_path_factory):
    """The demo records again, preprocessed at 3 mm (the session's are at 1.5 x 1.5 x 2.5 mm)."""
    return demo_ct.write_demo_tfrecords(str(tmp_path_factory.mktemp("coarse")), num_train=2, num_eval=2,
                                        shape=(16, 16, 16), seed=1, spacing=(3.0, 3.0, 3.0))


def _refused(config, **changes) -> str:
    before = snapshot(config.output_dir)
    with pytest.raises(run_record.RunChanged) as refused:
        train.train(dataclasses.replace(config, **changes), log=lambda line: None, export_saved_model=False)
    assert snapshot(config.output_dir) == before  # nothing written, not even the history
    return str(refused.value)


@pytest.mark.slow
def test_a_rerun_on_data_preprocessed_at_another_spacing_is_refused(short_run, coarse_data):
    config, _ = short_run
    sentence = _refused(config, train_data=coarse_data["train"], eval_data=None)
    assert sentence.startswith(f"--output {config.output_dir} was trained with training data spacing [1.5, 1.5, 2.5] "
                               "but this rerun has [3.0, 3.0, 3.0] (--train ")
    assert sentence.endswith("leave out or pass the run's own training data (--train), train into a new --output, or pass "
                             "--continue-with-changes to go on from step 40 under the new setting (the run's "
                             "run_record.json then records the change).")


@pytest.mark.slow
def test_a_rerun_with_patches_or_another_augmentation_is_refused(short_run):
    config, _ = short_run
    sentence = _refused(config, patch_size=(8, 8, 8))
    assert sentence.startswith(f"--output {config.output_dir} was trained with patch_size none but this rerun has "
                               "[8, 8, 8] (--patch-size); a rerun only resumes the run as it was, so leave out or pass the run's own "
                               "setting (--patch-size), train into a new --output, or pass --continue-with-changes")
    from trainer.augment import recipe

    sentence = _refused(config, augmentation=recipe.preset("nnunet"))
    assert sentence.startswith(f"--output {config.output_dir} was trained with augmentation \"flips\" but this rerun "
                               "has \"nnunet\" (--augmentation); ")


@pytest.mark.slow
def test_fewer_steps_than_done_is_refused_as_nothing_to_train(short_run):
    config, _ = short_run
    assert _refused(config, steps=30) == (
        f"nothing to train: the run in {config.output_dir} is at step 40 of the 30 that --steps 30 asks for; pass "
        "--steps 40 or more to go on training it, or a new --output to train 30 steps from the start.")


@pytest.mark.slow
def test_more_steps_resume_and_a_change_of_meaning_is_recorded_when_asked(short_run, tmp_path):
    import shutil

    config, _ = short_run
    copy = tmp_path / "run"
    shutil.copytree(config.output_dir, copy)
    from trainer.augment import recipe

    changed = dataclasses.replace(config, output_dir=str(copy), eval_data=None, steps=42, log_every=2,
                                  augmentation=recipe.preset("intensity"))
    lines = []
    results = train.train(changed, log=lines.append, export_saved_model=False, continue_with_changes=True)
    assert results["resumed_from_step"] == 40 and results["steps"] == 42
    assert "continuing the run from step 40 with changed settings (--continue-with-changes): augmentation \"flips\" " \
           "-> \"intensity\"" in lines
    assert "resuming with 42 steps in all (was 40; the learning-rate schedule is stretched to the new end), " \
           f"--log-every 2 (was {config.log_every}), --eval none (was \"{config.eval_data}\")" in lines
    history = json.loads((copy / "run_record.json").read_text())["history"]
    assert [line["event"] for line in history] == ["started", "continued with changes"]
    assert history[1]["step"] == 40 and history[1]["changed"] == {"augmentation": ["flips", "intensity"]}
    assert history[0]["fingerprint"]["preprocessing"]["spacing"] == [1.5, 1.5, 2.5]
    assert json.loads((copy / "train_config.json").read_text())["steps"] == 42


def test_eval_data_preprocessed_otherwise_than_the_training_data_are_refused_before_a_run_starts(demo_data, coarse_data,
                                                                                               tmp_path):
    output = tmp_path / "run"
    config = presets.smoke(train_data=demo_data["train"], eval_data=coarse_data["eval"], output_dir=str(output))
    with pytest.raises(ValueError) as refused:
        train.train(config, log=lambda line: None)
    assert str(refused.value) == (
        f"--eval {coarse_data['eval']} holds data preprocessed with spacing [3.0, 3.0, 3.0] but the model trains on "
        f"spacing [1.5, 1.5, 2.5] (--train {demo_data['train']}), so its scores would not be the model's; convert the "
        "held-out scans as the training data were (fullres preprocess ct with the same settings), or pass "
        "--eval-across-preprocessings to score them anyway (the scores then say so).")
    assert not output.exists()


@pytest.mark.slow  # evaluates the session's run
def test_evaluating_a_run_on_data_preprocessed_otherwise_is_refused_or_said(segmentation_run, coarse_data, tmp_path):
    import html

    config, _, _ = segmentation_run
    with pytest.raises(ValueError, match=r"^--eval .* holds data preprocessed with spacing \[3.0, 3.0, 3.0\] but the "
                                         r"model trains on spacing \[1.5, 1.5, 2.5\] \(.*/run_record.json\), so"):
        evaluate.evaluate_trained(config.output_dir, coarse_data["eval"], log=lambda line: None)
    lines = []
    scores = evaluate.evaluate_trained(config.output_dir, coarse_data["eval"], log=lines.append,
                                       across_preprocessings=True, report_path=str(tmp_path / "report.html"))
    note = (f"scored across preprocessings: --eval {coarse_data['eval']} has spacing [3.0, 3.0, 3.0], the training "
            "data [1.5, 1.5, 2.5]")
    assert scores["across_preprocessings"] == note and f"warning: {note}" in lines and scores["cases"] == 2
    page = (tmp_path / "report.html").read_text()  # under the title (how it shows: tests/trainer/tasks/test_report.py)
    assert f'<p class="note" id="across-preprocessings" role="note"><strong>Warning:</strong> {html.escape(note)};' in page


def _recorded(run, config):
    from trainer import trained_run

    return trained_run.Record(str(run), config_lib.to_dict(config), {}, [])


def test_another_network_file_or_partition_is_refused_by_what_the_run_records(demo_data, tmp_path):
    """Judged on the record alone (no training): the network file's hash against the run's copy, and the split."""
    import dataclasses as dc

    from trainer.models import user_model
    from trainer.parallel import partitioning

    run = tmp_path / "run"
    run.mkdir()
    (run / "model_source.py").write_text("def build(num_classes, in_channels):\n    return 1\n")
    mine = tmp_path / "net.py"
    mine.write_text("def build(num_classes, in_channels):\n    return 2\n")
    config = presets.smoke(train_data=demo_data["train"], output_dir=str(run),
                              model=user_model.UserModelConfig(str(mine), "build"))
    with pytest.raises(run_record.RunChanged) as refused:
        run_record.check_rerun(config, _recorded(run, config), 6, 8, program.warmup_steps_used(config, 6),
                               trained_on=data_set.fingerprint(config.train_data))
    copy, theirs = run_record.source_hash(str(run / "model_source.py")), run_record.source_hash(str(mine))
    assert str(refused.value).startswith(
        f"--output {run} was trained with model source \"sha256 {copy[:12]}\" but this rerun has \"sha256 "
        f"{theirs[:12]}\" ({mine}; the run's copy is {run}/model_source.py); a rerun only resumes the run as it was, so "
        "leave out or pass the run's own network file (--model), ")
    split = dc.replace(config, partition=partitioning.PartitionConfig((1, 2, 1, 1, 1)))
    (run / "model_source.py").write_text(mine.read_text())
    with pytest.raises(run_record.RunChanged, match=r"trained with partition.input_partition_dims \[1, 1, 1, 1, 1\] but "
                                                    r"this rerun has \[1, 2, 1, 1, 1\] \(--input-partition-dims\)"):
        run_record.check_rerun(split, _recorded(run, config), 6, 8, program.warmup_steps_used(split, 6),
                               trained_on=data_set.fingerprint(split.train_data))
    line = run_record.check_rerun(config, _recorded(run, config), 6, 8, program.warmup_steps_used(config, 6),
                                  trained_on=data_set.fingerprint(config.train_data))  # the same run: resumed, nothing changed
    assert line["event"] == "resumed" and "changed" not in line and line["model_source_sha256"] == theirs


def test_another_label_map_is_named_as_a_whole():
    # Two label maps that give ids 1 and 2 other names were told class by class ("label_map.cyst none but this
    # rerun has 2 (and label_map.kidney, label_map.liver, label_map.tumor differ too)"): each map is read whole.
    trained = {"preprocessing": {"spacing": [2.0, 2.0, 2.0]}, "label_map": {"background": 0, "liver": 1, "tumor": 2}}
    other = {"preprocessing": {"spacing": [2.0, 2.0, 2.0]}, "label_map": {"background": 0, "kidney": 1, "cyst": 2}}
    assert run_data.differences(trained, other) == [("label_map", trained["label_map"], other["label_map"])]
    assert run_data.differences(trained, {**other, "label_map": dict(trained["label_map"])}) == []
    assert run_data.differences(trained, {**other, "label_map": None}) == []  # records without a label map
