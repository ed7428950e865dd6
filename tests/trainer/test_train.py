"""Training runs end to end: outputs, export, learning, and resume after a crash.

Most tests here judge the session's tiny segmentation run (`segmentation_run` in
tests/conftest.py: the smoke preset, 40 steps, split 4-way along depth), which
the predict tests use as well; it is trained once per test session.
"""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from trainer import run_setup, train, train_loop

from trainer import presets
from trainer.engine import checkpoints
from trainer.parallel import partitioning
from tests.files import snapshot

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_partitioned_training_writes_every_output(segmentation_run):
    config, results, lines = segmentation_run
    output = config.output_dir
    assert results["mesh"] == {"axes": ["replica", "depth"], "shape": [2, 4]}
    assert checkpoints.list_steps(os.path.join(output, "checkpoints")) == [20, 30, 40]  # keep_checkpoints=3
    with open(os.path.join(output, "metrics.json")) as file:
        saved = json.load(file)
    assert saved["steps"] == 40 and len(saved["dice_per_class"]) == 3 and saved["cases"] == 2
    with open(os.path.join(output, "model_info.json")) as file:
        info = json.load(file)
    with open(os.path.join(os.path.dirname(config.train_data), "summary.json")) as file:
        recorded = json.load(file)["preprocessing"]  # the demo records' summary.json, as a conversion writes it
    assert info["preprocessing"] == recorded and recorded["spacing"] == [1.5, 1.5, 2.5]  # never null
    assert [s for s, _ in saved["loss_history"]] == list(range(5, 41, 5))
    events = os.listdir(os.path.join(output, "tensorboard"))
    assert any(name.startswith("events.out.tfevents") for name in events)
    assert any("step 40/40" in line for line in lines)


@pytest.mark.slow
def test_every_logging_window_records_its_input_wait(segmentation_run):
    """The log line, history.jsonl, TensorBoard and metrics.json say how much of the time went to waiting for input."""
    config, results, lines = segmentation_run
    with open(os.path.join(config.output_dir, "history.jsonl")) as file:
        history = [json.loads(line) for line in file]
    assert len(history) == 8 and all(0.0 <= entry["input_wait"] <= 1.0 for entry in history)
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 8 and all(re.search(r"  input wait \d+%$", line) for line in steps), steps
    # The decoded cache holds 6 tiny volumes: the steps never wait for them.
    assert results["input_bound"] is False and 0.0 <= results["input_wait_fraction"] < train_loop.INPUT_BOUND
    assert results["input_cache"].startswith("on: this process's share of the data set")
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(os.path.join(config.output_dir, "tensorboard")).Reload()
    assert [event.step for event in events.Tensors("input_wait_fraction")] == list(range(5, 41, 5))


@pytest.mark.slow
def test_a_run_whose_reader_is_slow_says_it_is_input_bound(demo_data, tmp_path, monkeypatch):
    """The test hook: every read of a record takes 1.5 s more (4 reads a step on the 2 threads of 2 cores), without
    the cache; the accelerators then wait for input most of the time, and the run says so where users look. (0.5 s
    was not enough on a loaded machine: slower steps hid the reads of the two steps filled during the compile.)"""
    from trainer.data import ct_input

    read = ct_input.CtRecords.read

    def slow_read(self, *arguments):
        time.sleep(1.5)
        return read(self, *arguments)

    monkeypatch.setattr(ct_input.CtRecords, "read", slow_read)
    config = presets.smoke(train_data=demo_data["train"], output_dir=str(tmp_path / "run"), steps=6, batch_size=4,
                              input_cache="off", checkpoint_every=100, log_every=2,
                              partition=partitioning.PartitionConfig((1, 2, 1, 1, 1)))
    lines = []
    results = train.train(config, log=lines.append, export_saved_model=False)  # the input is judged, not the export
    assert results["input_bound"] is True and results["input_wait_fraction"] >= train_loop.INPUT_BOUND, results
    assert results["input_cache"] == "off (--input-cache off): records are read every step"
    bound = [line for line in lines if line.startswith("step ") and "input-bound" in line]
    assert bound and bound[-1].startswith("step 6/6") and "the input cache (--input-cache on" in bound[-1], lines
    with open(tmp_path / "run" / "history.jsonl") as file:
        assert json.loads(file.readlines()[-1])["input_wait"] >= train_loop.INPUT_BOUND


