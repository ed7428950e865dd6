"""Orbax checkpoints of the TrainState: newest K kept, restore onto the mesh, refusal of another model's checkpoint."""

import asyncio
import os
import sys

import jax
import numpy as np
import pytest

from trainer.engine import checkpoints, placement
from trainer.parallel import device_mesh, partitioning


def _state(distribution, width=4, value=0.0):
    host = placement.TrainState(trainable=[np.full((3, width), value, np.float32), np.arange(width, dtype=np.float32)],
                                non_trainable=[np.zeros((2,), np.float32)],
                                optimizer=[np.asarray(7, np.int64), np.ones((3, width), np.float32)])
    return placement.place_state(host, distribution)


@pytest.fixture
def distribution():
    return device_mesh.make_distribution(partitioning.PartitionConfig((1, 4, 1, 1, 1)), jax.devices())


def test_newest_checkpoints_are_kept_and_the_newest_restored_onto_the_mesh(distribution, tmp_path):
    directory = str(tmp_path / "checkpoints")
    checkpointer = checkpoints.Checkpointer(directory, keep=2)
    assert checkpointer.restore_latest(_state(distribution)) is None
    for step_number in (4, 8, 12):
        checkpointer.save(step_number, _state(distribution, value=float(step_number)))
    checkpointer.close()
    assert checkpoints.list_steps(directory) == [8, 12]
    os.makedirs(os.path.join(directory, "00000016.orbax-checkpoint-tmp-1"))  # what a crash mid-save leaves
    assert checkpoints.list_steps(directory) == [8, 12]

    restored, step_number = checkpoints.Checkpointer(directory).restore_latest(_state(distribution))
    assert step_number == 12
    np.testing.assert_array_equal(np.asarray(restored.trainable[0]), np.full((3, 4), 12.0))
    assert int(restored.optimizer[0]) == 7
    # Restored straight onto the mesh, replicated on all 8 devices like the state it replaces.
    assert restored.trainable[0].sharding.is_equivalent_to(_state(distribution).trainable[0].sharding, 2)
    assert len(restored.trainable[0].sharding.device_set) == 8
    assert checkpoints.load_arrays(directory, 8)["trainable/00000"][0, 0] == 8.0


def test_what_a_crash_left_is_removed_before_the_checkpointer_returns(tmp_path, monkeypatch):
    """Orbax cleans up in a thread; a run failing before its first save must not exit while it still runs.

    In CI a disk-full run printed its one sentence and then that thread's traceback at interpreter exit. The
    cleanup is slowed here so the race is lost every time unless the Checkpointer waits for it.
    """
    from orbax.checkpoint._src.path import temporary_paths

    cleanup = temporary_paths.cleanup_temporary_paths

    async def slow_cleanup(*args, **kwargs):
        await asyncio.sleep(1.0)
        return await cleanup(*args, **kwargs)

    monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", slow_cleanup)
    directory = tmp_path / "checkpoints"
    os.makedirs(directory / "00000016.orbax-checkpoint-tmp-1")  # what a crash mid-save leaves
    checkpointer = checkpoints.Checkpointer(str(directory))
    assert os.listdir(directory) == []
    checkpointer.close()


def test_a_checkpoint_of_another_model_is_refused_in_one_sentence(distribution, tmp_path):
    directory = str(tmp_path / "checkpoints")
    checkpointer = checkpoints.Checkpointer(directory)
    checkpointer.save(10, _state(distribution, width=4))
    checkpointer.close()
    with pytest.raises(ValueError) as error:
        checkpoints.Checkpointer(directory).restore_latest(_state(distribution, width=5))
    message = str(error.value)
    assert "00000010 does not match this model (optimizer/00001: stored shape (3, 4), expected (3, 5))" in message
    assert message.endswith("resume with the configuration that wrote it, or train into a new --output directory.")


def _truncate_arrays(step_folder):
    """What a disk failing under a save, or a copy cut short, leaves: the array files cut to 10 bytes."""
    data = step_folder / "default" / "d"
    for name in os.listdir(data):
        with open(data / name, "r+b") as file:
            file.truncate(10)


