"""Segmentation: a UNet (or the user's own network) on CT records; labels are class maps laid out like the images;
scored with per-class Dice.

Label maps are always split like the images (each device holds the labels of its own voxels), whatever
`label_partition_dims` says: a mask whole on every device of a replica would cost N times its share.
The host hands the step int16 images (with each row's scale) and uint8 labels; `prepare` makes them float32
and int32 on the device and augments them there (`trainer.augment`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import numpy as np

from preprocessing.records import data_set, dataset_files, tfrecord_schema
from trainer import config as config_lib
from trainer.augment import keys, recipe as augment_recipe
from trainer.data import batches as batches_lib, ct_input, patches
from trainer.data import ct_batches
from trainer.engine import inference, placement
from trainer.models import losses, receptive_field, unet, user_model
from trainer.parallel import device_mesh, partitioning
from trainer.tasks import report, segmentation_eval


class SegmentationTask:
    """UNet on CT volumes: Dice + cross-entropy, per-class Dice."""

    name = "segmentation"
    def __init__(self, config: config_lib.TrainConfig):
        self.config = config
        self._records: dict[str, ct_input.CtRecords] = {}
        # Named by the training data's label_map.json (`preprocess ct --classes`), recorded in model_info.json for the
        # report and the DICOM SEG's segment labels; None without one (then background, class_1, ...).
        label_map = dataset_files.read_label_map(config.train_data) if config.train_data else None
        self.class_names = ([dataset_files.BACKGROUND, *dataset_files.class_names(
            label_map, config.model.num_classes - 1)] if label_map and len(label_map) > 1 else None)

    def records(self, pattern: str | None = None) -> ct_input.CtRecords:
        """The records of `pattern` (default: the training data), indexed once per task."""
        pattern = pattern or self.config.train_data
        if pattern not in self._records:
            self._records[pattern] = ct_input.CtRecords(pattern)
        return self._records[pattern]

    def check_data(self, value: str, flag: str, training: bool) -> None:
        """Refuses records a UNet cannot learn from or be scored on: detection records, unlabelled ones (training),
        labels beyond the model's classes (training), no recorded preprocessing (training), volumes of mixed shapes.
        """
        data = data_set.resolve(value, flag)
        if data.kind == tfrecord_schema.OLD_CT_RECORDS:
            raise ValueError(f"{flag} {value} holds CT records of an earlier fullres (whole float32 volumes), which "
                             "this one does not read (it reads int16 depth slabs, a process only those its devices "
                             "hold); convert the scans again with fullres preprocess ct.")
        if data.kind == tfrecord_schema.DETECTION_RECORDS:
            raise ValueError(f"{flag} {value} holds {data.kind} (fullres preprocess images), not CT volumes; train "
                             "them with --task detection, or pass the records of fullres preprocess ct.")
        channels = 3 if data.kind == tfrecord_schema.VIDEO_RECORDS else 1  # video clips: RGB frames
        if channels != self.config.model.in_channels and not training:  # held-out data of another kind
            trained = tfrecord_schema.VIDEO_RECORDS if self.config.model.in_channels == 3 else tfrecord_schema.CT_RECORDS
            raise ValueError(f"{flag} {value} holds {data.kind} ({channels} channel(s)), another kind of data than "
                             f"the model's training data ({trained}, {self.config.model.in_channels} channel(s)); "
                             f"pass held-out {trained} converted as the training data were.")
        if channels != self.config.model.in_channels:
            raise ValueError(f"{flag} {value} holds {data.kind} of {channels} channel(s) but the model takes "
                             f"{self.config.model.in_channels}; pass --set model.in_channels={channels}"
                             f"{' (or --preset video)' if channels == 3 else ''}.")
        # What an unlabelled conversion is, and how to label it, in the words of its kind.
        video = data.kind == tfrecord_schema.VIDEO_RECORDS
        what = "clips of videos without masks" if video else "an unlabelled conversion"
        fix = ("convert the videos with their masks (fullres preprocess video with a PNG folder named like each "
               "video, Annotations/ or --labels)" if video else "convert the scans again with --labels naming their "
               "label maps")
        if not training and not [v for v in data.label_values if v > 0]:  # as training refuses them, below
            raise ValueError(f"{flag} {value} holds no labelled pixels ({data.summary_path} lists no label value "
                             f"above 0: {what}), so its Dice would score the model against background alone; {fix} "
                             "to score the model on them, or segment them with fullres predict.")
        if training:
            values, num_classes = data.label_values, self.config.model.num_classes
            if values and max(values) >= num_classes:
                raise ValueError(
                    f"--num-classes {num_classes} is too small for {value}: its summary.json lists label "
                    f"values {', '.join(map(str, values))}; pass --num-classes {max(values) + 1} or more."
                )
            if data.preprocessing is None:  # a conversion from before summaries recorded it (or no conversion)
                raise ValueError(
                    f"{flag} {value}: {data.summary_path} records no preprocessing (spacing, orientation, window), so "
                    "fullres predict could not prepare new scans as these were; convert the scans again with fullres "
                    "preprocess ct.")
            if not [v for v in values if v > 0]:
                listed = f"label values {', '.join(map(str, values))} only" if values else "no label values"
                raise ValueError(
                    f"{flag} {value} holds no labelled {'pixels' if video else 'voxels'} ({data.summary_path} lists "
                    f"{listed}: {what}), so the model would learn to predict background everywhere; {fix}.")
        shapes = data_set.ct_shapes(data)
        if len(shapes) > 1:
            first, other = ("x".join(map(str, shape)) for shape in shapes[:2])
            raise ValueError(
                f"{flag} {value} holds volumes of different shapes ({first} and {other}, D x H x W), which cannot be "
                f"batched for one partitioned step; preprocess with --shape D,H,W (for example --shape "
                f"{','.join(str(max(sizes)) for sizes in zip(*shapes))}) so that every volume has one shape.")

    def num_examples(self) -> int:
        return len(self.records())

    def example_shape(self) -> tuple[int, ...]:
        """(D, H, W, C) of one training example: the records' volumes (video: (T, H, W, 3) clips), or the patch cut
        from them (`patch_size`)."""
        shape = (*self.records().shape, self.records().channels)
        if len(shape) != self.config.model.spatial_dims + 1:
            raise ValueError(
                f"{self.config.train_data} holds {len(shape) - 1}-D images but the model is "
                f"{self.config.model.spatial_dims}D; set spatial_dims to match the data."
            )
        if self.config.patch_size is not None:
            patches.check_fits(self.config.patch_size, shape[:-1], self.config.train_data)
            return (*self.config.patch_size, shape[-1])
        return shape

    def preprocessing(self) -> dict | None:
        """How the training scans were prepared (summary.json's `preprocessing`): predict repeats it on new scans."""
        return dataset_files.read_preprocessing(self.config.train_data)

    def data_modality(self) -> dict | None:
        """What the training scans turned out to be (summary.json's `data_modality`): predict checks new scans."""
        return dataset_files.read_data_modality(self.config.train_data)

    def build_model(self):
        """fullres's UNet, or the user's network (`--model FILE.py:FUNCTION`: `user_model.build` checks it)."""
        if isinstance(self.config.model, user_model.UserModelConfig):
            return user_model.build(self.config.model, dtype=self.config.dtype_policy, remat=self.config.remat)
        return unet.build_unet(self.config.model, dtype=self.config.dtype_policy, remat=self.config.remat)

    def loss(self, outputs, labels):
        """Dice + cross-entropy; with deep supervision, nnU-Net's weighted sum over the supervised resolutions."""
        balance = losses.class_balance(self.config.class_balance, whole_volumes=self.config.patch_size is None)
        loss = functools.partial(losses.dice_cross_entropy, class_balance=balance)
        if isinstance(outputs, (list, tuple)):
            return losses.deep_supervision(outputs, labels, self.config.model.output_weights, loss)
        return loss(outputs, labels)

    def batch_metrics(self, outputs, labels) -> dict:
        """`{"class_dice": (C,)}`: each class's Dice on the batch just trained on (NaN where it is neither labelled
        nor predicted), from the full-resolution logits; `engine.plateau` reads it."""
        logits = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        return {"class_dice": losses.class_dice(logits, labels)}

    def label_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int):
        """Split like the images, without their channel axis (see the module docstring)."""
        image_layout = distribution.get_data_layout((0,) * image_ndim)
        return placement.sharding(distribution, image_layout.axes[:-1])

    def input_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int) -> dict:
        """The image (int16, video uint8) split as the distribution says; each row's scale over the replicas."""
        return {"image": distribution.get_data_layout((0,) * image_ndim).backend_layout,
                "scale": placement.sharding(distribution, (partitioning.REPLICA_AXIS,))}

    def input_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel) -> dict:
        """The inputs of a batch of `image_shape` as the train step receives them, shapes only."""
        shardings = self.input_sharding(distribution, len(image_shape))
        stored = self.records().stored if self.config.train_data else np.int16  # `fullres plan` reads no data
        return {"image": jax.ShapeDtypeStruct(image_shape, stored, sharding=shardings["image"]),
                "scale": jax.ShapeDtypeStruct(image_shape[:1], np.float32, sharding=shardings["scale"])}

    def prepare(self, inputs: dict, labels, step, distribution: device_mesh.SpatialParallel | None = None):
        """On the device: int16 (video: uint8) × scale -> float32 images, uint8 -> int32 labels, then the augmentation.

        `config.augmentation` (`trainer.augment.recipe.compose`), drawn per (seed, `step`, row), on the batch as
        `distribution` splits it (rotation and scaling move a split aside where they resample along it).
        """
        image = inputs["image"]
        scale = inputs["scale"].reshape((-1,) + (1,) * (image.ndim - 1))
        images = image.astype(jax.numpy.float32) * scale  # (B, D, H, W, 1), as tfrecord_schema.dequantize
        labels = labels.astype(jax.numpy.int32)
        if self.config.augment:
            image_sharding = label_sharding = None
            if distribution is not None:
                image_sharding = distribution.get_data_layout((0,) * image.ndim).backend_layout
                label_sharding = self.label_sharding(distribution, image.ndim)
            images, labels = augment_recipe.compose(
                self.config.augmentation, images, labels, keys.row_keys(self.config.seed, step, image.shape[0]),
                self.config.model.num_classes, image_sharding, label_sharding)
        return images, labels

    def planned_example_shape(self, spatial_size: tuple[int, ...] | None) -> tuple[int, ...]:
        """(D, H, W, C) of one example of `spatial_size` (default 256 a side), for `fullres plan` (no data read)."""
        spatial_size = spatial_size or (256,) * self.config.model.spatial_dims
        if len(spatial_size) != self.config.model.spatial_dims:
            dims = self.config.model.spatial_dims
            user = isinstance(self.config.model, user_model.UserModelConfig)
            name, other = ("network", f"--set model.spatial_dims={5 - dims}") if user else ("UNet",
                                                                                            f"--model unet{5 - dims}d")
            raise ValueError(f"--image-size needs {dims} sizes for a {dims}D {name}, got {list(spatial_size)}; write "
                             f"it like --image-size {','.join(['256'] * dims)} ({'D,H,W' if dims == 3 else 'H,W'}), "
                             f"or size a {5 - dims}D {name} with {other}.")
        return (*spatial_size, self.config.model.in_channels)

    def label_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel):
        """The labels of a batch of `image_shape` as the train step receives them, shapes only: (B, D, H, W) uint8."""
        return jax.ShapeDtypeStruct(image_shape[:-1], np.uint8,
                                    sharding=self.label_sharding(distribution, len(image_shape)))

    def place(self, distribution: device_mesh.SpatialParallel, batch: batches_lib.HostBatch,
              share: batches_lib.Share | None = None):
        """A batch (this process's share of it: `share`, None: all) onto the mesh: (inputs, labels)."""
        image = batch.inputs["image"]
        rows = None if share is None else list(share.rows)
        depth = None if share is None else share.depth
        full_depth = self.example_shape()[0] if depth is not None else None  # the volume's, or the patch's
        shardings = self.input_sharding(distribution, image.ndim)
        size = self.config.batch_size
        inputs = {"image": placement.global_array(shardings["image"], image, size, rows, depth, full_depth),
                  "scale": placement.global_array(shardings["scale"], batch.inputs["scale"], size, rows)}
        labels = placement.global_array(self.label_sharding(distribution, image.ndim), batch.labels, size, rows, depth,
                                        full_depth)
        return inputs, labels

    def batches(self, start_step: int, share: batches_lib.Share | None = None, log: Callable[[str], None] = print
                ) -> ct_batches.CtBatches:
        """This process's share of every step's batch from `start_step` on, in the run's order (`ct_input`).

        Args:
            share: the rows and depths this process reads (`placement.process_share`); None: all.
        """
        config = self.config
        if config.patch_size is not None:
            log(f"patches: random {'x'.join(map(str, config.patch_size))} crops of the "
                f"{'x'.join(map(str, self.records().shape))} volumes, one in {patches.FOREGROUND_EVERY} centred on a "
                "foreground voxel; predict and evaluation slide a window of that size (half overlap, Gaussian)")
        balance = losses.class_balance(config.class_balance, whole_volumes=config.patch_size is None)
        if balance:
            log(f"loss: soft Dice + cross-entropy weighing each class by its voxel count to the power -{balance:g} "
                f"(class_balance{'' if config.class_balance is not None else ', the whole-volume recipe'}: a small "
                "organ is otherwise lost on some seeds, docs/recipe.md)")
        return ct_batches.CtBatches(self.records(), config.batch_size, share, seed=config.seed, start_step=start_step,
                                  cache=config.input_cache, log=log, patch=config.patch_size)

    def receptive_field(self, model, size: tuple[int, ...] | None = None) -> receptive_field.ReceptiveField:
        """How far the centre output voxel of `model` sees along each axis of volumes of `size` (default: the
        training data's whole volumes, patches or not), measured (`models.receptive_field`)."""
        model_config = self.config.model
        multiples = inference.spatial_multiples((1,) * (model_config.spatial_dims + 2), model_config.downsampling_levels)
        field = receptive_field.measure(model, size or self.records().shape, multiples, model_config.in_channels)
        video = bool(self.config.train_data) and self.records().layout(0).kind == tfrecord_schema.VIDEO_RECORDS
        return dataclasses.replace(field, video=video)

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json: nothing (volumes are cropped at preprocessing, and say so)."""
        return {}

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """Per-class Dice on `pattern` (default: the config's eval data); the first `keep` cases go to `samples`."""
        config = self.config
        scores = segmentation_eval.evaluate_segmentation(
            model, state, distribution, pattern or config.eval_data, config.batch_size, config.model.num_classes,
            samples=samples, keep=keep, patch_size=config.patch_size,
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
        """One name per class, background first: `given`, or the run's (its training data's label map), or
        background, class_1, ...

        Raises:
            ValueError: `given` names another number of classes than the model predicts.
        """
        num_classes = self.config.model.num_classes
        names = list(given or self.class_names or dataset_files.segmentation_class_names(num_classes))
        if len(names) != num_classes:
            raise ValueError(f"{len(names)} class names given for a model of {num_classes} classes; give one name per "
                             "class, background first.")
        return names

    @staticmethod
    def report(scores: dict, samples: list, loss_history: list) -> str:
        """The HTML report: Dice table, loss curve, true and predicted label maps of `samples`."""
        return report.segmentation_report(scores, samples, loss_history, scores["class_names"])

