"""Evaluation (the pipelines' evaluate step): a trained model back from its run, scored on new data through its task, and the report.

The scoring itself is the task's (`tasks.segmentation` Dice, `tasks.detection`
COCO AP), through the one forward pass (`engine.inference`).
"""

from __future__ import annotations

from trainer.tasks import registry
from trainer.engine import placement, run_files
from trainer.parallel import partitioning

def load_trained(model_dir: str, devices=None, partition: partitioning.PartitionConfig | None = None):
    """A trained model back from `model_dir` (`train_config.json` + `model.keras`), placed for partitioned inference.

    Args:
        partition: split the inputs like this instead of as in training.

    Returns:
        (config, task, model, state, distribution) with the training partitioning (or `partition`),
        or the largest one the present devices hold (replicas reduced first).
    """
    import dataclasses

    import jax

    config, task = registry.restore(model_dir)
    if partition is not None:
        config = dataclasses.replace(config, partition=partition)
    devices = devices or jax.devices()
    cores = config.partition.num_cores_per_replica
    partitioning.require_devices(cores, len(devices),
                                 f"the model's input_partition_dims {list(config.partition.input_partition_dims)}")
    replicas = max(d for d in range(1, len(devices) // cores + 1) if config.batch_size % d == 0)
    distribution = partitioning.make_distribution(config.partition, devices[: replicas * cores])
    with distribution.scope():
        model = registry.load_weights(task, model_dir)
    state = placement.TrainState([v.value for v in model.trainable_variables],
                                 [v.value for v in model.non_trainable_variables], [])
    state = placement.place_state(state, distribution)
    return config, task, model, state, distribution


def evaluate_trained(model_dir: str, pattern: str, report_path: str | None = None, class_names: list[str] | None = None,
                     report_examples: int = 4, pseudonymize: bool = False, log=print) -> dict:
    """Scores a trained model (the output directory of `fullres train`) on `pattern`; writes the HTML report.

    The model runs at full resolution under its training partitioning (see
    `load_trained`). Segmentation scores per-class Dice, detection COCO AP.
    The report names each case by its record's id; with `pseudonymize`, an id
    that is not a pseudonym (data preprocessed without `--pseudonymize`: ids are
    folder and file names) is shown as "held-out case N" instead.

    Returns:
        The scores, with `class_names` and, when a report was written, `report`.
    """
    import os

    _, checked = registry.restore(model_dir)
    checked.check_data(pattern, "--eval", training=False)  # before the model is placed: one sentence, no traceback
    config, task, model, state, distribution = load_trained(model_dir, None)
    names = task.report_class_names(class_names)  # checked before the (long) evaluation
    samples: list = []
    scores = task.evaluate(model, state, distribution, log, pattern=pattern, samples=samples, keep=report_examples)
    scores["class_names"] = names
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


def _without_names(sample: dict, number: int) -> dict:
    """A report sample whose case id (or image source id) is "held-out case N" unless it is a pseudonym already."""
    from common import identifiers

    return {key: value if key not in ("case_id", "source_id") or identifiers.is_pseudonym(str(value))
            else f"held-out case {number}" for key, value in sample.items()}
