"""`tf.train.Example` messages without importing TensorFlow.

Beam workers only need to *write* Examples, and importing TensorFlow costs
about 8 s per process here (it brings Keras and JAX with it). The Example
messages are plain protobuf, so they are declared here from a descriptor with
the same field numbers and types as TensorFlow's `example.proto` and
`feature.proto`; the bytes they serialize parse with `tf.io.parse_single_example`
and `tf.train.Example.FromString` (tested). They live in a private descriptor
pool, so they never clash with TensorFlow's own registration when both are loaded.
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FIELD = descriptor_pb2.FieldDescriptorProto


def _message(file, name, fields, nested=()):
    message = file.message_type.add(name=name)
    for nested_message in nested:
        message.nested_type.append(nested_message)
    for field in fields:
        message.field.append(field)
    return message


def _field(name, number, field_type, label=_FIELD.LABEL_OPTIONAL, type_name=None, packed=False, oneof=None):
    field = _FIELD(name=name, number=number, type=field_type, label=label)
    if type_name:
        field.type_name = type_name
    if packed:
        field.options.packed = True
    if oneof is not None:
        field.oneof_index = oneof
    return field


@functools.cache
def _example_class():
    file = descriptor_pb2.FileDescriptorProto(name="fullres/example.proto", package="fullres", syntax="proto3")
    repeated = _FIELD.LABEL_REPEATED
    _message(file, "BytesList", [_field("value", 1, _FIELD.TYPE_BYTES, repeated)])
    _message(file, "FloatList", [_field("value", 1, _FIELD.TYPE_FLOAT, repeated, packed=True)])
    _message(file, "Int64List", [_field("value", 1, _FIELD.TYPE_INT64, repeated, packed=True)])
    feature = _message(file, "Feature", [
        _field("bytes_list", 1, _FIELD.TYPE_MESSAGE, type_name=".fullres.BytesList", oneof=0),
        _field("float_list", 2, _FIELD.TYPE_MESSAGE, type_name=".fullres.FloatList", oneof=0),
        _field("int64_list", 3, _FIELD.TYPE_MESSAGE, type_name=".fullres.Int64List", oneof=0),
    ])
    feature.oneof_decl.add(name="kind")
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry", field=[
        _field("key", 1, _FIELD.TYPE_STRING),
        _field("value", 2, _FIELD.TYPE_MESSAGE, type_name=".fullres.Feature"),
    ])
    entry.options.map_entry = True
    _message(file, "Features", [_field("feature", 1, _FIELD.TYPE_MESSAGE, repeated, ".fullres.Features.FeatureEntry")],
             nested=[entry])
    _message(file, "Example", [_field("features", 1, _FIELD.TYPE_MESSAGE, type_name=".fullres.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("fullres.Example"))


def serialize_example(features: dict[str, bytes | list]) -> bytes:
    """Serializes `{key: value}` as a `tf.train.Example`.

    Each value is wrapped in `BytesValues`, `FloatValues` or `IntValues`, which
    decide the feature's list kind (as `tf.train.Feature` does).
    """
    example = _example_class()()
    feature_map = example.features.feature
    for key, value in features.items():
        feature = feature_map[key]
        if isinstance(value, BytesValues):
            feature.bytes_list.value.extend(value.values)
        elif isinstance(value, FloatValues):
            feature.float_list.value.extend(value.values)
        elif isinstance(value, IntValues):
            feature.int64_list.value.extend(value.values)
        else:
            raise TypeError(f"feature {key!r}: wrap values in BytesValues, FloatValues or IntValues, got {type(value)}")
    return example.SerializeToString()


class BytesValues:
    """A bytes-list feature."""

    def __init__(self, values):
        self.values = [values] if isinstance(values, bytes) else list(values)


class FloatValues:
    """A float-list feature."""

    def __init__(self, values):
        self.values = [float(v) for v in values]


class IntValues:
    """An int64-list feature."""

    def __init__(self, values):
        self.values = [int(v) for v in values]
