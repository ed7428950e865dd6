"""A resume on a device count its run's batch and split do not divide over is refused by the device counts that
fit (`engine.resume_check`), not told to change the batch, which the resume itself would refuse."""

from typer.testing import CliRunner

from pipelines import cli
from preprocessing.records import data_set
from tests.files import snapshot
from trainer import trained_run
from trainer import presets
from trainer.engine import program, run_files, run_record
from trainer.parallel import partitioning

SPLIT = ["--preset", "smoke", "--batch-size", "2", "--input-partition-dims", "1,2,1,1,1"]


def _train(*arguments):
    return CliRunner().invoke(cli.app, ["train", *arguments, "--no-saved-model"])


def test_a_resume_on_devices_its_batch_does_not_divide_over_names_the_device_counts_that_fit(demo_data, tmp_path):
    new = _train("--train", demo_data["train"], "--output", str(tmp_path / "new"), "--steps", "2", *SPLIT)
    assert new.exit_code == 2, new.output  # a new run: its batch is the one to change (the sentence tests assert)
    assert "fullres: error: global batch size 2 does not divide over 4 replicas (8 devices / 2 cores per replica); " \
           "use a multiple of 4." in new.stderr
    run = tmp_path / "run"  # the same run, trained on 4 devices (2 replicas), resumed on the tests' 8
    config = presets.smoke(train_data=demo_data["train"], output_dir=str(run), steps=2,
                              partition=partitioning.PartitionConfig((1, 2, 1, 1, 1), (1, 2, 1, 1, 1)))
    run.mkdir()
    run_files.write_train_config(str(run), config)
    run_record.record(str(run), run_record.check_rerun(config, trained_run.read_record(str(run)), 2, 4,
                                                       program.warmup_steps_used(config, 2),
                                                       trained_on=data_set.fingerprint(config.train_data)))
    before = snapshot(run)
    refused = _train("--output", str(run), "--steps", "4")
    assert refused.exit_code == 2, refused.output
    assert refused.stderr == (
        f"fullres: error: --output {run} holds a run of global batch 2 split 1,2,1,1,1 (2 devices per replica, "
        "trained on 4 devices), which does not divide over the 8 devices present (4 replicas of 2 devices); resume "
        "it on 4 or 2 devices (--virtual-devices on a CPU, else the devices present), or train into a new --output "
        "with another --batch-size.\n")
    assert snapshot(run) == before
