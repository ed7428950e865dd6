"""Where each feature of a serialized `tf.train.Example` lies, found without reading its large values.

A CT record holds a volume as many byte strings (depth slabs, `tfrecord_schema`).
A process that needs some of the slabs asks for the record's layout: this
module walks the protobuf wire format of the record through small reads, keeps
the small values (shape, spacing, checksums, ids) and notes only the offset and
length of each large byte string, which the caller then reads straight into its
buffers. The protobuf library cannot do this: it parses a message whole.

The wire format, as `example_proto` writes it and TensorFlow does:
Example{1: Features{1: map<string, Feature>}}, Feature{1: BytesList | 2: FloatList | 3: Int64List},
each list's values in field 1 (packed for numbers, one length-delimited field per bytes value).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import numpy as np

SMALL = 4096  # bytes values up to this size are read; larger ones are only located
_WINDOW = 4096  # bytes read at a time while walking


class ExampleDamaged(ValueError):
    """The bytes are not a well-formed `tf.train.Example`."""


@dataclasses.dataclass(frozen=True)
class BytesValue:
    """One value of a bytes feature: where it lies in the record, and its bytes if it is small."""

    offset: int
    length: int
    data: bytes | None  # None for a value over `SMALL` bytes: read it at `offset`


class _Reader:
    """Small reads of a record through a window, so that a walk costs few reads."""

    def __init__(self, read: Callable[[int, int], bytes], size: int):
        self._read, self.size = read, size
        self._start, self._data = 0, b""

    def bytes(self, offset: int, length: int) -> bytes:
        end = self._start + len(self._data)
        if self._start <= offset <= end < offset + length:
            # Past the window's end: keep its tail and read on from the end, so the walk's reads only move forward
            # (a GZIP record is then inflated once: RecordFile reads it as a stream).
            more = self._read(end, min(max(offset + length - end, _WINDOW), self.size - end))
            self._data, self._start = self._data[offset - self._start:] + more, offset
        elif offset < self._start or offset + length > end:
            self._start = offset
            self._data = self._read(offset, min(max(length, _WINDOW), self.size - offset))
        data = self._data[offset - self._start: offset - self._start + length]
        if len(data) < length:
            raise ExampleDamaged(f"a field runs past the record's end ({offset + length} > {self.size} bytes)")
        return data

    def varint(self, offset: int) -> tuple[int, int]:
        """(value, offset after it)."""
        value, shift = 0, 0
        while True:
            byte = self.bytes(offset, 1)[0]
            value |= (byte & 0x7F) << shift
            offset += 1
            if not byte & 0x80:
                return value, offset
            shift += 7
            if shift > 63:
                raise ExampleDamaged("a varint longer than 10 bytes")


def _fields(reader: _Reader, start: int, end: int):
    """(field number, wire type, value) of each field in [start, end): the value is (offset, length) of a
    length-delimited field, the integer of a varint, and the raw bytes of a fixed32/fixed64."""
    position = start
    while position < end:
        key, position = reader.varint(position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = reader.varint(position)
        elif wire == 2:
            length, position = reader.varint(position)
            value = (position, length)
            position += length
        elif wire == 5:
            value, position = reader.bytes(position, 4), position + 4
        elif wire == 1:
            value, position = reader.bytes(position, 8), position + 8
        else:
            raise ExampleDamaged(f"wire type {wire} at byte {position}")
        if position > end:
            raise ExampleDamaged(f"field {number} runs past its message (byte {position} of {end})")
        yield number, wire, value


def _varints(data: bytes) -> list[int]:
    values, value, shift = [], 0, 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            values.append(value - (1 << 64) if value >= 1 << 63 else value)  # int64: two's complement
            value, shift = 0, 0
    return values


def _feature(reader: _Reader, start: int, end: int):
    """A Feature's values: a list of `BytesValue`, or a numpy array of floats or int64s."""
    for number, wire, value in _fields(reader, start, end):
        if wire != 2 or number not in (1, 2, 3):
            continue
        list_start, list_length = value
        if number == 1:
            items = [item for _, item_wire, item in _fields(reader, list_start, list_start + list_length)
                     if item_wire == 2]  # (offset, length) of each value
            return [BytesValue(offset, length, reader.bytes(offset, length) if length <= SMALL else None)
                    for offset, length in items]
        numbers: list = []
        for _, item_wire, item in _fields(reader, list_start, list_start + list_length):
            if item_wire == 2:  # packed
                data = reader.bytes(*item)
                numbers += (list(struct.unpack(f"<{len(data) // 4}f", data)) if number == 2 else _varints(data))
            elif item_wire == 5:
                numbers.append(struct.unpack("<f", item)[0])
            elif item_wire == 0:
                numbers.append(item - (1 << 64) if item >= 1 << 63 else item)
        return np.array(numbers, np.float32 if number == 2 else np.int64)
    return []


def layout(read: Callable[[int, int], bytes], size: int) -> dict:
    """`{feature key: values}` of a serialized Example of `size` bytes that `read(offset, length)` returns parts of.

    Bytes features give a list of `BytesValue` (small ones read, large ones
    located), numeric features a numpy array.

    Example:
        >>> from preprocessing.records import example_proto
        >>> record = example_proto.serialize_example({"n": example_proto.IntValues([3, -1]),
        ...                                           "b": example_proto.BytesValues([b"x" * 5000, b"yz"])})
        >>> found = layout(lambda offset, length: record[offset:offset + length], len(record))
        >>> found["n"].tolist(), [(v.length, v.data) for v in found["b"]]
        ([3, -1], [(5000, None), (2, b'yz')])

    Raises:
        ExampleDamaged: the bytes are not an Example.
    """
    reader = _Reader(read, size)
    features = {}
    try:
        for number, wire, value in _fields(reader, 0, size):
            if number != 1 or wire != 2:
                continue
            features_start, features_length = value
            for entry_number, entry_wire, (entry_start, entry_length) in _fields(
                    reader, features_start, features_start + features_length):
                if entry_number != 1 or entry_wire != 2:
                    continue
                key, feature = None, None
                for part, part_wire, part_value in _fields(reader, entry_start, entry_start + entry_length):
                    if part == 1 and part_wire == 2:
                        key = reader.bytes(*part_value).decode()
                    elif part == 2 and part_wire == 2:
                        feature = part_value
                if key is not None:
                    features[key] = [] if feature is None else _feature(reader, feature[0], sum(feature))
    except (UnicodeDecodeError, IndexError, struct.error) as error:
        raise ExampleDamaged(f"malformed Example: {error}") from None
    return features