@pytest.mark.slow
def test_training_lowers_the_loss(segmentation_run):
    _, results, _ = segmentation_run
    losses = [loss for _, loss in results["loss_history"]]
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.slow
def test_exported_models_predict_like_the_trained_one(segmentation_run, demo_data):
    import keras

    config, results, _ = segmentation_run
    images = next(iter(tf.data.TFRecordDataset(tf.io.gfile.glob(demo_data["eval"])).take(1)))
    from preprocessing.records import tfrecord_schema

    image = tfrecord_schema.parse_ct_example(images)["image"].numpy()[None]  # (1, D, H, W, 1)
    keras_model = keras.saving.load_model(results["model"]["keras"])
    keras_logits = np.asarray(keras_model(image, training=False))
    served = tf.saved_model.load(results["model"]["saved_model"])
    served_logits = served.serve(tf.constant(image)).numpy()
    assert keras_logits.shape == (1, 16, 16, 16, 3)
    np.testing.assert_allclose(served_logits, keras_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_evaluation_report_and_export_go_through_the_task(segmentation_run, demo_data, tmp_path):
    from trainer import evaluate, export

    config, _, _ = segmentation_run
    report_path = str(tmp_path / "report.html")
    scores = evaluate.evaluate_trained(config.output_dir, demo_data["eval"], report_path=report_path,
                                       class_names=["background", "liver", "tumour"], log=lambda line: None)
    assert scores["task"] == "segmentation" and scores["class_names"] == ["background", "liver", "tumour"]
    with open(report_path) as file:
        page = file.read()
    assert page.startswith("<!DOCTYPE html>") and "tumour" in page
    with pytest.raises(ValueError, match="2 class names given for a model of 3 classes"):
        evaluate.evaluate_trained(config.output_dir, demo_data["eval"], class_names=["background", "liver"])
    paths = export.export_trained(config.output_dir, str(tmp_path / "exported"))
    assert sorted(os.listdir(tmp_path / "exported")) == ["model.keras", "saved_model"]
    assert paths["saved_model"] == str(tmp_path / "exported" / "saved_model")


def _train_command(train_pattern, output, steps):
    return [
        sys.executable, "-m", "trainer", "train",
        "--train", train_pattern, "--output", str(output), "--preset", "smoke",
        "--steps", str(steps), "--checkpoint-every", "4", "--log-every", "1",
        "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1",
        "--augmentation", "nnunet",  # every augmentation, drawn per (seed, step, row) on the device
        "--no-saved-model",  # the weights are compared; the export has tests of its own
    ]


def _environment():
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    environment["PYTHONPATH"] = REPOSITORY
    return environment


@pytest.mark.slow
def test_resume_after_kill_ends_with_the_same_weights(demo_data, tmp_path):
    """Kill -9 a run just after its step-8 checkpoint; the restart resumes there and
    ends bit-for-bit where an uninterrupted run ends (checked at rtol 1e-6), with nnU-Net's whole augmentation
    set on the device (rotation, scaling, noise, blur, brightness, contrast, low resolution, gamma, mirroring).
    16 steps: 8 before the kill, 4-8 after the resume (40 spent 10 s more in each run, on nothing it checks)."""
    steps = 16
    uninterrupted = tmp_path / "uninterrupted"
    subprocess.run(_train_command(demo_data["train"], uninterrupted, steps), env=_environment(), check=True,
                   capture_output=True, cwd=REPOSITORY)

    crashed = tmp_path / "crashed"
    process = subprocess.Popen(_train_command(demo_data["train"], crashed, steps), env=_environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPOSITORY)
    checkpoint_dir = crashed / "checkpoints"
    deadline = time.monotonic() + 300
    while 8 not in checkpoints.list_steps(str(checkpoint_dir)):
        assert process.poll() is None, "the run ended before its step-8 checkpoint"
        assert time.monotonic() < deadline, "no step-8 checkpoint within 300 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = max(checkpoints.list_steps(str(checkpoint_dir)))
    assert process.returncode == -signal.SIGKILL
    assert killed_at < steps, "the run finished before it was killed; nothing was resumed"

    restarted = subprocess.run(_train_command(demo_data["train"], crashed, steps), env=_environment(), check=True,
                               capture_output=True, text=True, cwd=REPOSITORY)
    assert f"resuming from checkpoint at step {killed_at}" in restarted.stdout

    a = checkpoints.load_arrays(str(uninterrupted / "checkpoints"), steps)
    b = checkpoints.load_arrays(str(crashed / "checkpoints"), steps)
    assert sorted(a) == sorted(b) and len(a) > 10
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=1e-8, err_msg=key)
    history = json.loads((crashed / "metrics.json").read_text())["loss_history"]
    assert [s for s, _ in history] == list(range(1, steps + 1))
    assert (crashed / "model.keras").is_file() and not (crashed / "saved_model").exists()  # --no-saved-model
    trained_with = json.loads((crashed / "train_config.json").read_text())["augmentation"]
    assert trained_with["rotation_probability"] == 0.2 and trained_with["mirror_axes"] == [0, 1, 2]


