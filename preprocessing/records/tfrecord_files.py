"""Random access into TFRecord files: where each record lies, and any byte range of a record, read into a buffer.

`tf.data.TFRecordDataset` reads a file from its first record to its last and
hands each record over whole. Training a partitioned model needs less and
other: each process reads only the depth slabs its devices hold (a part of
each record), in an order that is a pure function of the seed (so a resumed
run, or one with the decoded cache on or off, reads exactly the same batches),
straight into buffers it reuses (fresh memory costs more than the copy on
small hosts). No library reads part of a TFRecord record, so this module does,
in the format's own terms:

    uint64 length | uint32 masked CRC-32C of length | data[length] | uint32 masked CRC-32C of data

`RecordFile.index` walks the headers once (each length's CRC is checked, so a
cut-short or damaged file is named, not read as zeros). GZIP files (`.gz`) are
inflated once to find their records, keeping a copy of the decompressor's state
at each record's start, so a record is later read from there rather than from
the top of the file. The data CRC covers a whole record; readers of parts
check their own (the CT schema keeps one CRC per slab).

Local files are read with `os.pread` (thread-safe on one descriptor, and
without the GIL); other paths (gs://) through TensorFlow's file system, one
handle per thread.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import zlib

import numpy as np

from preprocessing.records import file_system

_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_FOOTER = 4  # uint32 masked CRC of the data
_INFLATE_CHUNK = 1 << 20  # decompressed bytes taken at a time
# Compressed bytes fed at a time: zlib copies the input it has not consumed (`unconsumed_tail`) after every call that
# fills its output, so a large feed is copied over and over (1 MiB fed: a 128³ record inflated at ~40 MB/s).
_FEED = 1 << 16
_GZIP_WINDOW_BITS = 16 + zlib.MAX_WBITS  # TensorFlow's and Beam's GZIP TFRecords: one gzip stream


class RecordFileDamaged(ValueError):
    """A TFRecord file cut short or damaged; the message names the file, the record and what to do."""


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated right by 15 bits and offset, as in TensorFlow's `crc32c::Mask`."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _Source:
    """Positional reads of one file: `pread` locally, a TensorFlow file handle per thread elsewhere."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY) if file_system.is_local(path) else None
        self._handles = threading.local()
        if self._fd is not None:
            self.size = os.fstat(self._fd).st_size
        else:
            import tensorflow as tf

            self.size = tf.io.gfile.stat(path).length

    def _handle(self):
        handle = getattr(self._handles, "file", None)
        if handle is None:
            import tensorflow as tf

            handle = self._handles.file = tf.io.gfile.GFile(self.path, "rb")
        return handle

    def read(self, offset: int, length: int) -> bytes:
        if self._fd is not None:
            return os.pread(self._fd, length, offset)
        handle = self._handle()
        handle.seek(offset)
        return handle.read(length)

    def read_into(self, offset: int, buffers: list) -> int:
        """Fills `buffers` (writable byte views) in turn from `offset`; returns the bytes read."""
        if self._fd is not None:
            return os.preadv(self._fd, buffers, offset)
        handle, done = self._handle(), 0
        handle.seek(offset)
        for buffer in buffers:
            data = handle.read(len(buffer))
            buffer[: len(data)] = data
            done += len(data)
            if len(data) < len(buffer):
                break
        return done

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclasses.dataclass
class _InflatePoint:
    """The decompressor as it stood at a record's start: its state, and where in the file its input resumes."""

    decompressor: object  # zlib.Decompress, copied
    compressed_offset: int


