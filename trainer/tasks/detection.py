"""Detection: a RetinaNet on TF Object Detection API records, scored with COCO mAP after decoding and NMS.

Labels are anchor targets, one map per pyramid level, computed on the host and
kept whole within a replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from preprocessing.records import data_set, dataset_files, tfrecord_schema
from trainer import config as config_lib
from trainer.data import batches as batches_lib, ct_input
from trainer.engine import inference, placement
from trainer.models import retinanet
from trainer.parallel import device_mesh, distributed, partitioning
from trainer.tasks import detection_eval, report


class DetectionTask:
    """RetinaNet on images with boxes: focal + Huber loss, COCO mAP."""

    name = "detection"
    # Evaluation keeps every ground-truth box (training keeps `max_boxes`): a cut-off box would raise the mAP.
    EVAL_MAX_BOXES = 1000

    def __init__(self, config: config_lib.TrainConfig):
        self.config = config
        label_map = dataset_files.read_label_map(config.train_data) if config.train_data else None  # none when only planning
        if label_map and max(dataset_files.foreground(label_map).values()) > config.model.num_classes:
            raise ValueError(
                f"the label map beside {config.train_data} has class ids up to {max(dataset_files.foreground(label_map).values())} but the model "
                f"predicts {config.model.num_classes} classes; set num_classes to {max(dataset_files.foreground(label_map).values())}."
            )
        self.class_names = dataset_files.class_names(label_map, config.model.num_classes)
        if config.eval_data:
            dataset_files.check_label_maps_agree(config.train_data, config.eval_data)
        self.boxes_dropped_max_boxes = 0  # training boxes beyond max_boxes, in the batches handed out so far
        self.eval_boxes_dropped = 0  # ground-truth boxes beyond EVAL_MAX_BOXES, in the last evaluation

    def check_data(self, value: str, flag: str, training: bool) -> None:
        """Refuses records a RetinaNet cannot use: CT volumes, or data sets that differ (`data_set.resolve`)."""
        data = data_set.resolve(value, flag)
        if data.kind != tfrecord_schema.DETECTION_RECORDS:
            raise ValueError(f"{flag} {value} holds {data.kind} (fullres preprocess ct), not images with boxes; train "
                             "them with --task segmentation, or pass the records of fullres preprocess images.")

    def num_examples(self) -> int:
        return ct_input.count_examples(self.config.train_data)

    def example_shape(self) -> tuple[int, ...]:
        ct_input.list_files(self.config.train_data)  # a clear error when nothing matches
        return (*self.config.image_size, 3)

    def preprocessing(self) -> dict | None:
        """Images are resized by the input pipeline, not preprocessed per scan: nothing for predict to repeat."""
        return None

    def data_modality(self) -> dict | None:
        """Images carry no modality to check."""
        return None

    def build_model(self):
        if self.config.remat:
            raise ValueError("remat is implemented for the UNet only; train the detector without --remat.")
        return retinanet.build_retinanet(self.config.model, dtype=self.config.dtype_policy)

    def loss(self, outputs, targets):
        return retinanet.detection_loss(outputs, targets, self.config.model)

    def batch_metrics(self, outputs, targets) -> dict:
        """None besides the loss: the plateau warning is segmentation's (`engine.plateau`)."""
        return {}

    def planned_example_shape(self, spatial_size: tuple[int, ...] | None) -> tuple[int, ...]:
        """(H, W, 3) of one image for `fullres plan`: the config's canvas (`image_size`; `spatial_size` must match)."""
        if spatial_size is not None and len(spatial_size) != 2:
            raise ValueError(f"--image-size needs 2 sizes (height,width) for RetinaNet, got {list(spatial_size)}; "
                             f"write it like --image-size {','.join(map(str, self.config.image_size))}.")
        if spatial_size is not None and tuple(spatial_size) != self.config.image_size:
            raise ValueError(f"--image-size {list(spatial_size)} differs from the detection canvas "
                             f"{list(self.config.image_size)}; set image_size={','.join(map(str, spatial_size))}.")
        return (*self.config.image_size, 3)

    def label_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel) -> dict:
        """The anchor targets of a batch of `image_shape`, shapes only: one boxes and one classes map per level."""
        model, shardings, specs = self.config.model, self.label_sharding(distribution, len(image_shape)), {}
        for number, level in zip(range(model.min_level, model.max_level + 1), model.levels):
            grid = (image_shape[0], image_shape[1] // 2**number, image_shape[2] // 2**number)
            anchors = model.anchors_per_position
            specs[f"boxes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors * retinanet.BOX_CODE), np.float32,
                                                           sharding=shardings[f"boxes/{level}"])
            specs[f"classes/{level}"] = jax.ShapeDtypeStruct((*grid, anchors), np.int32,
                                                             sharding=shardings[f"classes/{level}"])
        return specs

    def label_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int):
        """Targets are whole within a replica (split over replicas along the batch only), one per level."""
        whole = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec(partitioning.REPLICA_AXIS))
        return {f"{kind}/{level}": whole for level in self.config.model.levels for kind in ("boxes", "classes")}

    def input_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int):
        """Images split as the distribution says (float32: the input pipeline resizes and augments them)."""
        return distribution.get_data_layout((0,) * image_ndim).backend_layout

    def input_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel):
        """The images of a batch of `image_shape` as the train step receives them, shapes only."""
        return jax.ShapeDtypeStruct(image_shape, np.float32, sharding=self.input_sharding(distribution, len(image_shape)))

    @staticmethod
    def prepare(inputs, labels, step, distribution=None):
        """Nothing to do on the device: the images come as float32, augmented by the input pipeline."""
        return inputs, labels

    def place_labels(self, distribution: device_mesh.SpatialParallel, targets: dict, rows=None):
        """Anchor targets of the global batch rows `rows` (all by default) onto the mesh."""
        shardings = self.label_sharding(distribution, 4)
        return {key: placement.global_array(shardings[key], value, self.config.batch_size, rows)
                for key, value in targets.items()}

    def place(self, distribution: device_mesh.SpatialParallel, batch: batches_lib.HostBatch,
              share: batches_lib.Share | None = None):
        """A batch (the rows `share` names, None: all) onto the mesh: (images, anchor targets). Images are read
        whole: a process holding part of an image's height reads all of it."""
        rows = None if share is None else list(share.rows)
        images = placement.global_array(self.input_sharding(distribution, batch.inputs.ndim), batch.inputs,
                                        self.config.batch_size, rows)
        return images, self.place_labels(distribution, batch.labels, rows)

    def batches(self, start_step: int, share: batches_lib.Share | None = None, log: Callable[[str], None] = print
                ) -> Iterator[batches_lib.HostBatch]:
        """(images, anchor targets) for every step from `start_step` on: the rows of `share` (None: all).

        Boxes beyond `max_boxes` are counted (`input_counts`; in this process's rows) and logged:
        on the first step that drops any, then once per `log_every` steps that drop more.
        """
        config = self.config
        from trainer.data import detection_input  # TensorFlow: only where detection data is read

        data = detection_input.detection_dataset(
            config.train_data, config.batch_size, config.image_size, max_boxes=config.max_boxes,
            augment=config.augment, shuffle=True, repeat=True, seed=config.seed,
            skip_examples=start_step * config.batch_size, drop_remainder=True,
            rows=None if share is None else list(share.rows),
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
            # Crowd regions and difficult objects are no training target (the TF OD API leaves crowd boxes out too).
            trained = np.where(batch["ignore"] > 0, -1, batch["classes"])
            targets = retinanet.encode_targets(batch["boxes"], trained, config.image_size, config.model)
            yield batches_lib.HostBatch(batch["image"], targets, [i.decode() for i in batch["source_id"]])

    def receptive_field(self, model, size=None) -> None:
        """None: RetinaNet's outputs are box maps at several strides, not one answer per pixel."""
        return None

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json."""
        return {"boxes_dropped_max_boxes": self.boxes_dropped_max_boxes}

    def predict(self, model, state, distribution, pattern: str, max_detections: int = 100):
        """Detections and ground truth of every image matching `pattern`, at full resolution, partitioned as in training.

        Yields per image `(image, truth {"boxes", "classes"}, found {"boxes", "scores", "classes"}, source_id)`,
        boxes in "yxyx" pixels of the canvas, classes 0-based.
        """
        config = self.config
        forward = distributed.RunTogether(inference.make_forward(model, distribution, state, 4, "raw"),
                                          "detection forward")
        from trainer.data import detection_input  # TensorFlow: only where detection data is read

        data = detection_input.detection_dataset(pattern, config.batch_size, config.image_size,
                                                 max_boxes=self.EVAL_MAX_BOXES)
        self.eval_boxes_dropped = 0
        for batch in data.as_numpy_iterator():
            self.eval_boxes_dropped += int(batch["boxes_dropped"].sum())
            real = batch["image"].shape[0]
            images = inference.pad_batch(batch["image"], config.batch_size)
            outputs = forward(state, placement.place_batch(distribution, images))
            outputs = {key: placement.to_host(value)[:real] for key, value in outputs.items()}
            found = detection_eval.decode_detections(outputs, config.image_size, config.model,
                                                     max_detections=max_detections)
            for index in range(real):
                count = int(found["num_detections"][index])
                keep = batch["classes"][index] >= 0
                truth = {"boxes": batch["boxes"][index][keep], "classes": batch["classes"][index][keep],
                         "ignore": batch["ignore"][index][keep] > 0}
                detections = {"boxes": found["boxes"][index][:count], "scores": found["confidence"][index][:count],
                              "classes": found["classes"][index][:count]}
                yield batch["image"][index], truth, detections, batch["source_id"][index].decode()

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """COCO AP on `pattern` (default: the config's eval data); the first `keep` images go to `samples`."""
        pattern = pattern or self.config.eval_data
        dataset_files.check_label_maps_agree(self.config.train_data, pattern)
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
        return report.detection_report(scores, samples, loss_history, scores["class_names"])
