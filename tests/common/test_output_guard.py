"""Output safety: an output never overlaps an input, is never a file, and only fullres's own files are replaced."""

import errno
import io
import json
import os
import signal
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
import SimpleITK as sitk
from apache_beam.io import filesystem

from common import file_writes, output_guard, output_lock
from preprocessing.beam import conversion, counting, ct_pipeline, images_pipeline, local_workers
from preprocessing.ct import ct_transforms
from preprocessing.images import demo_images
from tests.files import snapshot

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
CONFIG = ct_transforms.CtPreprocessConfig(spacing=(2.0, 2.0, 2.0), shape=(8, 16, 16))
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _quiet(line):
    pass


@pytest.fixture
def user_folder(tmp_path):
    """The issue's reproduction: a scan in x/s, the user's notes and thesis beside it."""
    (tmp_path / "x" / "s").mkdir(parents=True)
    volume = np.random.default_rng(0).integers(-1000, 1000, (8, 16, 16)).astype(np.int16)
    sitk.WriteImage(sitk.GetImageFromArray(volume), str(tmp_path / "x" / "s" / "case1.nii.gz"))
    (tmp_path / "x" / "notes.txt").write_text("t\n")
    (tmp_path / "x" / "thesis.tex").write_text("\\documentclass{article} % four years of work\n")
    return tmp_path / "x"


class _Records(beam.DoFn):
    def process(self, item):
        yield counting.accept(b"record %d" % item)


@pytest.mark.parametrize("relation, output", [
    ("contains", "."),         # the issue: --output /tmp/x with --input /tmp/x/s
    ("is", "s"),
    ("lies inside", "s/out"),
    ("contains", "link"),      # a symlink to the folder above the scans
])
def test_output_overlapping_the_input_is_refused_before_anything_is_touched(user_folder, relation, output):
    os.symlink(user_folder, user_folder.parent / "link")
    target = (user_folder / output) if output != "link" else user_folder.parent / "link"
    before = snapshot(user_folder.parent)
    with pytest.raises(output_guard.OutputRefused) as refused:
        ct_pipeline.run(str(user_folder / "s"), str(target), config=CONFIG, pipeline_args=IN_PROCESS, log=_quiet)
    assert str(refused.value) == (
        f"--output {target} {relation} the input {user_folder / 's'}; fullres would replace or mix its files with "
        f"yours, so choose an --output outside {user_folder / 's'} (e.g. {user_folder}/fullres-output)."
    )
    assert snapshot(user_folder.parent) == before  # thesis.tex, notes.txt and the scan, byte for byte


def test_labels_location_counts_as_an_input(user_folder, tmp_path):
    (tmp_path / "labels").mkdir()
    with pytest.raises(output_guard.OutputRefused, match=r"--output .*/labels/out lies inside the labels .*/labels;"):
        ct_pipeline.run(str(user_folder / "s"), str(tmp_path / "labels" / "out"), labels=str(tmp_path / "labels"),
                        config=CONFIG, pipeline_args=IN_PROCESS, log=_quiet)


def test_output_that_is_a_file_is_refused_and_kept(user_folder, tmp_path):
    existing = tmp_path / "results.csv"
    existing.write_text("a,b\n1,2\n")
    with pytest.raises(output_guard.OutputRefused) as refused:
        ct_pipeline.run(str(user_folder / "s"), str(existing), config=CONFIG, pipeline_args=IN_PROCESS, log=_quiet)
    assert str(refused.value) == (f"--output {existing} is an existing file, not a directory; fullres does not "
                                  "replace files it did not write, so pass a new directory path as --output.")
    assert existing.read_text() == "a,b\n1,2\n"
    assert sorted(os.listdir(tmp_path)) == ["results.csv", "x"]  # no results.csv.old-xxxx beside it