@pytest.mark.slow
def test_epochs_set_the_number_of_steps(demo_data, tmp_path):
    # 6 training cases, global batch 4 (4 replicas × 2 cores): ceil(6 / 4) = 2 steps an epoch, 3 epochs = 6 steps.
    config = presets.smoke(
        train_data=demo_data["train"], output_dir=str(tmp_path), epochs=3, batch_size=4, checkpoint_every=100,
        partition=partitioning.PartitionConfig((1, 2, 1, 1, 1)),
    )
    results = train.train(config, log=lambda line: None, export_saved_model=False)
    assert results["steps"] == 6
    assert checkpoints.list_steps(str(tmp_path / "checkpoints")) == [6]


@pytest.mark.slow
def test_refused_rerun_leaves_the_finished_run_byte_identical(segmentation_run, demo_data):
    """Another model is refused for what it changes (`engine.run_record`); asked to continue with the change, the
    checkpoint that does not fit it is refused; neither writes anything."""
    from trainer import evaluate

    config, _, _ = segmentation_run
    run = config.output_dir
    before = snapshot(run)
    wider = dataclasses.replace(config, model=dataclasses.replace(config.model, base_filters=8), learning_rate=1e-3)
    with pytest.raises(ValueError) as refused:
        train.train(wider, log=lambda line: None)
    assert str(refused.value).startswith(f"--output {run} was trained with learning_rate 0.01 but this rerun has "
                                         "0.001 (--learning-rate) (and model.base_filters differ too); ")
    assert snapshot(run) == before
    with pytest.raises(ValueError) as refused:
        train.train(wider, log=lambda line: None, continue_with_changes=True)
    assert str(refused.value).startswith(f"checkpoint {run}/checkpoints/00000040 does not match this model (")
    assert str(refused.value).endswith("resume with the configuration that wrote it, or train into a new --output "
                                       "directory.")
    assert snapshot(run) == before  # train_config.json included: the run is still the one that was finished
    assert not os.path.exists(run + ".fullres-lock")
    scores = evaluate.evaluate_trained(run, demo_data["eval"], log=lambda line: None)
    assert len(scores["dice_per_class"]) == 3 and scores["cases"] == 2


def test_output_holding_other_files_is_refused_before_training(demo_data, tmp_path):
    from common import output_guard

    output = tmp_path / "papers"
    output.mkdir()
    (output / "thesis.tex").write_text("four years")
    config = presets.smoke(train_data=demo_data["train"], output_dir=str(output))
    with pytest.raises(output_guard.OutputRefused) as refused:
        train.train(config, log=lambda line: None)
    assert str(refused.value) == (
        f"--output {output} holds files fullres did not write (thesis.tex); fullres never deletes or overwrites them, "
        "so pass a new or empty directory as --output, or the output of an earlier `fullres train` to resume it.")
    assert snapshot(output) == {"thesis.tex": b"four years"}
    data_directory = os.path.dirname(demo_data["train"])
    inside = presets.smoke(train_data=demo_data["train"], output_dir=os.path.join(data_directory, "run"))
    with pytest.raises(output_guard.OutputRefused, match=r"^--output .*/run lies inside the training data .*; fullres "
                                                         r"would replace or mix its files with yours, so choose an "
                                                         r"--output outside "):
        train.train(inside, log=lambda line: None)
    assert not os.path.exists(os.path.join(data_directory, "run"))


