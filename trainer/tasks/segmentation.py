"""Segmentation: a UNet (or the user's own network) on CT records; labels are class maps laid out like the images;
scored with per-class Dice.

Labels are split or whole within a replica, as `label_partition_dims` says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import numpy as np

from preprocessing.records import data_set, dataset_files, tfrecord_schema
from trainer import config as config_lib
from trainer.data import augment, ct_input
from trainer.engine import inference, placement
from trainer.models import losses, unet, user_model
from trainer.parallel import distributed, partitioning
from trainer.tasks import metrics, report


class SegmentationTask:
    """UNet on CT volumes: Dice + cross-entropy, per-class Dice."""

    name = "segmentation"
    class_names: list[str] | None = None  # the report's names come from --class-names or the run's model_info.json

    def __init__(self, config: config_lib.TrainConfig):
        self.config = config

    def check_data(self, value: str, flag: str, training: bool) -> None:
        """Refuses records a UNet cannot learn from or be scored on: detection records, unlabelled ones (training),
        labels beyond the model's classes (training), no recorded preprocessing (training), volumes of mixed shapes.
        """
        data = data_set.resolve(value, flag)
        if data.kind != tfrecord_schema.CT_RECORDS:
            raise ValueError(f"{flag} {value} holds {data.kind} (fullres preprocess images), not CT volumes; train "
                             "them with --task detection, or pass the records of fullres preprocess ct.")
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
                    f"{flag} {value} holds no labelled voxels ({data.summary_path} lists {listed}: an unlabelled "
                    "conversion), so the model would learn to predict background everywhere; convert the scans "
                    "again with --labels naming their label maps.")
        shapes = data_set.ct_shapes(data)
        if len(shapes) > 1:
            first, other = ("x".join(map(str, shape)) for shape in shapes[:2])
            raise ValueError(
                f"{flag} {value} holds volumes of different shapes ({first} and {other}, D x H x W), which cannot be "
                f"batched for one partitioned step; preprocess with --shape D,H,W (for example --shape "
                f"{','.join(str(max(sizes)) for sizes in zip(*shapes))}) so that every volume has one shape.")

    def example_shape(self) -> tuple[int, ...]:
        """(D, H, W, 1) (or (H, W, 1)) of the training records."""
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
        return dataset_files.read_preprocessing(self.config.train_data)

    def data_modality(self) -> dict | None:
        """What the training scans turned out to be (summary.json's `data_modality`): predict checks new scans."""
        return dataset_files.read_data_modality(self.config.train_data)

    def build_model(self):
        """fullres's UNet, or the user's network (`--model FILE.py:FUNCTION`: `user_model.build` checks it)."""
        if isinstance(self.config.model, user_model.UserModelConfig):
            return user_model.build(self.config.model, dtype=self.config.dtype_policy, remat=self.config.remat)
        return unet.build_unet(self.config.model, dtype=self.config.dtype_policy, remat=self.config.remat)

    def loss(self, logits, labels):
        return losses.dice_cross_entropy(logits, labels)

    def label_sharding(self, distribution: partitioning.SpatialParallel, image_ndim: int):
        return distribution.get_label_layout((0,) * (image_ndim - 1)).backend_layout

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

    def label_spec(self, image_shape: tuple[int, ...], distribution: partitioning.SpatialParallel):
        """The labels of a batch of `image_shape` as the train step receives them, shapes only: (B, D, H, W) int32."""
        return jax.ShapeDtypeStruct(image_shape[:-1], np.int32,
                                    sharding=self.label_sharding(distribution, len(image_shape)))

    def place_labels(self, distribution: partitioning.SpatialParallel, labels: np.ndarray, rows=None):
        """Labels of the global batch rows `rows` (all by default) onto the mesh."""
        sharding = self.label_sharding(distribution, labels.ndim + 1)
        return placement.global_array(sharding, labels, self.config.batch_size, rows)

    def batches(self, start_step: int, rows=None, log: Callable[[str], None] = print
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(images, labels) for every step from `start_step` on, augmented as an uninterrupted run would be.

        Args:
            rows: the rows of every global batch this process reads (`placement.process_rows`); None: all.
        """
        config = self.config
        data = ct_input.ct_dataset(
            config.train_data, config.batch_size, shuffle=True, repeat=True, seed=config.seed,
            skip_examples=start_step * config.batch_size, drop_remainder=True, rows=rows,
        )
        for step_number, batch in enumerate(data.as_numpy_iterator(), start_step):
            images, labels = batch["image"], batch["label"]
            if config.augment:
                images, labels = augment.random_flips(images, labels, config.seed, step_number, rows)
            yield images, labels

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json: nothing (volumes are cropped at preprocessing, and say so)."""
        return {}

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """Per-class Dice on `pattern` (default: the config's eval data); the first `keep` cases go to `samples`."""
        config = self.config
        scores = evaluate_segmentation(
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
        names = list(given or dataset_files.segmentation_class_names(num_classes))
        if len(names) != num_classes:
            raise ValueError(f"{len(names)} class names given for a model of {num_classes} classes; give one name per "
                             "class, background first.")
        return names

    @staticmethod
    def report(scores: dict, samples: list, loss_history: list) -> str:
        """The HTML report: Dice table, loss curve, true and predicted label maps of `samples`."""
        return report.segmentation_report(scores, samples, loss_history, scores["class_names"])


def evaluate_segmentation(
    model,
    state: placement.TrainState,
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
        images = inference.pad_batch(images, batch_size)  # (B, D, H, W, 1)
        if predict is None:
            predict = distributed.RunTogether(
                inference.make_forward(model, distribution, state, images.ndim, "class_ids"), "evaluation")
        predictions = placement.to_host(predict(state, placement.place_batch(distribution, images)))[:real]
        dice.update(predictions, labels)
        if samples is not None:
            for index in range(min(real, keep - len(samples))):
                samples.append({"case_id": batch["case_id"][index].decode(), "image": batch["image"][index],
                                "label": labels[index], "prediction": predictions[index]})
        cases += real
    return {"dice_per_class": dice.per_class(), "dice_mean": dice.foreground_mean(), "cases": cases}
