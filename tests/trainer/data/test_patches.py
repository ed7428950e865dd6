"""Patch mode's input: crops a function of (seed, position), a third centred on foreground, a process's share of one
equal to the same rows and depths of the whole batch."""

import numpy as np
import pytest

from trainer.data import batches, ct_batches, ct_input, patches


def test_a_third_of_the_crops_are_centred_on_foreground_and_every_crop_lies_inside():
    label = np.zeros((40, 24, 32), np.uint8)
    label[30:32, 2:4, 25:28] = 1  # a small organ near a corner
    label[5, 20, 3] = 2  # and one voxel of another class
    sampler = patches.CropSampler((8, 8, 8), label.shape, seed=3, read_label=lambda index: label)
    crops = [sampler.origin(position, 0) for position in range(300)]
    has_foreground = [bool(label[z:z + 8, y:y + 8, x:x + 8].any()) for z, y, x in crops]
    forced = [patches.is_foreground_crop(p) for p in range(300)]
    assert sum(forced) == 100  # exactly one in three
    assert all(has for has, force in zip(has_foreground, forced) if force)
    random_hits = sum(has for has, force in zip(has_foreground, forced) if not force)
    assert random_hits < 40  # by chance a crop of 8³ in 40×24×32 meets the organ far less often
    assert all(0 <= c <= s - 8 for origin in crops for c, s in zip(origin, label.shape))
    # Both foreground classes are chosen (a class at random, then a voxel of it).
    assert {1, 2} <= {int(label[z:z + 8, y:y + 8, x:x + 8].max()) for (z, y, x), f in zip(crops, forced) if f}
    # A pure function of (seed, position): drawn again, the same; another seed, others.
    again = patches.CropSampler((8, 8, 8), label.shape, seed=3, read_label=lambda index: label)
    assert [again.origin(p, 0) for p in range(300)] == crops
    other = patches.CropSampler((8, 8, 8), label.shape, seed=4, read_label=lambda index: label)
    assert [other.origin(p, 0) for p in range(300)] != crops


def test_a_patch_larger_than_the_volume_is_refused_in_one_sentence():
    with pytest.raises(ValueError) as refused:
        patches.check_fits((32, 8, 8), (16, 16, 16), "data/ct")
    assert str(refused.value) == (
        "--patch-size 32,8,8 is larger than the 16x16x16 volumes of data/ct; give a patch at most the volume's size "
        "along every axis, or leave --patch-size out to train on whole volumes.")


def test_a_process_share_of_a_patch_batch_is_those_rows_and_depths_of_the_whole_batch(demo_data):
    records = ct_input.CtRecords(demo_data["train"])
    try:
        whole = ct_batches.CtBatches(records, 2, seed=5, steps=4, cache="off", patch=(8, 8, 4))
        share = ct_batches.CtBatches(records, 2, batches.Share((1,), (4, 8)), seed=5, steps=4, cache="on",
                                   patch=(8, 8, 4))
        for step in range(4):
            full, part = next(whole), next(share)
            assert full.inputs["image"].shape == (2, 8, 8, 4, 1) and full.labels.shape == (2, 8, 8, 4)
            np.testing.assert_array_equal(part.inputs["image"], full.inputs["image"][1:, 4:8])
            np.testing.assert_array_equal(part.labels, full.labels[1:, 4:8])
            assert part.ids == full.ids[1:]
            if step == 0:  # the crop is the record's voxels at the crop's origin
                position = 0
                index = ct_batches.epoch_order(5, 0, len(records))[position]
                sampler = patches.CropSampler((8, 8, 4), records.shape, 5, whole._whole_label)
                z, y, x = sampler.origin(position, int(index))
                image = np.empty(records.shape, np.int16)
                label = np.empty(records.shape, np.uint8)
                records.read(int(index), 0, records.shape[0], image, label)
                np.testing.assert_array_equal(full.inputs["image"][0, ..., 0], image[z:z + 8, y:y + 8, x:x + 4])
                np.testing.assert_array_equal(full.labels[0], label[z:z + 8, y:y + 8, x:x + 4])
            full.release()
            part.release()
        whole.close()
        share.close()
    finally:
        records.close()


@pytest.mark.slow  # imports and starts the trainer (2.4 s)
def test_training_refuses_a_patch_larger_than_the_volumes_before_making_the_run_folder(demo_data, tmp_path):
    from trainer import presets, train

    output = tmp_path / "run"
    config = presets.smoke(train_data=demo_data["train"], output_dir=str(output), patch_size=(32, 8, 8))
    with pytest.raises(ValueError, match=r"^--patch-size 32,8,8 is larger than the 16x16x16 volumes of "):
        train.train(config, log=lambda line: None)
    assert not output.exists()