def _cut_short(step_folder):
    """What a disk failing under a save leaves: the checkpoint's array files cut to 10 bytes."""
    data = step_folder / "default" / "d"
    for name in os.listdir(data):
        with open(data / name, "r+b") as file:
            file.truncate(10)


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_and_none_intact_is_one_sentence(segmentation_run, tmp_path):
    """The shared run copied, its step-40 checkpoint cut short: the rerun resumes from step 30, saying why."""
    import shutil

    from typer.testing import CliRunner

    from pipelines import cli

    config, _, _ = segmentation_run
    run = tmp_path / "run"
    shutil.copytree(config.output_dir, run)
    folders = run / "checkpoints"
    _cut_short(folders / "00000040")
    newest = snapshot(folders / "00000040")
    arguments = ["--train", config.train_data, "--output", str(run), "--preset", "smoke", "--steps", "40",
                 "--learning-rate", "1e-2", "--checkpoint-every", "10", "--log-every", "5",
                 "--input-partition-dims", "1,4,1,1,1", "--no-saved-model"]
    resumed = subprocess.run([sys.executable, "-m", "trainer", "train", *arguments, "--virtual-devices", "8"],
                             env=_environment(), capture_output=True, text=True, cwd=REPOSITORY)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr  # nor TensorStore's callbacks into the failed read's closed loop
    lines = resumed.stdout.splitlines()
    assert json.loads((run / "metrics.json").read_text())["resumed_from_step"] == 30
    assert any(line.startswith(f"checkpoint {folders}/00000040 is damaged (Requested byte range") for line in lines)
    assert (f"moved the damaged checkpoint {folders}/00000040 aside to {folders}/00000040.damaged (fullres keeps it; "
            "delete it when done)") in lines
    assert "resuming from checkpoint at step 30" in lines
    assert snapshot(folders / "00000040.damaged") == newest
    assert checkpoints.list_steps(str(folders)) == [20, 30, 40]

    shutil.rmtree(folders / "00000040.damaged")
    for step_folder in ("00000020", "00000030", "00000040"):  # now every one is damaged
        _cut_short(folders / step_folder)
    before = snapshot(run)
    result = CliRunner().invoke(cli.app, ["train", *arguments])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"fullres: error: checkpoint {folders}/00000040 is damaged (Requested byte range")
    assert result.stderr.strip().endswith(
        ") and the 2 before it, and no intact checkpoint is left to resume from; move "
        f"{folders} away to train from step 0 (fullres keeps it for you to inspect), or train into a new "
        "--output directory.")
    assert snapshot(run) == before


def test_scalars_read_back_in_tensorboard_as_tf_summary_writes_them(tmp_path):
    """The TensorFlow-free writer's file against one `tf.summary` writes: the same tags, steps, values and plugin."""
    from tensorboard.backend.event_processing import event_accumulator

    from trainer.engine import scalars

    values = [(5, {"loss": 1.25, "input_wait_fraction": 0.0625}), (10, {"loss": 0.75, "input_wait_fraction": 0.5})]
    writer = scalars.writer(str(tmp_path / "ours"))
    for step, scalar_values in values:
        writer.scalars(step, scalar_values)
    writer.close()
    theirs = tf.summary.create_file_writer(str(tmp_path / "theirs"))
    for step, scalar_values in values:
        with theirs.as_default(step=step):
            for tag, value in scalar_values.items():
                tf.summary.scalar(tag, value)
    theirs.close()
    read = {}
    for name in ("ours", "theirs"):
        events = event_accumulator.EventAccumulator(str(tmp_path / name)).Reload()
        read[name] = {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto)), str(e.tensor_proto.dtype))
                            for e in events.Tensors(tag)] for tag in events.Tags()["tensors"]}
        read[name]["plugins"] = sorted(events.PluginTagToContent("scalars"))
    assert read["ours"] == read["theirs"]
    assert read["ours"]["loss"] == [(5, 1.25, "1"), (10, 0.75, "1")]


def test_the_trainer_s_seed_draws_what_keras_s_seed_draws():
    """`run_setup.seed` is `keras.utils.set_random_seed` less TensorFlow's seed: the same weights, NumPy and Python draws."""
    import random

    import keras

    from trainer.models import unet_layers

    def draws():
        layer = keras.layers.Dense(3, kernel_initializer=unet_layers.FlatGlorotUniform())
        layer.build((None, 4))
        return (np.asarray(layer.kernel).tolist(), np.asarray(keras.random.normal((2,))).tolist(),
                np.random.rand(2).tolist(), random.random())

    keras.utils.set_random_seed(11)
    theirs = draws()
    run_setup.seed(11)
    ours = draws()
    run_setup.seed(12)
    assert ours == theirs and draws() != theirs


@pytest.mark.slow
def test_a_ct_training_process_without_export_imports_no_tensorflow(demo_data, tmp_path):
    """A pipeline's train step (no SavedModel) on a local data set: resolved, read, logged to TensorBoard, checkpointed
    and saved as model.keras, all without TensorFlow (4.6 CPU-s of every such process before)."""
    program = f"""
import json, sys
from trainer import presets, train
config = presets.smoke(train_data={demo_data['train']!r}, eval_data={demo_data['eval']!r},
                          output_dir={str(tmp_path / 'run')!r}, steps=2, log_every=1)
results = train.train(config, log=lambda line: None, export_saved_model=False)
print(json.dumps({{"steps": results["steps"], "tensorflow": "tensorflow" in sys.modules}}))
"""
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPOSITORY,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"steps": 2, "tensorflow": False}
    assert (tmp_path / "run" / "model.keras").is_file()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "run" / "tensorboard"))
