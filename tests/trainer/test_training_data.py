"""How `fullres train` names its data, and what it refuses before it writes its run folder.

A data set is a folder a conversion wrote: its records, `summary.json` (written
last) and, for named classes, `label_map.json`. `--train` and `--eval` take
the folder or a pattern of records, whose folder part may hold wildcards
(`out/*/data-*`). The data sets here are written as `fullres preprocess ct`
writes them (synthetic cases, the same record encoder, a summary with the same
fields), a few 8³ volumes each, so every refusal costs well under a second.
"""

import json
import os

import numpy as np
import pytest

from preprocessing.ct import ct_transforms, demo_ct
from preprocessing.images import demo_images
from preprocessing.records import data_set, dataset_files, tfrecord_schema

SHAPE = (8, 8, 8)
SHARD = "data-00000-of-00001.tfrecord"


def _ct_data_set(folder, shapes=(SHAPE, SHAPE), labelled=True, spacing=(1.5, 1.5, 2.5), shape=SHAPE,
                 label_values=None, preprocessing=True, label_map=None, summary=True):
    """A CT data set as `fullres preprocess ct` leaves it: one shard, then summary.json (and label_map.json)."""
    import tensorflow as tf

    os.makedirs(folder)
    rng = np.random.default_rng(len(str(folder)))
    found = {}
    with tf.io.TFRecordWriter(os.path.join(folder, SHARD)) as writer:
        for index, case_shape in enumerate(shapes):
            volume, label = demo_ct.synthetic_case(rng, case_shape)
            if not labelled:  # what a conversion without --labels stores: an empty label map
                label = np.zeros_like(label)
            for value in (np.unique(label) if labelled else ()):
                found[str(value)] = found.get(str(value), 0) + 1
            writer.write(tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
                case_id=f"case{index:03d}", source_path=f"images/case{index:03d}.nii.gz",
                image=np.clip((volume + 1000) / 2000, 0, 1).astype(np.float32), label=label)))
    if label_map is not None:
        dataset_files.write_label_map(str(folder), label_map)
    if summary:
        recorded = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(
            spacing=spacing, shape=shape, modality="ct"))
        content = {"ok": len(shapes), "failed": 0, "reasons": {}, "shards": [SHARD], "modality": "ct"}
        if label_values is not None or found:
            content["label_values"] = label_values if label_values is not None else found
        if preprocessing:
            content["preprocessing"] = recorded
        (folder / "summary.json").write_text(json.dumps(content))
    return str(folder / "data-*")


def _train(tmp_path, train, *args):
    """`fullres train` in this process (the 8 test devices); returns (exit code, error lines, run folder)."""
    from typer.testing import CliRunner

    from pipelines import cli

    run = tmp_path / "run"
    result = CliRunner().invoke(cli.app, ["train", "--train", train, "--output", str(run), "--preset", "smoke",
                                          "--steps", "1", "--batch-size", "8", *args])
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, errors, run


def _refused(tmp_path, train, *args) -> str:
    """The one sentence `fullres train` refuses with; the run folder must not have been made."""
    code, errors, run = _train(tmp_path, train, *args)
    assert code == 2 and len(errors) == 1, errors
    assert not run.exists(), "refused after the run folder was made"
    return errors[0].removeprefix("fullres: error: ")


# ------------------------------------------------------------------------------------------------------------------
# One way to name a data set.


@pytest.mark.parametrize("pattern", ["out/ts4[1]/data-*", "out/*/data-*"])
def test_a_wildcard_in_the_folder_part_finds_the_summary_and_its_label_check(tmp_path, pattern):
    _ct_data_set(tmp_path / "out" / "ts41", label_values={"0": 2, "1": 2, "117": 1})
    train = str(tmp_path / pattern)
    assert _refused(tmp_path, train, "--num-classes", "2") == (
        f"--num-classes 2 is too small for {train}: its summary.json lists label values 0, 1, 117; pass "
        "--num-classes 118 or more.")


