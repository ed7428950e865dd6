"""What segmentation and detection training do differently: model, loss, data, label layout, evaluation.

`train.train` runs one loop for both; it asks the task for everything that
depends on what is being learned:

* segmentation: a UNet on CT records; labels are class maps laid out like the
  images (split or whole within a replica, as `label_partition_dims` says);
  scored with per-class Dice.
* detection: a RetinaNet on TF Object Detection API records; labels are anchor
  targets, one map per pyramid level, computed on the host and kept whole
  within a replica; scored with COCO mAP after decoding and NMS.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from trainer import config as config_lib, ct_input, distributed, partitioning, step


def pad_batch(images: np.ndarray, batch_size: int) -> np.ndarray:
    """Pads the last, short batch with copies of its first example, so every replica gets an equal share."""
    if images.shape[0] == batch_size:
        return images
    return np.concatenate([images, np.repeat(images[:1], batch_size - images.shape[0], axis=0)])


class SegmentationTask:
    """UNet on CT volumes: Dice + cross-entropy, per-class Dice."""

    name = "segmentation"

    def __init__(self, config: config_lib.TrainConfig):
        self.config = config

    def example_shape(self) -> tuple[int, ...]:
        """(D, H, W, 1) (or (H, W, 1)) of the training records; refuses too few classes for their labels."""
        values = read_label_values(self.config.train_data)
        num_classes = self.config.model.num_classes
        if values and max(values) >= num_classes:
            raise ValueError(
                f"--num-classes {num_classes} is too small for {self.config.train_data}: its summary.json lists label "
                f"values {', '.join(map(str, values))}; pass --num-classes {max(values) + 1} or more."
            )
        first = next(ct_input.ct_dataset(self.config.train_data, 1).as_numpy_iterator())
        shape = first["image"].shape[1:]
        if len(shape) != self.config.model.spatial_dims + 1:
            raise ValueError(
                f"{self.config.train_data} holds {len(shape) - 1}-D images but the model is "
                f"{self.config.model.spatial_dims}D; set spatial_dims to match the data."
            )
        return shape

    def preprocessing(self) -> dict | None:
        """How the training scans were prepared (summary.json's `preprocessing`): predict repeats it on new scans."""
        return read_preprocessing(self.config.train_data)

    def build_model(self):
        from trainer import unet

        return unet.build_unet(self.config.model, dtype=self.config.dtype_policy, remat=self.config.remat)

    def loss(self, logits, labels):
        from trainer import losses

        return losses.dice_cross_entropy(logits, labels)

    def label_sharding(self, distribution: partitioning.SpatialParallel, image_ndim: int):
        return distribution.get_label_layout((0,) * (image_ndim - 1)).backend_layout

    def planned_example_shape(self, spatial_size: tuple[int, ...] | None) -> tuple[int, ...]:
        """(D, H, W, C) of one example of `spatial_size` (default 256 a side), for `fullres plan` (no data read)."""
        spatial_size = spatial_size or (256,) * self.config.model.spatial_dims
        if len(spatial_size) != self.config.model.spatial_dims:
            raise ValueError(f"--image-size needs {self.config.model.spatial_dims} sizes for a "
                             f"{self.config.model.spatial_dims}D UNet, got {list(spatial_size)}.")
        return (*spatial_size, self.config.model.in_channels)

    def label_spec(self, image_shape: tuple[int, ...], distribution: partitioning.SpatialParallel):
        """The labels of a batch of `image_shape` as the train step receives them, shapes only: (B, D, H, W) int32."""
        return jax.ShapeDtypeStruct(image_shape[:-1], np.int32,
                                    sharding=self.label_sharding(distribution, len(image_shape)))

    def place_labels(self, distribution: partitioning.SpatialParallel, labels: np.ndarray, rows=None):
        """Labels of the global batch rows `rows` (all by default) onto the mesh."""
        sharding = self.label_sharding(distribution, labels.ndim + 1)
        return step.global_array(sharding, labels, self.config.batch_size, rows)

    def batches(self, start_step: int, rows=None, log: Callable[[str], None] = print
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(images, labels) for every step from `start_step` on, augmented as an uninterrupted run would be.

        Args:
            rows: the rows of every global batch this process reads (`step.process_rows`); None: all.
        """
        from trainer import train

        config = self.config
        data = ct_input.ct_dataset(
            config.train_data, config.batch_size, shuffle=True, repeat=True, seed=config.seed,
            skip_examples=start_step * config.batch_size, drop_remainder=True, rows=rows,
        )
        for step_number, batch in enumerate(data.as_numpy_iterator(), start_step):
            images, labels = batch["image"], batch["label"]
            if config.augment:
                images, labels = train.random_flips(images, labels, config.seed, step_number, rows)
            yield images, labels

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json: nothing (volumes are cropped at preprocessing, and say so)."""
        return {}

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """Per-class Dice on `pattern` (default: the config's eval data); the first `keep` cases go to `samples`."""
        from trainer import evaluate

        config = self.config
        scores = evaluate.evaluate_segmentation(
            model, state, distribution, pattern or config.eval_data, config.batch_size, config.model.num_classes,
            samples=samples, keep=keep,
        )
        dice_text = ", ".join("n/a" if d is None else f"{d:.3f}" for d in scores["dice_per_class"])
        mean = scores["dice_mean"]
        log(f"Dice per class [{dice_text}], foreground mean {'n/a' if mean is None else f'{mean:.3f}'}")
        return scores

    @staticmethod
    def headline(scores: dict) -> dict:
        """The scalars worth a TensorBoard curve."""
        return {"dice_mean": scores["dice_mean"]} if scores.get("dice_mean") is not None else {}

    def report_class_names(self, given: list[str] | None) -> list[str]:
        """One name per class, background first: `given`, or background, class_1, ...

        Raises:
            ValueError: `given` names another number of classes than the model predicts.
        """
        num_classes = self.config.model.num_classes
        names = list(given or ["background"] + [f"class_{i}" for i in range(1, num_classes)])
        if len(names) != num_classes:
            raise ValueError(f"{len(names)} class names given for a model of {num_classes} classes; give one name per "
                             "class, background first.")
        return names

    @staticmethod
    def report(scores: dict, samples: list, loss_history: list) -> str:
        """The HTML report: Dice table, loss curve, true and predicted label maps of `samples`."""
        from trainer import report

        return report.segmentation_report(scores, samples, loss_history, scores["class_names"])


def read_label_values(pattern: str) -> list[int]:
    """The class ids `fullres preprocess ct` found in the data (`summary.json` beside the records); [] if not recorded."""
    import tensorflow as tf

    path = os.path.join(os.path.dirname(pattern), "summary.json")
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as file:
        return sorted(int(value) for value in json.load(file).get("label_values", {}))


def read_preprocessing(pattern: str) -> dict | None:
    """The spacing, orientation, window and modality `fullres preprocess ct` used (`summary.json` beside the records).

    None when the records carry no such summary (older conversions, synthetic demo records).
    """
    import tensorflow as tf

    path = os.path.join(os.path.dirname(pattern), "summary.json")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as file:
        return json.load(file).get("preprocessing")


def label_map_path(pattern: str) -> str:
    """Where `fullres preprocess images` writes `label_map.json`: beside the records."""
    return os.path.join(os.path.dirname(pattern), "label_map.json")


def read_label_map(pattern: str) -> dict[str, int] | None:
    """`label_map.json` (name -> id) beside the records; None when there is none.

    Ids count from 1, as the records store them (TF Object Detection API); the
    class index the model predicts is id - 1, everywhere: input, loss, mAP, report.

    Raises:
        ValueError: an id is not a whole number from 1 (a map written before
            COCO category 0 was stored as 1 holds a 0).
    """
    import tensorflow as tf

    path = label_map_path(pattern)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as file:
        label_map = json.load(file)
    for name, number in label_map.items():
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{path} maps {name!r} to {number!r}, but class ids count from 1 (0 is the background "
                             "in the TF Object Detection API); convert the data again with fullres preprocess images, "
                             "which stores COCO category 0 as 1.")
    return label_map


def check_label_maps_agree(train_pattern: str, eval_pattern: str) -> None:
    """Refuses evaluation data whose class ids differ from the training data's: it would be scored silently wrong.

    Raises:
        ValueError: a class of the eval label map has another id (or none) in the training label map.
    """
    train_map, eval_map = read_label_map(train_pattern), read_label_map(eval_pattern)
    if not train_map or not eval_map:
        return
    for name, number in sorted(eval_map.items(), key=lambda item: item[1]):
        if train_map.get(name) != number:
            raise ValueError(
                f"class {name!r} has id {number} in {label_map_path(eval_pattern)} but "
                f"{train_map.get(name) or 'no id'} in {label_map_path(train_pattern)}, so evaluation would score it "
                f"as another class; convert the eval data again with --label-map {label_map_path(train_pattern)}."
            )


def class_names(label_map: dict[str, int] | None, num_classes: int) -> list[str]:
    """Names of the 0-based classes; ids the label map skips are named `class_<id>`."""
    by_id = {number: name for name, number in (label_map or {}).items()}
    return [by_id.get(index + 1, f"class_{index + 1}") for index in range(num_classes)]


class DetectionTask:
    """RetinaNet on images with boxes: focal + Huber loss, COCO mAP."""

    name = "detection"
    # Evaluation keeps every ground-truth box (training keeps `max_boxes`): a cut-off box would raise the mAP.
    EVAL_MAX_BOXES = 1000

    def __init__(self, config: config_lib.TrainConfig):
        self.config = config
        label_map = read_label_map(config.train_data) if config.train_data else None  # none when only planning
        if label_map and max(label_map.values()) > config.model.num_classes:
            raise ValueError(
                f"the label map beside {config.train_data} has class ids up to {max(label_map.values())} but the model "
                f"predicts {config.model.num_classes} classes; set num_classes to {max(label_map.values())}."
            )
        self.class_names = class_names(label_map, config.model.num_classes)
        if config.eval_data:
            check_label_maps_agree(config.train_data, config.eval_data)
        self.boxes_dropped_max_boxes = 0  # training boxes beyond max_boxes, in the batches handed out so far
        self.eval_boxes_dropped = 0  # ground-truth boxes beyond EVAL_MAX_BOXES, in the last evaluation

    def example_shape(self) -> tuple[int, ...]:
        ct_input.list_files(self.config.train_data)  # a clear error when nothing matches
        return (*self.config.image_size, 3)

    def preprocessing(self) -> dict | None:
        """Images are resized by the input pipeline, not preprocessed per scan: nothing for predict to repeat."""
        return None

    def build_model(self):
        from trainer import retinanet

        if self.config.remat:
            raise ValueError("remat is implemented for the UNet only; train the detector without --remat.")
        return retinanet.build_retinanet(self.config.model, dtype=self.config.dtype_policy)

    def loss(self, outputs, targets):
        from trainer import retinanet

        return retinanet.detection_loss(outputs, targets, self.config.model)

    def planned_example_shape(self, spatial_size: tuple[int, ...] | None) -> tuple[int, ...]:
        """(H, W, 3) of one image for `fullres plan`: the config's canvas (`image_size`; `spatial_size` must match)."""
        if spatial_size is not None and tuple(spatial_size) != self.config.image_size:
            raise ValueError(f"--image-size {list(spatial_size)} differs from the detection canvas "
                             f"{list(self.config.image_size)}; set image_size={','.join(map(str, spatial_size))}.")
        return (*self.config.image_size, 3)

    def label_spec(self, image_shape: tuple[int, ...], distribution: partitioning.SpatialParallel) -> dict:
        """The anchor targets of a batch of `image_shape`, shapes only: one boxes and one classes map per level."""
        from trainer import retinanet

        model, shardings, specs = self.config.model, self.label_sharding(distribution, len(image_shape)), {}
        for number, level in zip(range(model.min_level, model.max_level + 1), model.levels):
            grid = (image_shape[0], image_shape[1] // 2**number, image_shape[2] // 2**number)
            anchors = model.anchors_per_position
            specs[f"boxes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors * retinanet.BOX_CODE), np.float32,
                                                           sharding=shardings[f"boxes/{level}"])
            specs[f"classes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors), np.int32,
                                                             sharding=shardings[f"classes/{level}"])
        return specs

    def label_sharding(self, distribution: partitioning.SpatialParallel, image_ndim: int):
        """Targets are whole within a replica (split over replicas along the batch only), one per level."""
        whole = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec(partitioning.REPLICA_AXIS))
        return {f"{kind}/{level}": whole for level in self.config.model.levels for kind in ("boxes", "classes")}

    def place_labels(self, distribution: partitioning.SpatialParallel, targets: dict, rows=None):
        """Anchor targets of the global batch rows `rows` (all by default) onto the mesh."""
        shardings = self.label_sharding(distribution, 4)
        return {key: step.global_array(shardings[key], value, self.config.batch_size, rows)
                for key, value in targets.items()}

    def batches(self, start_step: int, rows=None, log: Callable[[str], None] = print
                ) -> Iterator[tuple[np.ndarray, dict]]:
        """(images, anchor targets) for every step from `start_step` on; `rows` as in `SegmentationTask.batches`.

        Boxes beyond `max_boxes` are counted (`input_counts`; in this process's rows) and logged:
        on the first step that drops any, then once per `log_every` steps that drop more.
        """
        from trainer import detection_input, retinanet

        config = self.config
        data = detection_input.detection_dataset(
            config.train_data, config.batch_size, config.image_size, max_boxes=config.max_boxes,
            augment=config.augment, shuffle=True, repeat=True, seed=config.seed,
            skip_examples=start_step * config.batch_size, drop_remainder=True, rows=rows,
        )
        unreported = unreported_images = 0
        for step_number, batch in enumerate(data.as_numpy_iterator(), start_step):
            dropped = int(batch["boxes_dropped"].sum())
            self.boxes_dropped_max_boxes += dropped
            unreported += dropped
            unreported_images += int((batch["boxes_dropped"] > 0).sum())
            first = dropped and self.boxes_dropped_max_boxes == dropped
            if unreported and (first or (step_number + 1) % config.log_every == 0):
                log(f"step {step_number + 1}: {unreported} boxes beyond max_boxes {config.max_boxes} left out of "
                    f"{unreported_images} training images ({self.boxes_dropped_max_boxes} in this run so far); raise "
                    "max_boxes to train on them")
                unreported = unreported_images = 0
            targets = retinanet.encode_targets(batch["boxes"], batch["classes"], config.image_size, config.model)
            yield batch["image"], targets

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json."""
        return {"boxes_dropped_max_boxes": self.boxes_dropped_max_boxes}

    def predict(self, model, state, distribution, pattern: str, max_detections: int = 100):
        """Detections and ground truth of every image matching `pattern`, at full resolution, partitioned as in training.

        Yields per image `(image, truth {"boxes", "classes"}, found {"boxes", "scores", "classes"}, source_id)`,
        boxes in "yxyx" pixels of the canvas, classes 0-based.
        """
        from trainer import detection_eval, detection_input

        config = self.config
        image_sharding = distribution.get_data_layout((0,) * 4).backend_layout
        forward = distributed.RunTogether(jax.jit(
            lambda state, images: model.stateless_call(state.trainable, state.non_trainable, images, training=False)[0],
            in_shardings=(step.state_shardings(state, distribution), image_sharding),
        ), "detection forward")
        data = detection_input.detection_dataset(pattern, config.batch_size, config.image_size,
                                                 max_boxes=self.EVAL_MAX_BOXES)
        self.eval_boxes_dropped = 0
        for batch in data.as_numpy_iterator():
            self.eval_boxes_dropped += int(batch["boxes_dropped"].sum())
            real = batch["image"].shape[0]
            images = pad_batch(batch["image"], config.batch_size)
            outputs = forward(state, step.place_batch(distribution, images))
            outputs = {key: step.to_host(value)[:real] for key, value in outputs.items()}
            found = detection_eval.decode_detections(outputs, config.image_size, config.model,
                                                     max_detections=max_detections)
            for index in range(real):
                count = int(found["num_detections"][index])
                keep = batch["classes"][index] >= 0
                truth = {"boxes": batch["boxes"][index][keep], "classes": batch["classes"][index][keep]}
                detections = {"boxes": found["boxes"][index][:count], "scores": found["confidence"][index][:count],
                              "classes": found["classes"][index][:count]}
                yield batch["image"][index], truth, detections, batch["source_id"][index].decode()

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """COCO AP on `pattern` (default: the config's eval data); the first `keep` images go to `samples`."""
        from trainer import detection_eval

        pattern = pattern or self.config.eval_data
        check_label_maps_agree(self.config.train_data, pattern)
        truths, found = [], []
        for image, truth, detections, source_id in self.predict(model, state, distribution, pattern):
            if samples is not None and len(samples) < keep:
                samples.append({"source_id": source_id, "image": image, "truth": truth, "detections": detections})
            truths.append(truth)
            found.append(detections)
        scores = detection_eval.coco_metrics(found, truths, self.class_names)
        scores["images"] = len(truths)
        scores["class_names"] = self.class_names
        scores["eval_boxes_dropped_max_boxes"] = self.eval_boxes_dropped
        if self.eval_boxes_dropped:
            log(f"{self.eval_boxes_dropped} ground-truth boxes beyond {self.EVAL_MAX_BOXES} per image were left out of "
                "the evaluation; the mAP is computed without them")
        per_class = ", ".join(f"{name} {'n/a' if ap is None else f'{ap:.3f}'}" for name, ap in scores["per_class_AP"].items())
        log(f"COCO mAP {scores['mAP']:.3f}, mAP@0.5 {scores['mAP@0.5']:.3f} on {len(truths)} images; AP {per_class}")
        return scores

    @staticmethod
    def headline(scores: dict) -> dict:
        return {"mAP": scores["mAP"], "mAP@0.5": scores["mAP@0.5"]}

    def report_class_names(self, given: list[str] | None) -> list[str]:
        """The label map's names (`given` is not used: the ids in the records decide the names)."""
        return self.class_names

    @staticmethod
    def report(scores: dict, samples: list, loss_history: list) -> str:
        """The HTML report: AP table, loss curve, true boxes and detections on `samples`."""
        from trainer import report

        return report.detection_report(scores, samples, loss_history, scores["class_names"])


TASKS = {"segmentation": SegmentationTask, "detection": DetectionTask}


def make_task(config: config_lib.TrainConfig):
    return TASKS[config.task](config)


def restore(model_dir: str):
    """The task of the model `fullres train` left in `model_dir`, with the class names it was trained with.

    Returns:
        (config, task): the `TrainConfig` read from `train_config.json`, and its task.
    """
    path = os.path.join(model_dir, "train_config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir} has no train_config.json; pass the output directory of `fullres train`.")
    with open(path) as file:
        config = config_lib.from_dict(json.load(file))
    task = make_task(config)
    info_path = os.path.join(model_dir, "model_info.json")
    if os.path.exists(info_path):  # the names the model was trained with, wherever its training data is now
        with open(info_path) as file:
            names = json.load(file).get("class_names")
        if names:
            task.class_names = names
    return config, task


def load_weights(task, model_dir: str):
    """The model of `task`, rebuilt from its config and given the trained weights in `model_dir/model.keras`.

    Rebuilt rather than loaded whole: KerasHub's backbones inside the detector do
    not survive `keras.saving.load_model`, and a rebuilt model is the one the
    trainer compiled. Build it inside a distribution's scope to place it.
    """
    model = task.build_model()
    model.load_weights(os.path.join(model_dir, "model.keras"))
    return model
