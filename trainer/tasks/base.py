"""The contract every task keeps: what the training loop, evaluation, planning and export ask of it.

A third task (say, classification) is one new module with a class that has
these members, and one entry in `trainer.tasks.TASKS`; nothing else branches
on the task's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from trainer import config as config_lib
from trainer.data import batches
from trainer.parallel import device_mesh


@runtime_checkable
class Task(Protocol):
    """What differs between segmentation and detection, as methods.

    Example:
        >>> from trainer import presets
        >>> from trainer.tasks import registry
        >>> task = registry.make_task(presets.smoke())
        >>> isinstance(task, Task), task.name, task.planned_example_shape((32, 32, 32))
        (True, 'segmentation', (32, 32, 32, 1))
    """

    name: str  # "segmentation", "detection": recorded in model_info.json and metrics.json
    config: config_lib.TrainConfig
    class_names: list[str] | None  # one name per predicted class; None where the task names none itself

    def check_data(self, value: str, flag: str, training: bool) -> None:
        """Refuses, in one sentence, records this task cannot use (`value` as given to `flag`): called before a
        run writes anything. `training`: the data the model learns from (held-out data is checked less)."""

    def num_examples(self) -> int:
        """How many training examples the training data holds."""

    def example_shape(self) -> tuple[int, ...]:
        """The shape of one training example, read from the training data (checked against the model)."""

    def planned_example_shape(self, spatial_size: tuple[int, ...] | None) -> tuple[int, ...]:
        """The shape of one example of `spatial_size`, for `fullres plan` (no data read)."""

    def preprocessing(self) -> dict | None:
        """How the training scans were prepared, for predict to repeat; None where nothing is to repeat."""

    def data_modality(self) -> dict | None:
        """What the training scans turned out to be (modality, intensity range), for predict to check new scans
        against; None where nothing is recorded."""

    def build_model(self):
        """The Keras model (built inside the caller's distribution scope)."""

    def loss(self, outputs, labels):
        """The scalar training loss of a batch."""

    def batch_metrics(self, outputs, labels) -> dict:
        """What the training step reports of the batch it trained on besides the loss (segmentation: each class's
        Dice, which the plateau warning reads), on the device; {} for none."""

    def label_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int):
        """How the labels of a batch lie on the mesh (a sharding, or a dict of them)."""

    def label_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel):
        """The labels of a batch of `image_shape`, shapes only, for compiling ahead of time."""

    def input_sharding(self, distribution: device_mesh.SpatialParallel, image_ndim: int):
        """How the step's inputs lie on the mesh (a sharding, or a dict of them)."""

    def input_spec(self, image_shape: tuple[int, ...], distribution: device_mesh.SpatialParallel):
        """The step's inputs for a batch of `image_shape`, shapes and (compact) dtypes only, for compiling."""

    def prepare(self, inputs, labels, step, distribution=None):
        """On the device, inside the step: `(images, labels)` the model and loss take, from the compact inputs
        and labels the host sent, augmented by draws of (seed, `step`, row) on the batch as `distribution`
        (the step's `device_mesh.SpatialParallel`) lays it out."""

    def place(self, distribution: device_mesh.SpatialParallel, batch: batches.HostBatch,
              share: batches.Share | None = None):
        """This process's share of a host batch onto the mesh: (inputs, labels)."""

    def batches(self, start_step: int, share: batches.Share | None = None,
                log: Callable[[str], None] = print) -> Iterator[batches.HostBatch]:
        """This process's share of the batch of every step from `start_step` on; the loop releases each."""

    def receptive_field(self, model, size: tuple[int, ...] | None = None):
        """How far one output of `model` sees, measured (`models.receptive_field`), against `size` (default: the
        training data's volumes); None where the outputs are not per voxel."""

    def input_counts(self) -> dict:
        """What the input left out, for metrics.json."""

    def evaluate(self, model, state, distribution, log: Callable[[str], None], pattern: str | None = None,
                 samples: list | None = None, keep: int = 0) -> dict:
        """Scores on `pattern` through the shared forward pass; the first `keep` examples go to `samples`."""

    def headline(self, scores: dict) -> dict:
        """The scalars worth a TensorBoard curve."""

    def report_class_names(self, given: list[str] | None) -> list[str]:
        """The class names a report shows."""

    def report(self, scores: dict, samples: list, loss_history: list) -> str:
        """The HTML report."""