@pytest.mark.parametrize("pattern", ["out/ts4[1]/data-*", "out/*/data-*", "out/ts41"])
def test_the_model_records_the_preprocessing_found_through_any_name_of_the_data_set(tmp_path, pattern):
    from trainer import presets
    from trainer.tasks import registry

    _ct_data_set(tmp_path / "out" / "ts41", spacing=(0.8, 0.8, 2.5))
    task = registry.make_task(presets.smoke(train_data=str(tmp_path / pattern), output_dir=str(tmp_path / "run")))
    assert task.preprocessing()["spacing"] == [0.8, 0.8, 2.5]  # what model_info.json records for predict


def test_a_data_set_that_records_no_preprocessing_is_refused(tmp_path):
    train = _ct_data_set(tmp_path / "old", preprocessing=False)  # a conversion from before summaries recorded it
    assert _refused(tmp_path, train) == (
        f"--train {train}: {tmp_path / 'old' / 'summary.json'} records no preprocessing (spacing, orientation, "
        "window), so fullres predict could not prepare new scans as these were; convert the scans again with "
        "fullres preprocess ct.")


@pytest.mark.parametrize("other, what, mine, theirs", [
    (dict(spacing=(1.0, 1.0, 1.0)), "preprocessing (spacing)", "spacing [1.5, 1.5, 2.5]", "spacing [1.0, 1.0, 1.0]"),
    (dict(shape=(8, 8, 16), shapes=[(8, 8, 16)]), "preprocessing (shape)", "shape [8, 8, 8]", "shape [8, 8, 16]"),
    (dict(label_map={"background": 0, "kidney": 1, "liver": 2}), "label_map.json",
     '{"background": 0, "liver": 1, "kidney": 2}', '{"background": 0, "kidney": 1, "liver": 2}'),
])
def test_a_pattern_spanning_data_sets_that_differ_is_refused_naming_both(tmp_path, other, what, mine, theirs):
    _ct_data_set(tmp_path / "out" / "ts41", label_map={"background": 0, "liver": 1, "kidney": 2})
    _ct_data_set(tmp_path / "out" / "ts42", **{"label_map": {"background": 0, "liver": 1, "kidney": 2}, **other})
    train = str(tmp_path / "out" / "*" / "data-*")
    assert _refused(tmp_path, train) == (
        f"--train {train} spans data sets that differ in {what}: {tmp_path / 'out' / 'ts41'} has {mine} but "
        f"{tmp_path / 'out' / 'ts42'} has {theirs}; train on data sets converted with the same settings, or narrow "
        "the pattern to one of them.")


def test_data_sets_that_agree_train_together(tmp_path):
    from trainer.data import ct_input

    _ct_data_set(tmp_path / "out" / "ts41")
    _ct_data_set(tmp_path / "out" / "ts42", shapes=[SHAPE, SHAPE, SHAPE])
    data = data_set.resolve(str(tmp_path / "out" / "*" / "data-*"))
    assert data.folders == (str(tmp_path / "out" / "ts41"), str(tmp_path / "out" / "ts42"))
    assert ct_input.count_examples(str(tmp_path / "out" / "*" / "data-*")) == 5


def test_several_data_sets_separated_by_commas_train_together(tmp_path):
    from trainer.data import ct_input

    _ct_data_set(tmp_path / "out" / "ts41")
    _ct_data_set(tmp_path / "out" / "ts42", shapes=[SHAPE, SHAPE, SHAPE])
    several = f"{tmp_path / 'out' / 'ts42'},{tmp_path / 'out' / 'ts41' / 'data-*'}"  # a folder and a pattern
    data = data_set.resolve(several)
    assert data.folders == (str(tmp_path / "out" / "ts42"), str(tmp_path / "out" / "ts41"))
    assert ct_input.count_examples(several) == 5
    assert dataset_files.folders(several) == [str(tmp_path / "out" / "ts42"), str(tmp_path / "out" / "ts41")]