def test_a_damaged_newest_checkpoint_is_named_set_aside_and_the_one_before_restored(distribution, tmp_path,
                                                                                    monkeypatch):
    """The issue: 1,500 characters of TensorStore text, and no way back to the checkpoint before it."""
    directory = tmp_path / "checkpoints"
    checkpointer = checkpoints.Checkpointer(str(directory))
    for step_number in (4, 8):
        checkpointer.save(step_number, _state(distribution, value=float(step_number)))
    checkpointer.close()
    _truncate_arrays(directory / "00000008")
    damaged_files = sorted(os.listdir(directory / "00000008" / "default" / "d"))

    lines, unraisable = [], []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # where Python prints what a callback raised
    checkpointer = checkpoints.Checkpointer(str(directory))
    restored, step_number = checkpointer.restore_latest(_state(distribution), lines.append)
    assert step_number == 4
    np.testing.assert_array_equal(np.asarray(restored.trainable[0]), np.full((3, 4), 4.0))
    assert len(lines) == 2
    assert lines[0].startswith(f"checkpoint {directory}/00000008 is damaged (Requested byte range [0, ")
    assert lines[0].endswith(") is not valid for value of size 10); trying the one before it")
    assert lines[1] == (f"moved the damaged checkpoint {directory}/00000008 aside to {directory}/00000008.damaged "
                        "(fullres keeps it; delete it when done)")
    # Kept, not deleted; and out of Orbax's way, so the resumed run writes its own step 8.
    assert sorted(os.listdir(directory)) == ["00000004", "00000008.damaged"]
    assert sorted(os.listdir(directory / "00000008.damaged" / "default" / "d")) == damaged_files
    checkpointer.save(8, _state(distribution, value=80.0))
    checkpointer.close()
    assert checkpoints.list_steps(str(directory)) == [4, 8]
    assert checkpoints.load_arrays(str(directory), 8)["trainable/00000"][0, 0] == 80.0
    # TensorStore's callbacks into the failed read's closed event loop (four tracebacks) are not shown either.
    assert [str(u.exc_value) for u in unraisable] == []


def test_no_intact_checkpoint_is_one_sentence_and_nothing_is_moved(distribution, tmp_path):
    directory = tmp_path / "checkpoints"
    checkpointer = checkpoints.Checkpointer(str(directory))
    for step_number in (4, 8):
        checkpointer.save(step_number, _state(distribution))
    checkpointer.close()
    _truncate_arrays(directory / "00000008")
    with open(directory / "00000004" / "default" / "_METADATA", "r+b") as file:
        file.truncate(100)
    lines = []
    with pytest.raises(checkpoints.CheckpointDamaged) as error:
        checkpoints.Checkpointer(str(directory)).restore_latest(_state(distribution), lines.append)
    message = str(error.value)
    assert message.startswith(f"checkpoint {directory}/00000008 is damaged (Requested byte range [0, ")
    assert message.endswith(
        ") is not valid for value of size 10) and the 1 before it, and no intact checkpoint is left to resume from; "
        f"move {directory} away to train from step 0 (fullres keeps it for you to inspect), or train into a new "
        "--output directory.")
    assert lines[1] == (f"checkpoint {directory}/00000004 is damaged (unreadable metadata: Expecting value at "
                        "character 100); trying the one before it")
    assert sorted(os.listdir(directory)) == ["00000004", "00000008"]


def test_a_never_retrieved_disk_full_or_damage_future_is_kept_off_the_terminal_and_other_errors_are_not():
    """TensorStore's futures fail (full disk, damaged checkpoint) without an Orbax frame in their traceback."""
    import logging

    def record(error):
        try:
            raise error
        except ValueError:
            info = sys.exc_info()
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Future exception was never retrieved",
                                 None, info)

    disk_full = ValueError('RESOURCE_EXHAUSTED: Error writing "trainable.17/0.0.0.0.0": Failed to write 37305 bytes '
                           "to file 16: No space left on device [os_error_code='28']")
    assert checkpoints._UNRETRIEVED_TASKS.filter(record(disk_full)) is False
    damaged = ValueError('OUT_OF_RANGE: Error opening "zarr" driver: Error reading "trainable.19/.zarray" in OCDBT '
                         "database: Error reading Byte range [0, 47453) of local file")
    assert checkpoints._UNRETRIEVED_TASKS.filter(record(damaged)) is False
    assert checkpoints._UNRETRIEVED_TASKS.filter(record(ValueError("something else went wrong"))) is True
