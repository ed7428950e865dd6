"""The run's TensorBoard scalars, written without TensorFlow where the output folder is local.

`tf.summary` imported TensorFlow (4.6 CPU-s on the 2-core machine) into every
training process, a pipeline's train step among them, for a few numbers per
logging window. The file written here is the one TensorFlow 2 writes: TFRecord
framing, a version event, then an event per scalar holding a float32 tensor and
the `scalars` plugin's metadata (TensorBoard's own protos), so TensorBoard and
its `EventAccumulator` read it as before. Another scheme (gs://) is written
through `tf.summary`, as before.
"""

from __future__ import annotations

import os
import socket
import time

from preprocessing.records import file_system, tfrecord_files


class _LocalWriter:
    def __init__(self, folder: str):
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

        self._event, self._summary, self._tensor = event_pb2.Event, summary_pb2.Summary, tensor_pb2.TensorProto
        self._scalar_shape, self._float = tensor_shape_pb2.TensorShapeProto(), types_pb2.DT_FLOAT
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
        os.makedirs(folder, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0.v2"
        self._file = open(os.path.join(folder, name), "ab")
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self._file.flush()

    def _write(self, event) -> None:
        self._file.write(tfrecord_files.frame(event.SerializeToString()))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            tensor = self._tensor(dtype=self._float, tensor_shape=self._scalar_shape, float_val=[float(value)])
            summary = self._summary(value=[self._summary.Value(tag=tag, tensor=tensor, metadata=self._metadata)])
            self._write(self._event(wall_time=time.time(), step=int(step), summary=summary))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _TensorFlowWriter:
    def __init__(self, folder: str):
        import tensorflow as tf

        self._tf, self._writer = tf, tf.summary.create_file_writer(folder)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with self._writer.as_default(step=int(step)):
            for tag, value in values.items():
                self._tf.summary.scalar(tag, value)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def writer(folder: str):
    """A writer of scalars into `folder` (made if missing): `.scalars(step, {tag: value})`, then `.close()`."""
    return _LocalWriter(folder) if file_system.is_local(folder) else _TensorFlowWriter(folder)