def test_several_data_sets_that_differ_are_refused_naming_both(tmp_path):
    first = _ct_data_set(tmp_path / "a", spacing=[1.5, 1.5, 2.5])
    second = _ct_data_set(tmp_path / "b", spacing=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=rf"spans data sets that differ in preprocessing \(spacing\): "
                                         rf"{tmp_path / 'a'} has spacing \[1.5, 1.5, 2.5\] but {tmp_path / 'b'} "):
        data_set.resolve(f"{first},{second}")


def test_a_pattern_that_matches_nothing_names_the_pattern(tmp_path):
    train = str(tmp_path / "out" / "ts4" / "data-*")
    assert _refused(tmp_path, train) == (
        f"no TFRecord files match --train {train!r}; pass a data set folder (the --output of fullres preprocess) or "
        "a pattern of its records, e.g. 'data/ct/data-*'.")


def test_records_without_a_summary_are_refused_naming_what_was_matched(tmp_path):
    folder = tmp_path / "half"  # a conversion that never finished: records, no summary.json
    train = _ct_data_set(folder, summary=False)
    assert _refused(tmp_path, train) == (
        f"--train {train} matches 1 file(s) in {folder} ({SHARD}), but {folder} has no summary.json, which a "
        "finished fullres conversion writes last; pass the --output folder of fullres preprocess ct or images, or "
        "convert the data again.")


def test_a_pattern_that_matches_more_than_records_is_refused(tmp_path):
    _ct_data_set(tmp_path / "ts41")
    train = str(tmp_path / "ts41" / "*")  # summary.json and data-*: the folder alone would have been right
    assert _refused(tmp_path, train) == (
        f"--train {train} matches summary.json in {tmp_path / 'ts41'}, which is not one of the records its "
        f"summary.json lists ({SHARD}); pass the folder {tmp_path / 'ts41'} itself, or narrow the pattern to its "
        f"records, e.g. {str(tmp_path / 'ts41' / 'data-*')!r}.")


def test_a_folder_given_as_train_means_the_data_set_s_records(tmp_path):
    from trainer.data import ct_input
    from trainer import presets
    from trainer.tasks import registry

    _ct_data_set(tmp_path / "ts41", shapes=[SHAPE, SHAPE, SHAPE])
    folder = str(tmp_path / "ts41")
    assert ct_input.count_examples(folder) == 3
    task = registry.make_task(presets.smoke(train_data=folder, output_dir=str(tmp_path / "run")))
    task.check_data(folder, "--train", training=True)
    assert task.example_shape() == (*SHAPE, 1)


# ------------------------------------------------------------------------------------------------------------------
# Training refuses what it cannot use, before it writes its run folder.


@pytest.mark.parametrize("label_values, listed", [(None, "no label values"), ({"0": 2}, "label values 0 only")])
def test_unlabelled_records_are_refused(tmp_path, label_values, listed):
    train = _ct_data_set(tmp_path / "ts41", labelled=False, label_values=label_values)
    assert _refused(tmp_path, train) == (
        f"--train {train} holds no labelled voxels ({tmp_path / 'ts41' / 'summary.json'} lists {listed}: an "
        "unlabelled conversion), so the model would learn to predict background everywhere; convert the scans again "
        "with --labels naming their label maps.")


def test_records_of_mixed_shapes_are_refused_with_the_shape_flag(tmp_path):
    # What `fullres preprocess ct` writes without --shape: each case keeps its own size.
    train = _ct_data_set(tmp_path / "ts41", shapes=[SHAPE, (8, 12, 8), SHAPE], shape=None)
    assert _refused(tmp_path, train) == (
        f"--train {train} holds volumes of different shapes (8x8x8 and 8x12x8, D x H x W), which cannot be batched "
        "for one partitioned step; preprocess with --shape D,H,W (for example --shape 8,12,8) so that every volume "
        "has one shape.")