def test_directory_with_foreign_files_is_refused(user_folder, tmp_path):
    output = tmp_path / "mine"
    output.mkdir()
    (output / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(output_guard.OutputRefused) as refused:
        ct_pipeline.run(str(user_folder / "s"), str(output), config=CONFIG, pipeline_args=IN_PROCESS, log=_quiet)
    assert str(refused.value) == (f"--output {output} holds files fullres did not write (thesis.tex); fullres never "
                                  "deletes or overwrites them, so pass a new or empty directory as --output, or move "
                                  "those files away.")
    assert snapshot(tmp_path) == before


def test_images_output_inside_the_images_folder_is_refused(tmp_path):
    written = demo_images.write_demo_coco(str(tmp_path / "coco"), num_images=2, size=(64, 64), seed=0)
    (tmp_path / "coco" / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    for output, name in ((written["images"], "images"), (os.path.dirname(written["annotations"]), "annotations")):
        with pytest.raises(output_guard.OutputRefused, match=rf"^--output {output} (is|contains) the {name} "):
            images_pipeline.run(written["annotations"], written["images"], output, pipeline_args=IN_PROCESS,
                                log=_quiet)
    assert snapshot(tmp_path) == before


def test_rerun_replaces_only_the_files_its_manifest_lists(tmp_path):
    output = tmp_path / "out"
    (tmp_path / "thesis.tex").write_text("beside the output")
    conversion.run([1, 2, 3], [], _Records(), str(output), pipeline_args=IN_PROCESS, num_shards=3, log=_quiet)
    manifest = json.loads((output / output_guard.MARKER).read_text())
    assert manifest["kind"] == "tfrecords"
    assert sorted(manifest["files"]) == sorted(set(os.listdir(output)) - {output_guard.MARKER})
    conversion.run([1], [], _Records(), str(output), pipeline_args=IN_PROCESS, num_shards=1, log=_quiet)
    assert sorted(os.listdir(output)) == [output_guard.MARKER, "data-00000-of-00001.tfrecord", "dead_letter.jsonl",
                                          "summary.json"]
    # Nothing left beside it: no old output, no staging directory, no lock; the user's file is as it was.
    assert sorted(os.listdir(tmp_path)) == ["out", "thesis.tex"]
    assert (tmp_path / "thesis.tex").read_text() == "beside the output"


def test_a_file_added_to_a_previous_output_stops_the_replacement(tmp_path):
    output = tmp_path / "out"
    conversion.run([1, 2], [], _Records(), str(output), pipeline_args=IN_PROCESS, log=_quiet)
    (output / "thesis.tex").write_text("saved here by mistake")
    before = snapshot(tmp_path)
    with pytest.raises(output_guard.OutputRefused, match=r"holds files fullres did not write \(thesis.tex\)"):
        conversion.run([1], [], _Records(), str(output), pipeline_args=IN_PROCESS, log=_quiet)
    assert snapshot(tmp_path) == before


def test_output_written_before_the_manifest_is_recognised_by_its_layout(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    for name in ("data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "dead_letter.jsonl",
                 "label_map.json", "summary.json"):
        (output / name).write_bytes(b"old")
    assert output_guard.conversion_files(str(output)) == sorted(os.listdir(output))
    conversion.run([1], [], _Records(), str(output), pipeline_args=IN_PROCESS, num_shards=1, log=_quiet)
    assert "data-00001-of-00002.tfrecord" not in os.listdir(output)
    (output / output_guard.MARKER).unlink()  # an old layout with a stranger in it is not recognised
    (output / "notes.txt").write_text("x")
    with pytest.raises(output_guard.OutputRefused, match=r"\(notes.txt\)"):
        output_guard.conversion_files(str(output))


_HOLDER = """
import sys, time
from common import output_guard, output_lock
with output_lock.lock(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_second_run_into_a_locked_output_is_refused_and_a_dead_holder_does_not_block(tmp_path):
    output = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(output)], stdout=subprocess.PIPE, text=True,
                              cwd=REPOSITORY)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(output_guard.OutputRefused) as refused:
            conversion.run([1], [], _Records(), str(output), pipeline_args=IN_PROCESS, log=_quiet)
        assert str(refused.value).startswith(f"--output {output} is being written by another fullres run "
                                             f"(pid {holder.pid} on ")
        assert str(refused.value).endswith("; wait for it to finish, or choose another --output.")
        assert not output.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # Killed without cleaning up: its lock file is still there, but the kernel released its lock.
    assert (tmp_path / f"out{output_lock.LOCK_SUFFIX}").exists()
    summary = conversion.run([1], [], _Records(), str(output), pipeline_args=IN_PROCESS, log=_quiet)
    assert summary["ok"] == 1
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_write_failures_become_one_sentence(tmp_path):
    # Real errors from the operating system, even for root: /sys takes no new folders; /dev/full is always full.
    # (tests/pipelines/test_cli.py has the real thing: a read-only folder and a full disk, through the CLI.)
    with pytest.raises(PermissionError) as denied:
        os.mkdir("/sys/fullres-output")
    with pytest.raises(OSError) as full, open("/dev/full", "wb") as file:
        file.write(b"x")
        file.flush()
    assert full.value.errno == errno.ENOSPC
    assert file_writes.write_failure(full.value, "/data/out") == (
        "the disk is full while writing /data/out; free space there or choose an --output on a disk with room, "
        "then run again.")
    assert file_writes.write_failure(denied.value, "/sys/out") == (
        "permission denied while writing /sys/fullres-output; choose an --output you may write to, or fix the "
        "permissions of /sys.")
    # A Beam worker's failure comes back as text around the same error.
    wrapped = RuntimeError(f"Error in bundle: {full.value!r} ... OSError: [Errno 28] No space left on device: "
                           "'/mnt/out.staging-1/data-00000-of-00001.tfrecord'")
    assert file_writes.write_failure(wrapped, "/mnt/out").startswith(
        "the disk is full while writing /mnt/out.staging-1/data-00000-of-00001.tfrecord;")
    assert file_writes.write_failure(ValueError("bad spacing"), "/mnt/out") is None


def test_object_store_outputs_keep_the_manifest_rule():
    # Pure decisions on names; the gs:// listing itself is Beam's FileSystems.
    assert output_guard._location("gs://bucket/ct/train-*.tfrecord") == "gs://bucket/ct"
    with pytest.raises(output_guard.OutputRefused, match=r"^--output gs://bucket/ct/ contains the input gs://bucket/ct/s;"):
        output_guard.check_outside_inputs("gs://bucket/ct/", {"input": "gs://bucket/ct/s"})
    output_guard.check_outside_inputs("gs://bucket/ct-out", {"input": "gs://bucket/ct"})  # a prefix is not a parent


class _ObjectStore(filesystem.FileSystem):
    """An object store in memory (scheme `objects://`): flat keys, no directories, like gs://.

    A real Beam filesystem (Beam finds it by its scheme), so `conversion.run`
    takes its object-store path; the in-memory runner runs in this process.
    """

    objects: dict = {}

    @classmethod
    def scheme(cls):
        return "objects"

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/"), *paths])

    def split(self, path):
        return tuple(path.rsplit("/", 1))

    def mkdirs(self, path):
        pass

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        for path, data in sorted(self.objects.items()):
            if path.startswith(dir_or_prefix):
                yield filesystem.FileMetadata(path, len(data), 0.0)

    def create(self, path, mime_type="application/octet-stream", compression_type="auto"):
        objects = self.objects

        class Upload(io.BytesIO):
            def close(self):
                objects[path] = self.getvalue()
                super().close()

        return Upload()

    def open(self, path, mime_type="application/octet-stream", compression_type="auto"):
        return io.BytesIO(self.objects[path])

    def copy(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names):
            self.objects[destination] = self.objects[source]

    def rename(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names):
            self.objects[destination] = self.objects.pop(source)

    def exists(self, path):
        return path in self.objects

    def size(self, path):
        return len(self.objects[path])

    def last_updated(self, path):
        return 0.0

    def checksum(self, path):
        return str(hash(self.objects[path]))

    def metadata(self, path):
        return filesystem.FileMetadata(path, len(self.objects[path]), 0.0)

    def delete(self, paths):  # a path, or a "directory": every object under the prefix (as on gs://)
        for path in paths:
            for key in [k for k in self.objects if k == path or k.startswith(path.rstrip("/") + "/")]:
                del self.objects[key]


def test_object_store_output_deletes_only_what_its_manifest_lists():
    store = _ObjectStore.objects
    store.clear()
    store["objects://bucket/notes/thesis.tex"] = b"beside"  # a neighbour sharing the prefix "objects://bucket/"
    conversion.run([1, 2], [], _Records(), "objects://bucket/out", pipeline_args=IN_PROCESS, num_shards=2, log=_quiet)
    first = sorted(store)
    assert "objects://bucket/out/.fullres-output" in first and "objects://bucket/out/data-00001-of-00002.tfrecord" in first
    conversion.run([1], [], _Records(), "objects://bucket/out", pipeline_args=IN_PROCESS, num_shards=1, log=_quiet)
    assert sorted(store) == [
        "objects://bucket/notes/thesis.tex", "objects://bucket/out/.fullres-output",
        "objects://bucket/out/data-00000-of-00001.tfrecord", "objects://bucket/out/dead_letter.jsonl",
        "objects://bucket/out/summary.json"]
    # A foreign object under the output: refused, and every object stays.
    store["objects://bucket/out/thesis.tex"] = b"mine"
    before = dict(store)
    with pytest.raises(output_guard.OutputRefused, match=r"^--output objects://bucket/out holds files fullres did not "
                                                         r"write \(thesis.tex\)"):
        conversion.run([1], [], _Records(), "objects://bucket/out", pipeline_args=IN_PROCESS, log=_quiet)
    assert store == before
    store.clear()
