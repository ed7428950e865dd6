"""`fullres train` on video clips, through the CLI: a rerun on other videos with the same clip settings is
refused by the run's data fingerprint; held-out clips without masks, or held-out data of another kind, are refused
in one sentence that says what they are. Each refusal leaves the folders byte-identical."""

import json

import numpy as np
import pytest

from preprocessing.ct import ct_transforms, demo_ct
from preprocessing.records import tfrecord_files, tfrecord_schema
from tests import files
from tests.trainer.predict import video_runs

# The smoke preset's network (1 input channel) on clips (3): the records' channels are taken.
SMALL = ("--preset", "smoke", "--steps", "1", "--batch-size", "4", "--augmentation", "none", "--input-partition-dims",
         "1,2,1,1,1", "--no-saved-model")


def _train(*arguments) -> tuple[int, list[str], str]:
    """`fullres train` in this process (the 8 test devices): (exit code, error lines, everything said)."""
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["train", *arguments])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line.removeprefix("fullres: error: ") for line in result.stderr.splitlines()
              if line.startswith("fullres: error:")]
    return result.exit_code, errors, result.stdout + result.stderr


def _ct_data_set(folder) -> str:
    """Two labelled 8³ CT volumes as `fullres preprocess ct` writes them (without TensorFlow's writer)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    cases = [demo_ct.synthetic_case(rng, (8, 8, 8)) for _ in range(2)]
    tfrecord_files.write_records(str(folder / "data-00000-of-00001.tfrecord"), [
        tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
            case_id=f"case{index}", source_path=f"case{index}.nii.gz", label=label,
            image=np.clip((volume + 1000) / 2000, 0, 1).astype(np.float32))) for index, (volume, label) in enumerate(cases)])
    recorded = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(spacing=(1.5, 1.5, 2.5),
                                                                                   shape=(8, 8, 8), modality="ct"))
    (folder / "summary.json").write_text(json.dumps({"ok": 2, "failed": 0, "shards": ["data-00000-of-00001.tfrecord"],
                                                     "label_values": {"0": 2, "1": 2}, "preprocessing": recorded}))
    return str(folder)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The run folder's parent (clips/, run/) and what training said."""
    folder = tmp_path_factory.mktemp("video_train")
    clips = video_runs.write_clips(folder / "clips", ["cat", "dog"])
    code, errors, said = _train("--train", clips, "--output", str(folder / "run"), *SMALL)
    assert code == 0, said
    return folder, said


@pytest.fixture(scope="module")
def video_run(trained):
    return trained[0]


@pytest.mark.slow  # the module's trained run (about 30 s on 2 cores)
def test_clips_train_under_a_one_channel_preset_with_the_records_channels(trained):
    """Before: 3-channel clips under a 1-channel preset were refused ("pass --set model.in_channels=3"); now the
    records decide, and the log says so (a --set model.in_channels still decides, and is then checked)."""
    folder, said = trained
    assert (f"model.in_channels 3: taken from --train {folder / 'clips'}, which holds video clips (RGB frames), in "
            "place of the smoke preset's 1 (--set model.in_channels=N sets it)") in said
    recorded = json.loads((folder / "run" / "train_config.json").read_text())
    assert recorded["model"]["in_channels"] == 3
    code, errors, _ = _train("--train", str(folder / "clips"), "--output", str(folder / "other"), *SMALL,
                             "--set", "model.in_channels=1")
    assert code == 2 and errors[0].startswith(f"--train {folder / 'clips'} holds video clips of 3 channel(s) but the "
                                              "model takes 1"), errors
    assert not (folder / "other").exists()


@pytest.mark.slow  # trains a tiny video model one step (module fixture, about 30 s on 2 cores), then refuses
def test_a_rerun_on_other_videos_with_the_same_clip_settings_is_refused(video_run, tmp_path):
    """Before: the fingerprint held the clip settings alone, so clips of other videos resumed the run silently."""
    other = video_runs.write_clips(tmp_path / "other", ["bird", "fish"])
    before = files.snapshot(video_run)
    code, errors, said = _train("--train", other, "--output", str(video_run / "run"), *SMALL)
    assert code == 2 and len(errors) == 1, said
    assert errors[0].startswith(f"--output {video_run / 'run'} was trained with training data examples \"2 (cat@00000 "
                                f"... dog@00000, ids sha256 "), errors[0]
    assert f"(--train {other} holds other cases than the run trained on: its case ids differ)" in errors[0]
    assert "--continue-with-changes" in errors[0]
    assert files.snapshot(video_run) == before