def test_evaluation_records_of_mixed_shapes_are_refused_before_training(tmp_path):
    train = _ct_data_set(tmp_path / "train")
    held_out = _ct_data_set(tmp_path / "eval", shapes=[SHAPE, (8, 12, 8)], shape=None)
    assert _refused(tmp_path, train, "--eval", held_out).startswith(
        f"--eval {held_out} holds volumes of different shapes (8x8x8 and 8x12x8, D x H x W)")


def test_detection_records_are_refused_for_segmentation(tmp_path):
    shapes = demo_images.write_demo_tfrecords(str(tmp_path / "shapes"), num_train=1, num_eval=1, size=(64, 64))
    assert _refused(tmp_path, shapes["train"]) == (
        f"--train {shapes['train']} holds images with boxes (fullres preprocess images), not CT volumes; train them "
        "with --task detection, or pass the records of fullres preprocess ct.")


def test_records_of_an_earlier_fullres_are_refused_with_the_command_that_converts_them_again(tmp_path):
    """Records written before the depth slabs (a whole float32 volume in image/encoded): one sentence, the fix."""
    from preprocessing.records import example_proto, tfrecord_files

    train = _ct_data_set(tmp_path / "ts41")
    volume = np.zeros(SHAPE, np.float32)
    old = example_proto.serialize_example({  # the keys fullres wrote until 2026-11-25
        "case_id": example_proto.BytesValues(b"case000"), "image/encoded": example_proto.BytesValues(volume.tobytes()),
        "image/shape": example_proto.IntValues(SHAPE), "label/encoded": example_proto.BytesValues(bytes(volume.size))})
    tfrecord_files.write_records(str(tmp_path / "ts41" / SHARD), [old])
    assert _refused(tmp_path, train) == (
        f"--train {train} holds CT records of an earlier fullres (whole float32 volumes), which this one does not "
        "read (it reads int16 depth slabs, a process only those its devices hold); convert the scans again with "
        "fullres preprocess ct.")


def test_ct_records_are_refused_for_detection(tmp_path):
    train = _ct_data_set(tmp_path / "ts41")
    assert _refused(tmp_path, train, "--task", "detection", "--preset", "detection_demo") == (
        f"--train {train} holds CT volumes (fullres preprocess ct), not images with boxes; train them with --task "
        "segmentation, or pass the records of fullres preprocess images.")


def test_a_file_that_is_no_tfrecord_is_refused(tmp_path):
    train = _ct_data_set(tmp_path / "ts41")
    (tmp_path / "ts41" / SHARD).write_text("case,label\n" * 40)  # a CSV where the records were
    assert _refused(tmp_path, train) == (
        f"{tmp_path / 'ts41' / SHARD} is not a TFRecord file; name only the records a fullres conversion wrote (its "
        "data-* files).")


# ------------------------------------------------------------------------------------------------------------------
# The same refusals on data sets `fullres preprocess ct` itself wrote (Beam, in this process), from NIfTI scans
# whose spacing differs from case to case as real scans' does.


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    return demo_ct.write_demo_cases(str(tmp_path_factory.mktemp("scans")), num_cases=3, shape=(16, 20, 20),
                                    formats=("nifti",), seed=4)["nifti"]


def _preprocess(scans, output, labels: bool, shape=None):
    from preprocessing.beam import ct_pipeline, local_workers

    in_process = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
    ct_pipeline.run(os.path.join(scans, "images"), str(output), labels=os.path.join(scans, "labels") if labels else None,
                    config=ct_transforms.CtPreprocessConfig(spacing=(2.0, 2.0, 4.0), shape=shape),
                    pipeline_args=in_process, log=lambda line: None)
    return str(output)


@pytest.mark.slow
def test_a_conversion_without_shape_is_refused_with_the_shape_flag(scans, tmp_path):
    folder = _preprocess(scans, tmp_path / "ts41", labels=True)  # each case keeps its own resampled size
    message = _refused(tmp_path, folder)
    assert message.startswith(f"--train {folder} holds volumes of different shapes (") and (
        "preprocess with --shape D,H,W (for example --shape ") in message


