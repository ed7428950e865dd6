"""Full-volume evaluation under the training partitioning: per-class Dice."""

from __future__ import annotations


from trainer import ct_input, metrics, partitioning, step, tasks


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
            predict = step.jit_predict_step(step.make_predict_step(model), distribution, state, images.ndim)
        predictions = step.to_host(predict(state, step.place_batch(distribution, images)))[:real]
        dice.update(predictions, labels)
        if samples is not None:
            for index in range(min(real, keep - len(samples))):
                samples.append({"case_id": batch["case_id"][index].decode(), "image": batch["image"][index],
                                "label": labels[index], "prediction": predictions[index]})
        cases += real
    return {"dice_per_class": dice.per_class(), "dice_mean": dice.foreground_mean(), "cases": cases}


def load_trained(model_dir: str, devices=None):
    """A trained model back from `model_dir` (`train_config.json` + `model.keras`), placed for partitioned inference.

    Returns:
        (config, task, model, state, distribution) with the training partitioning,
        or the largest one the present devices hold (replicas reduced first).
    """
    import json
    import os

    import jax

    from trainer import config as config_lib

    config_path = os.path.join(model_dir, "train_config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{model_dir} has no train_config.json; pass the output directory of `fullres train`.")
    with open(config_path) as file:
        config = config_lib.from_dict(json.load(file))
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
    task = tasks.make_task(config)
    info_path = os.path.join(model_dir, "model_info.json")
    if os.path.exists(info_path):  # the names the model was trained with, wherever its training data is now
        with open(info_path) as file:
            names = json.load(file).get("class_names")
        if names:
            task.class_names = names
    with distribution.scope():
        # Rebuilt from its config and given the trained weights: KerasHub's backbones inside the detector do not
        # survive `keras.saving.load_model`, and a rebuilt model is the one the trainer compiled.
        model = task.build_model()
        model.load_weights(os.path.join(model_dir, "model.keras"))
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

    from trainer import report, train

    config, task, model, state, distribution = load_trained(model_dir, None)
    if task.name == "segmentation":  # checked before the (long) evaluation
        names = list(class_names or ["background"] + [f"class_{i}" for i in range(1, config.model.num_classes)])
        if len(names) != config.model.num_classes:
            raise ValueError(f"{len(names)} class names given for a model of {config.model.num_classes} classes; give "
                             "one name per class, background first.")
    samples: list = []
    scores = task.evaluate(model, state, distribution, log, pattern=pattern, samples=samples, keep=report_examples)
    if task.name == "segmentation":
        scores["class_names"] = names
    history = [[e["step"], e["loss"]] for e in train.read_history(os.path.join(model_dir, "history.jsonl"))]
    if report_path:
        if task.name == "segmentation":
            page = report.segmentation_report(scores, samples, history, scores["class_names"])
        else:
            page = report.detection_report(scores, samples, history, scores["class_names"])
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        with open(report_path, "w") as file:
            file.write(page)
        scores["report"] = report_path
        log(f"wrote the report to {report_path}")
    scores["task"] = task.name
    return scores
