"""What a user's network takes and returns, said in words for `user_model.check`'s refusals.

A network built for 3-channel inputs meeting 1-channel data, or one returning a dict, broke the contract
in ways its sentences misnamed ("change its input size", "returns 1 outputs"); these name what is there.
"""

from __future__ import annotations


def channels_problem(model, in_channels: int) -> str | None:
    """Why the network's declared input channels do not take data of `in_channels`, or None (undeclared: any).

    >>> import keras
    >>> inputs = keras.Input((None, None, None, 3))
    >>> print(channels_problem(keras.Model(inputs, keras.layers.Conv3D(2, 1)(inputs)), 1))
    the network takes 3-channel inputs (its keras.Input declares 3 channels) but the data have 1 channel (model.in_channels=1); build its input with the in_channels its function is given (keras.Input((..., in_channels))), or train on 3-channel data
    """
    declared = getattr(model, "inputs", None)
    if not declared or len(declared) != 1 or declared[0].shape[-1] in (None, in_channels):
        return None
    channels = int(declared[0].shape[-1])
    return (f"the network takes {channels}-channel inputs (its keras.Input declares {channels} channels) but the data "
            f"have {in_channels} channel{'' if in_channels == 1 else 's'} (model.in_channels={in_channels}); build its "
            "input with the in_channels its function is given (keras.Input((..., in_channels))), or train on "
            f"{channels}-channel data")


def outputs(returned) -> str:
    """What a network returns instead of one tensor, in words.

    >>> outputs({"logits": 1}), outputs([1, 2]), outputs((1,))
    ("a dict (keys 'logits')", 'a list of 2 outputs', 'a tuple of 1 output')
    """
    if isinstance(returned, dict):
        return f"a dict (keys {', '.join(repr(key) for key in returned)})"
    if isinstance(returned, (list, tuple)):
        return f"a {type(returned).__name__} of {len(returned)} output{'' if len(returned) == 1 else 's'}"
    return f"a {type(returned).__name__}"