@pytest.mark.slow
def test_a_conversion_without_labels_is_refused(scans, tmp_path):
    folder = _preprocess(scans, tmp_path / "ts41", labels=False, shape=(8, 8, 8))
    assert _refused(tmp_path, folder) == (
        f"--train {folder} holds no labelled voxels ({os.path.join(folder, 'summary.json')} lists no label values: "
        "an unlabelled conversion), so the model would learn to predict background everywhere; convert the scans "
        "again with --labels naming their label maps.")


@pytest.mark.slow
def test_a_conversion_s_folder_trains_and_its_model_records_the_preprocessing(scans, tmp_path):
    folder = _preprocess(scans, tmp_path / "ts41", labels=True, shape=(8, 8, 8))
    code, errors, run = _train(tmp_path, folder, "--input-partition-dims", "1,2,1,1,1", "--batch-size", "4")
    assert code == 0, errors
    info = json.loads((run / "model_info.json").read_text())
    assert info["preprocessing"] == json.loads((tmp_path / "ts41" / "summary.json").read_text())["preprocessing"]
    assert info["preprocessing"]["spacing"] == [2.0, 2.0, 4.0] and info["preprocessing"]["shape"] == [8, 8, 8]


@pytest.mark.slow
def test_evaluation_refuses_the_other_task_s_records_in_one_sentence(segmentation_run, tmp_path):
    from trainer import evaluate

    config, _, _ = segmentation_run
    shapes = demo_images.write_demo_tfrecords(str(tmp_path / "shapes"), num_train=1, num_eval=1, size=(64, 64))
    with pytest.raises(ValueError) as refused:
        evaluate.evaluate_trained(config.output_dir, shapes["eval"], report_path=str(tmp_path / "report.html"))
    assert str(refused.value) == (
        f"--eval {shapes['eval']} holds images with boxes (fullres preprocess images), not CT volumes; train them "
        "with --task detection, or pass the records of fullres preprocess ct.")
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("summary, words", [
    (None, "is a folder without records or summary.json; pass the --output folder of fullres preprocess"),
    ({"ok": 0, "failed": 3, "shards": []}, "holds no records (its summary.json lists no shards: every case failed)"),
])
def test_a_folder_without_records_is_refused_in_one_sentence(tmp_path, summary, words):
    (tmp_path / "empty").mkdir()
    if summary is not None:
        (tmp_path / "empty" / "summary.json").write_text(json.dumps(summary))
    assert _refused(tmp_path, str(tmp_path / "empty")) == f"--train {tmp_path / 'empty'} {words}" + (
        " (or a pattern of its data-* records)." if summary is None else "; see its dead_letter.jsonl, and convert "
        "the data again.")


@pytest.mark.parametrize("name", ["folder", "pattern"])
def test_a_data_set_missing_a_shard_its_summary_lists_is_refused(tmp_path, name):
    import shutil

    _ct_data_set(tmp_path / "ts41")
    summary = json.loads((tmp_path / "ts41" / "summary.json").read_text())
    second = "data-00001-of-00002.tfrecord"  # a two-shard conversion whose copy stopped after the first shard
    shutil.move(tmp_path / "ts41" / SHARD, tmp_path / "ts41" / "data-00000-of-00002.tfrecord")
    summary["shards"] = ["data-00000-of-00002.tfrecord", second]
    (tmp_path / "ts41" / "summary.json").write_text(json.dumps(summary))
    train = str(tmp_path / "ts41") if name == "folder" else str(tmp_path / "ts41" / "data-*")
    assert _refused(tmp_path, train) == (
        f"--train {train}: {tmp_path / 'ts41' / 'summary.json'} lists {second}, which {tmp_path / 'ts41'} lacks; copy "
        "the data set whole (every shard its summary lists), or convert it again.")