@pytest.mark.slow  # uses the trained run above; refuses before training
def test_held_out_clips_without_masks_are_refused(video_run, tmp_path):
    """Before: `--eval` on clips of videos without masks printed Dice [0.251, 0, 0] as the held-out score."""
    unlabelled = video_runs.write_clips(tmp_path / "unlabelled", ["owl"], labelled=False)
    before = files.snapshot(tmp_path)
    code, errors, said = _train("--train", str(video_run / "clips"), "--eval", unlabelled,
                                "--output", str(tmp_path / "run"), *SMALL)
    assert code == 2 and errors == [
        f"--eval {unlabelled} holds no labelled pixels ({tmp_path / 'unlabelled' / 'summary.json'} lists no label "
        "value above 0: clips of videos without masks), so its Dice would score the model against background alone; "
        "convert the videos with their masks (fullres preprocess video with a PNG folder named like each video, "
        "Annotations/ or --labels) to score the "
        "model on them, or segment them with fullres predict."], said
    assert files.snapshot(tmp_path) == before


@pytest.mark.slow  # uses the trained run above; refuses before training
def test_a_resume_on_clips_of_another_length_names_the_clip_length(video_run, tmp_path):
    """Before: a resume on clips of 4 frames was told to "use depth 8" (the partition check's words for CT)."""
    short = video_runs.write_clips(tmp_path / "short", ["cat", "dog"], clip=(4, 16, 16))
    before = files.snapshot(video_run)
    code, errors, said = _train("--train", short, "--output", str(video_run / "run"), *SMALL)
    assert code == 2 and len(errors) == 1, said
    assert "depth" not in errors[0], errors[0]
    assert "clip_length 8 but this rerun has 4" in errors[0], errors[0]
    assert files.snapshot(video_run) == before


@pytest.mark.slow  # uses the trained run above; refuses before training
def test_held_out_ct_volumes_for_a_video_model_are_called_another_kind(video_run, tmp_path):
    """Before: video --train with CT --eval advised `--set model.in_channels=1`, which would break the training."""
    ct = _ct_data_set(tmp_path / "ct")
    before = files.snapshot(tmp_path)
    code, errors, said = _train("--train", str(video_run / "clips"), "--eval", ct, "--output", str(tmp_path / "run"),
                                *SMALL)
    assert code == 2 and errors == [
        f"--eval {ct} holds CT volumes (1 channel(s)), another kind of data than the model's training data (video "
        "clips, 3 channel(s)); pass held-out video clips converted as the training data were."], said
    assert files.snapshot(tmp_path) == before


@pytest.mark.slow  # uses the trained run above; refuses before training
def test_held_out_clips_cut_otherwise_are_told_the_video_conversion(video_run, tmp_path):
    """Before: held-out clips of 4 frames for a model trained on 8 were told to re-run `fullres preprocess ct`."""
    short = video_runs.write_clips(tmp_path / "short", ["owl"], clip=(4, 16, 16))
    code, errors, said = _train("--train", str(video_run / "clips"), "--eval", short, "--output", str(tmp_path / "run"),
                                *SMALL)
    assert code == 2 and len(errors) == 1, said
    assert errors[0].startswith(f"--eval {short} holds data preprocessed with clip_length 4 but the model trains on "
                                "clip_length 8"), errors[0]
    assert ("convert the held-out videos as the training clips were (fullres preprocess video --clip-length 8 "
            "--clip-stride 8 --size 16,16 --fit crop)") in errors[0] and "preprocess ct" not in errors[0]
    assert not (tmp_path / "run").exists()


def test_unlabelled_clips_are_told_to_convert_the_videos_with_their_masks(tmp_path):
    """Before: clips of videos without masks were told to "convert the scans again with --labels naming their label
    maps", the CT conversion's words."""
    unlabelled = video_runs.write_clips(tmp_path / "unlabelled", ["owl", "cat"], labelled=False)
    before = files.snapshot(tmp_path)
    code, errors, said = _train("--train", unlabelled, "--output", str(tmp_path / "run"), *SMALL)
    assert code == 2 and errors == [
        f"--train {unlabelled} holds no labelled pixels ({tmp_path / 'unlabelled' / 'summary.json'} lists no label "
        "values: clips of videos without masks), so the model would learn to predict background everywhere; convert "
        "the videos with their masks (fullres preprocess video with a PNG folder named like each video, "
        "Annotations/ or --labels)."], said
    assert files.snapshot(tmp_path) == before


def test_a_fresh_run_whose_clip_length_does_not_fit_the_split_names_the_clip_length(tmp_path):
    """Before: clips of 4 frames split 2 ways in time (a network that halves them twice) were told to "use depth 8 or
    more, or do not split depth": the partition check's words for CT."""
    short = video_runs.write_clips(tmp_path / "short", ["cat", "dog"], clip=(4, 16, 16))
    before = files.snapshot(tmp_path)
    code, errors, said = _train("--train", short, "--output", str(tmp_path / "run"), *SMALL)
    assert code == 2 and errors == [
        "clip length 4 (input_partition_dims[1] = 2) is 2 frames at resolution level 2, 1 on each of its 2 devices, "
        "where XLA gathers whole activations and can compute wrong gradients; use clips of 8 or more frames (fullres "
        "preprocess video --clip-length 8), or do not split the clip length."], said
    assert files.snapshot(tmp_path) == before

