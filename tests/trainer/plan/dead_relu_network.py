"""A user's network (`--model tests/trainer/plan/dead_relu_network.py:build`) whose one ReLU is inactive for every
input the receptive-field probe draws: its convolution's bias, -100, outweighs any response to inputs of unit
spread. It stands for a draw of weights that switches off every path to the centre voxel (a narrow UNet does so
along a whole axis in some initializations). Two 3-wide convolutions: each output voxel sees 5 along every axis."""

import keras


def build(num_classes=3, in_channels=1):
    inputs = keras.Input((None, None, None, in_channels))
    x = keras.layers.Conv3D(4, 3, padding="same", bias_initializer=keras.initializers.Constant(-100.0))(inputs)
    x = keras.layers.ReLU()(x)
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 3, padding="same")(x))
