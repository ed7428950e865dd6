"""Evaluation (the pipelines' evaluate step): a trained model back from its run, scored on new data through its task, and the report.

The scoring itself is the task's (`tasks.segmentation` Dice, `tasks.detection`
COCO AP), through the one forward pass (`engine.inference`).
"""

from __future__ import annotations

from preprocessing.records import data_set
from trainer import trained_run
from trainer.engine import run_data, run_files


def evaluate_trained(model_dir: str, pattern: str, report_path: str | None = None, class_names: list[str] | None = None,
                     report_examples: int = 4, pseudonymize: bool = False, log=print,
                     across_preprocessings: bool = False) -> dict:
    """Scores a trained model (the output directory of `fullres train`) on `pattern`; writes the HTML report.

    The model runs at full resolution, split as `fullres predict` splits it on the devices present
    (`device_split.choose`: the training split where they hold it, else the same axes in fewer parts), over as
    many replicas as the devices hold and the training batch divides (`trained_run.load`); the log and the
    scores' `split` say which and why. Segmentation scores per-class Dice, detection COCO AP.
    The report names each case by its record's id; with `pseudonymize`, an id
    that is not a pseudonym (data preprocessed without `--pseudonymize`: ids are
    folder and file names) is shown as "held-out case N" instead.

    Data preprocessed otherwise than the run's training data (`run_data.check_eval`) are refused unless
    `across_preprocessings`; the scores then carry `across_preprocessings`, saying how they differ.

    Returns:
        The scores, with `class_names` and, when a report was written, `report`.
    """
    import os

    run = trained_run.open_run(model_dir)
    run.task.check_data(pattern, "--eval", training=False)  # before the model is placed: one sentence, no traceback
    note = run_data.check_eval(run_data.trained_fingerprint(trained_run.read_record(model_dir)),
                                 f"{run_files.path(model_dir, run_files.RUN_RECORD)}", pattern,
                                 data_set.fingerprint(pattern), across_preprocessings)
    task = run.task
    names = task.report_class_names(class_names)  # checked before the (long) evaluation
    loaded, split = _load_on_devices_present(run, log)
    samples: list = []
    scores = task.evaluate(loaded.model, loaded.state, loaded.distribution, log, pattern=pattern, samples=samples,
                           keep=report_examples)
    scores["class_names"] = names
    scores["split"] = split
    if note:
        scores["across_preprocessings"] = note
        log(f"warning: {note}")
    if pseudonymize:
        samples = [_without_names(sample, number) for number, sample in enumerate(samples, 1)]
    history = run_files.loss_curve(model_dir)
    if report_path:
        page = task.report(scores, samples, history)
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        with open(report_path, "w") as file:
            file.write(page)
        scores["report"] = report_path
        log(f"wrote the report to {report_path}")
    scores["task"] = task.name
    return scores


def _load_on_devices_present(run: trained_run.TrainedRun, log) -> tuple[trained_run.Loaded, dict]:
    """The run's model placed under the split the devices present allow (`trained_run.load_split`), and that choice
    as the scores keep it."""
    import jax

    loaded, split = trained_run.load_split(run)
    replicas = loaded.distribution.num_replicas
    log(f"evaluating each case split {','.join(map(str, split['input_partition_dims']))} over "
        f"{loaded.config.partition.num_cores_per_replica} {jax.devices()[0].platform} "
        f"device(s), {replicas} replica(s) of {split['devices_present']} device(s) present ({split['why']})")
    return loaded, {**split, "replicas": replicas}


def _without_names(sample: dict, number: int) -> dict:
    """A report sample whose case id (or image source id) is "held-out case N" unless it is a pseudonym already."""
    from common import identifiers

    return {key: value if key not in ("case_id", "source_id") or identifiers.is_pseudonym(str(value))
            else f"held-out case {number}" for key, value in sample.items()}
