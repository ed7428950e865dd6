"""Full-volume evaluation under the training partitioning: per-class Dice."""

from __future__ import annotations


from trainer import ct_input, distributed, inference, metrics, partitioning, step, tasks


def evaluate_segmentation(
    model,
    state: step.TrainState,
    distribution: partitioning.SpatialParallel,
    pattern: str,
    batch_size: int,
    num_classes: int,
    samples: list | None = None,
    keep: int = 0,
) -> dict:
    """Predicts every case matching `pattern` at full resolution and scores it.

    With `samples` (a list) and `keep`, the first `keep` cases are appended to
    it as `{"case_id", "image" (D, H, W, C), "label", "prediction"}` for reports.

    The last batch is padded with copies of its first case to the global batch
    size, so every replica gets an equal share; padded predictions are dropped.

    Returns:
        `{"dice_per_class": [...], "dice_mean": x, "cases": n}`; `dice_mean` is
        the mean over foreground classes.
    """
    dice = metrics.DiceAccumulator(num_classes)
    predict = None
    cases = 0
    for batch in ct_input.ct_dataset(pattern, batch_size).as_numpy_iterator():
        images, labels = batch["image"], batch["label"]
        real = images.shape[0]
        images = tasks.pad_batch(images, batch_size)  # (B, D, H, W, 1)
        if predict is None:
            predict = distributed.RunTogether(
                inference.make_forward(model, distribution, state, images.ndim, "class_ids"), "evaluation")
        predictions = step.to_host(predict(state, step.place_batch(distribution, images)))[:real]
        dice.update(predictions, labels)
        if samples is not None:
            for index in range(min(real, keep - len(samples))):
                samples.append({"case_id": batch["case_id"][index].decode(), "image": batch["image"][index],
                                "label": labels[index], "prediction": predictions[index]})
        cases += real
    return {"dice_per_class": dice.per_class(), "dice_mean": dice.foreground_mean(), "cases": cases}


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

    config, task = tasks.restore(model_dir)
    if partition is not None:
        config = dataclasses.replace(config, partition=partition)
    devices = devices or jax.devices()
    cores = config.partition.num_cores_per_replica
    if cores > len(devices):
        raise partitioning.PartitionError(
            f"the model was trained with {cores} cores per replica (input_partition_dims "
            f"{list(config.partition.input_partition_dims)}) but {len(devices)} device(s) are present; run where "
            f"{cores} are, or on a CPU with --virtual-devices {cores}."
        )
    replicas = max(d for d in range(1, len(devices) // cores + 1) if config.batch_size % d == 0)
    distribution = partitioning.make_distribution(config.partition, devices[: replicas * cores])
    with distribution.scope():
        model = tasks.load_weights(task, model_dir)
    state = step.TrainState([v.value for v in model.trainable_variables],
                            [v.value for v in model.non_trainable_variables], [])
    state = step.place_state(state, distribution)
    return config, task, model, state, distribution


def evaluate_trained(model_dir: str, pattern: str, report_path: str | None = None, class_names: list[str] | None = None,
                     report_examples: int = 4, log=print) -> dict:
    """Scores a trained model (the output directory of `fullres train`) on `pattern`; writes the HTML report.

    The model runs at full resolution under its training partitioning (see
    `load_trained`). Segmentation scores per-class Dice, detection COCO AP.

    Returns:
        The scores, with `class_names` and, when a report was written, `report`.
    """
    import os

    from trainer import train

    config, task, model, state, distribution = load_trained(model_dir, None)
    names = task.report_class_names(class_names)  # checked before the (long) evaluation
    samples: list = []
    scores = task.evaluate(model, state, distribution, log, pattern=pattern, samples=samples, keep=report_examples)
    scores["class_names"] = names
    history = [[e["step"], e["loss"]] for e in train.read_history(os.path.join(model_dir, "history.jsonl"))]
    if report_path:
        page = task.report(scores, samples, history)
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        with open(report_path, "w") as file:
            file.write(page)
        scores["report"] = report_path
        log(f"wrote the report to {report_path}")
    scores["task"] = task.name
    return scores