class RecordFile:
    """One TFRecord file, its records addressable by number.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
        >>> write_records(path, [b"first", b"second record"])
        >>> records = RecordFile(path)
        >>> len(records), records.read(1, 7, 6)
        (2, b'record')
    """

    def __init__(self, path: str):
        self.path = path
        self.compressed = path.endswith(".gz")
        self._source = _Source(path)
        self.offsets: np.ndarray  # (N,) where each record's data starts (in the decompressed stream for .gz)
        self.lengths: np.ndarray  # (N,) each record's data length
        self._points: list[_InflatePoint] = []
        # Each thread's last GZIP record stream, read on forward: a walk of a record's fields (many small reads at
        # rising offsets) inflates the record once, not once per read from its start.
        self._streams = threading.local()
        (self._index_gzip if self.compressed else self._index)()

    def __len__(self) -> int:
        return len(self.lengths)

    def _damaged(self, number: int, what: str) -> RecordFileDamaged:
        return RecordFileDamaged(
            f"{self.path} is damaged at record {number + 1} ({what}); copy the data set again from where it was "
            "written, or convert the scans again with fullres preprocess.")

    def _header(self, number: int, header: bytes) -> int:
        if len(header) < _HEADER:
            raise self._damaged(number, f"the file ends inside its header, {len(header)} of {_HEADER} bytes")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:12])[0] != masked_crc32c(header[:8]):
            raise self._damaged(number, "its length does not match its checksum")
        return length

    def _index(self) -> None:
        offsets, lengths, position, size = [], [], 0, self._source.size
        while position < size:
            length = self._header(len(offsets), self._source.read(position, _HEADER))
            end = position + _HEADER + length + _FOOTER
            if end > size:
                raise self._damaged(len(offsets), f"cut short: {length:,} bytes of data announced, "
                                                  f"{max(0, size - position - _HEADER):,} present")
            offsets.append(position + _HEADER)
            lengths.append(length)
            position = end
        self.offsets, self.lengths = np.array(offsets, np.int64), np.array(lengths, np.int64)

    def _index_gzip(self) -> None:
        """Inflates the file once, keeping the decompressor's state at each record's start."""
        stream = _Inflater(self._source, _InflatePoint(zlib.decompressobj(_GZIP_WINDOW_BITS), 0))
        offsets, lengths = [], []
        while True:
            point = stream.point()
            try:
                header = stream.take(_HEADER)
            except zlib.error as error:
                raise self._damaged(len(offsets), f"its compressed data do not inflate: {error}") from None
            if not header:
                break
            length = self._header(len(offsets), header)
            self._points.append(point)
            offsets.append(stream.position)
            lengths.append(length)
            try:
                skipped = stream.skip(length + _FOOTER)
            except zlib.error as error:
                raise self._damaged(len(offsets) - 1, f"its compressed data do not inflate: {error}") from None
            if skipped < length + _FOOTER:
                raise self._damaged(len(offsets) - 1, f"cut short: {length:,} bytes of data announced, "
                                                      f"{max(0, skipped - _FOOTER):,} present")
        self.offsets, self.lengths = np.array(offsets, np.int64), np.array(lengths, np.int64)

    def record(self, number: int) -> bytes:
        """Record `number`'s data, whole, checked against its CRC."""
        data = self.read(number, 0, int(self.lengths[number]) + _FOOTER)
        body, footer = data[:-_FOOTER], data[-_FOOTER:]
        if struct.unpack("<I", footer)[0] != masked_crc32c(body):
            raise self._damaged(number, "its data do not match their checksum")
        return body

    def read(self, number: int, offset: int, length: int) -> bytes:
        """`length` bytes of record `number`'s data from `offset` in it (unchecked: the caller checks)."""
        buffer = bytearray(length)
        self.read_into(number, offset, [memoryview(buffer)])
        return bytes(buffer)

    def read_into(self, number: int, offset: int, buffers: list) -> None:
        """Fills `buffers` (writable byte views, e.g. `memoryview(array).cast("B")`) in turn with record `number`'s
        bytes from `offset` in its data on, straight from the file (or the inflater)."""
        wanted = sum(len(b) for b in buffers)
        if self.compressed:
            stream = getattr(self._streams, "last", None)
            if stream is None or stream.number != number or stream.at > offset:
                stream = self._streams.last = _RecordStream(self._source, self._points[number], number)
            stream.at += stream.inflater.skip(offset - stream.at)
            done = 0
            for buffer in buffers:
                taken = stream.inflater.take_into(buffer)
                stream.at += taken
                done += taken
        else:
            done = self._source.read_into(int(self.offsets[number]) + offset, buffers)
        if done < wanted:
            raise self._damaged(number, f"it ends {wanted - done:,} bytes early")

    def close(self) -> None:
        self._source.close()


