"""Deep supervision, nnU-Net's: the decoder's lower resolutions predict too, and their losses are weighted in.

A UNet's decoder produces one feature map per resolution on its way up; with
deep supervision each of them (but the full-resolution one, which gives the
logits anyway, and the one nnU-Net weights 0) gets a 1×1 convolution to class
logits, and the training loss adds their losses (`losses.deep_supervision`) on
labels downsampled on the device. Inference sees only the full-resolution
logits: `DeepSupervision` returns the rest only when called with `training=True`.

The weights are nnU-Net's (`nnUNetTrainer._build_loss`, nnunetv2 2.x): output i
(0 = full resolution, then 1/2, 1/4, ...) weighs 1 / 2^i, the lowest-resolution
decoder output weighs 0, and the weights are normalized to sum 1. So a decoder
with outputs at 1, 1/2 and 1/4 trains with weights 2/3 and 1/3 on the first two.
"""

from __future__ import annotations

import keras


def decoder_weights(num_outputs: int) -> tuple[float, ...]:
    """nnU-Net's loss weight of each of `num_outputs` decoder outputs, full resolution first.

    Example:
        >>> decoder_weights(3)
        (0.6666666666666666, 0.3333333333333333, 0.0)
        >>> decoder_weights(5)[:2]
        (0.5333333333333333, 0.26666666666666666)
    """
    if num_outputs < 1:
        raise ValueError(f"a decoder has at least one output, got {num_outputs}.")
    weights = [1.0 / 2**i for i in range(num_outputs)]
    if num_outputs > 1:
        weights[-1] = 0.0  # nnU-Net: "we don't use the lowest 2 outputs" (the bottleneck has none; this is the other)
    total = sum(weights)
    return tuple(w / total for w in weights)


def supervised_outputs(num_outputs: int) -> tuple[int, ...]:
    """Indices of the decoder outputs with a weight above 0: the ones a model builds heads for (0 is the logits)."""
    return tuple(i for i, w in enumerate(decoder_weights(num_outputs)) if w > 0)


@keras.saving.register_keras_serializable(package="fullres")
class DeepSupervision(keras.Model):
    """A network with one output per supervised resolution that, outside training, returns only the first.

    `network` maps images to `[logits (full resolution), logits at 1/2, 1/4, ...]`.
    Training (`training=True`) gets the list; evaluation, prediction and the
    exported SavedModel get the full-resolution logits alone, as from a model
    without deep supervision (XLA then drops the unused heads).

    Example:
        >>> import numpy as np
        >>> inputs = keras.Input((4, 4, 1))
        >>> network = keras.Model(inputs, [keras.layers.Conv2D(2, 1)(inputs), keras.layers.Conv2D(2, 2, strides=2)(inputs)])
        >>> model = DeepSupervision(network)
        >>> tuple(model(np.zeros((1, 4, 4, 1), "float32")).shape)
        (1, 4, 4, 2)
        >>> [tuple(o.shape) for o in model(np.zeros((1, 4, 4, 1), "float32"), training=True)]
        [(1, 4, 4, 2), (1, 2, 2, 2)]
    """

    def __init__(self, network: keras.Model, **kwargs):
        super().__init__(name=kwargs.pop("name", network.name), **kwargs)
        self.network = network
        self.built = True  # the functional network inside is built; Keras's stateless_call asks

    def call(self, images, training=False):
        outputs = self.network(images, training=training)
        return list(outputs) if training else outputs[0]

    def compute_output_shape(self, input_shape):
        return self.network.compute_output_shape(input_shape)[0]

    def get_config(self):
        return {"name": self.name, "network": keras.saving.serialize_keras_object(self.network)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(keras.saving.deserialize_keras_object(config.pop("network")), **config)
