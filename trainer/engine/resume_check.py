"""The first of a run's checks, before the data are read: the run folder a rerun resumes, and the devices.

* A damaged `train_config.json` (`run_files.check_resumable`: otherwise the run's own files would be called
  foreign) and a trained model whose checkpoints are gone (`run_files.check_model_kept`: a rerun would train from
  step 1 and overwrite it).
* A split the devices present cannot hold (`replicas.validate_devices`). A new run whose global batch does not
  divide over its replicas is told to change the batch (`replicas.validate`); a resume cannot change it (the
  batch and the split are what the run means: `run_record.check_rerun`), so its sentence names the device counts
  over which the run's own batch and split do divide, and a new `--output` for another batch.
"""

from __future__ import annotations

from trainer import config as config_lib
from trainer.engine import run_files
from trainer.parallel import partitioning, replicas


def check(config: config_lib.TrainConfig, num_devices: int) -> None:
    """The run folder `config.output_dir` is one a rerun can resume (or holds no run), and the split fits
    `num_devices` devices: `replicas.validate_devices`, and for resuming a run whose batch and split do not fit
    them, this module's sentence instead; nothing more for an auto split, or a rerun that changes the batch or the
    split (the rerun check names that change).

    Raises:
        output_guard.OutputRefused: a damaged train_config.json, or a trained model without its checkpoints.
        partitioning.PartitionError: one sentence naming the run's batch, split and device count, and the fix.
    """
    run_files.check_resumable(config.output_dir)
    run_files.check_model_kept(config.output_dir)
    if config.partition.is_auto:
        return
    _check_resume(config, num_devices)
    replicas.validate_devices(config.partition, num_devices)


def _check_resume(config: config_lib.TrainConfig, num_devices: int) -> None:
    run_dir = config.output_dir
    if not run_files.holds_run(run_dir):
        return
    recorded = run_files.read_train_config_dict(run_dir) or {}
    dims = list(config.partition.input_partition_dims)
    if recorded.get("batch_size") != config.batch_size \
            or list((recorded.get("partition") or {}).get("input_partition_dims") or []) != dims:
        return
    cores = config.partition.num_cores_per_replica
    if num_devices % cores == 0 and config.batch_size % (num_devices // cores) == 0:
        return
    why = (f"{num_devices // cores} replicas" + (f" of {cores} devices" if cores > 1 else "")
           if num_devices % cores == 0 else f"not whole replicas of {cores} devices")
    history = run_files.read_run_record(run_dir).get("history") or []
    trained_on = next((line["devices"] for line in reversed(history) if line.get("devices")), None)
    counts = [str(count) for count in replicas.fitting_counts(config.batch_size, cores)]
    shown = " or ".join(counts) if len(counts) <= 2 else ", ".join(counts[:-1]) + " or " + counts[-1]
    raise partitioning.PartitionError(
        f"--output {run_dir} holds a run of global batch {config.batch_size} split {','.join(map(str, dims))} "
        f"({cores} devices per replica{f', trained on {trained_on} devices' if trained_on else ''}), which does not "
        f"divide over the {num_devices} devices present ({why}); resume it on {shown} devices (--virtual-devices on "
        "a CPU, else the devices present), or train into a new --output with another --batch-size.")