def first_record(path: str) -> bytes | None:
    """The data of the first record of a TFRecord file, checked; None when it holds none. Reads that record only.

    Raises:
        RecordFileDamaged: the file does not begin with a whole TFRecord (not a TFRecord file, or damaged).
    """
    source = _Source(path)
    if path.endswith(".gz"):
        take = _Inflater(source, _InflatePoint(zlib.decompressobj(_GZIP_WINDOW_BITS), 0)).take
    else:
        position = [0]

        def take(length: int) -> bytes:
            data = source.read(position[0], length)
            position[0] += len(data)
            return data
    try:
        header = take(_HEADER)
        if not header:
            return None
        if len(header) < _HEADER or struct.unpack("<I", header[8:12])[0] != masked_crc32c(header[:8]):
            raise RecordFileDamaged(f"{path} does not begin with a TFRecord header")
        (length,) = struct.unpack("<Q", header[:8])
        data = take(length + _FOOTER)
        if len(data) < length + _FOOTER or struct.unpack("<I", data[-_FOOTER:])[0] != masked_crc32c(data[:-_FOOTER]):
            raise RecordFileDamaged(f"{path}: its first record is cut short or does not match its checksum")
        return data[:-_FOOTER]
    except zlib.error as error:
        raise RecordFileDamaged(f"{path}: its compressed data do not inflate: {error}") from None
    finally:
        source.close()


class _RecordStream:
    """A GZIP record's data read forward: `at` bytes of it passed so far."""

    def __init__(self, source: _Source, point: _InflatePoint, number: int):
        self.inflater, self.number = _Inflater(source, point), number
        self.inflater.skip(_HEADER)
        self.at = 0


class _Inflater:
    """A GZIP stream read forward from an `_InflatePoint`, in bounded pieces (fresh memory is dear)."""

    def __init__(self, source: _Source, point: _InflatePoint):
        self._source = source
        self._decompressor = point.decompressor.copy()
        self._next_input = point.compressed_offset  # file offset of the next compressed byte to feed
        self._pending = b""  # compressed bytes read but not yet taken by the decompressor
        self.position = 0  # decompressed bytes produced since the stream's start (set by the first point)

    def point(self) -> _InflatePoint:
        """Where the stream stands now, to come back to later."""
        return _InflatePoint(self._decompressor.copy(), self._next_input - len(self._pending))

    def _inflate(self, limit: int) -> bytes:
        while True:
            if not self._pending and not self._decompressor.eof:
                self._pending = self._source.read(self._next_input, _FEED)
                self._next_input += len(self._pending)
            out = self._decompressor.decompress(self._pending, limit)
            self._pending = self._decompressor.unconsumed_tail or (
                self._decompressor.unused_data if self._decompressor.eof else b"")
            if out or self._decompressor.eof or not self._pending and self._next_input >= self._source.size:
                self.position += len(out)
                return out

    def take(self, length: int) -> bytes:
        """The next `length` bytes (fewer at the end of the stream)."""
        parts, left = [], length
        while left:
            out = self._inflate(min(left, _INFLATE_CHUNK))
            if not out:
                break
            parts.append(out)
            left -= len(out)
        return b"".join(parts)

    def take_into(self, buffer) -> int:
        """Fills `buffer` with the next bytes; returns how many there were."""
        done = 0
        while done < len(buffer):
            out = self._inflate(min(len(buffer) - done, _INFLATE_CHUNK))
            if not out:
                break
            buffer[done:done + len(out)] = out
            done += len(out)
        return done

    def skip(self, length: int) -> int:
        """Passes over the next `length` bytes; returns how many there were."""
        done = 0
        while done < length:
            out = self._inflate(min(length - done, _INFLATE_CHUNK))
            if not out:
                break
            done += len(out)
        return done


def frame(data: bytes) -> bytes:
    """One record as a TFRecord file holds it: length, its checksum, the data, its checksum."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def write_records(path: str, records, compress: bool | None = None) -> None:
    """Writes `records` (bytes) as a TFRecord file, GZIP when `path` ends in .gz (or `compress` says so).

    For tests and benchmarks that need records without Beam: the framing is the
    format's own, so TensorFlow reads these files too.
    """
    compress = path.endswith(".gz") if compress is None else compress
    payload = b"".join(frame(data) for data in records)
    if compress:
        compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WINDOW_BITS)
        payload = compressor.compress(payload) + compressor.flush()
    with open(path, "wb") as file:
        file.write(payload)
