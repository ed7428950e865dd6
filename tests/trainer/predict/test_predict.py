"""`fullres predict`'s model side: the run records its preprocessing, and older runs are refused in one sentence."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

from preprocessing.ct import ct_io, ct_transforms
from tests import shared_runs
from trainer import presets
from trainer.tasks import registry
from trainer.predict import outputs, predict, scan_grid


def _run_dir(tmp_path, info: dict | None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(b"weights")
    if info is not None:
        (run / "model_info.json").write_text(json.dumps(info))
    return str(run)


def test_segmentation_task_records_the_preprocessing_of_its_training_data(tmp_path):
    recorded = ct_transforms.preprocessing_record(
        ct_transforms.CtPreprocessConfig(spacing=(0.8, 0.8, 2.5), window=(-160, 240), modality="ct"))
    (tmp_path / "summary.json").write_text(json.dumps({"preprocessing": recorded}))
    config = presets.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path / "run"))
    task = registry.make_task(config)
    assert task.preprocessing() == {"spacing": [0.8, 0.8, 2.5], "orientation": "LPS", "window": [-160, 240],
                                    "modality": "ct", "shape": None}
    (tmp_path / "summary.json").write_text(json.dumps({"label_values": {"0": 1}}))  # a conversion from before
    assert task.preprocessing() is None


def test_a_run_with_its_preprocessing_is_accepted(tmp_path):
    recorded = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 2.0)))
    run = _run_dir(tmp_path, {"task": "segmentation", "image_shape": [16, 16, 16, 1], "preprocessing": recorded})
    assert predict.checked_model_info(run)["preprocessing"]["spacing"] == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("info, words", [
    ({"task": "segmentation", "image_shape": [16, 16, 16, 1], "class_names": None},
     "does not record the preprocessing the model was trained with (missing: spacing, orientation, window, modality)"),
    ({"task": "segmentation", "preprocessing": {"spacing": None, "orientation": "LPS"}},
     "(missing: window, modality)"),
    ({"task": "detection", "preprocessing": None}, "is a detection model"),
    (None, "is not a fullres run"),
])
def test_a_run_predict_cannot_use_is_refused_in_one_sentence(tmp_path, info, words):
    run = _run_dir(tmp_path, info)
    with pytest.raises(predict.ModelRefused) as refused:
        predict.checked_model_info(run)
    message = str(refused.value)
    assert words in message and run in message
    assert message.count(". ") == 0 and message.endswith(".")


# ---------------------------------------------------------------------------------------------------------------
# The scan side: geometry in, geometry out; partitioned passes agree; bad scans are dead letters.

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PREPROCESSING = {"spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
                 "shape": [32, 32, 32]}
# A flip of x and a 90° turn in the y-z plane: stored voxel order differs from LPS on every axis.
DIRECTION = (-1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, -1.0, 0.0)


def _scan(size=(25, 31, 19), spacing=(0.83, 1.1, 2.7), origin=(12.5, -30.25, 7.0), direction=DIRECTION, radius=9.0):
    """A CT scan (HU) with a sphere of soft tissue off-centre, and its true mask, in the scan's own geometry."""
    image = sitk.Image(size, sitk.sitkFloat32)  # size (x, y, z)
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(direction)
    index = np.stack(np.meshgrid(*[np.arange(n) for n in size], indexing="ij"), axis=-1).reshape(-1, 3)
    points = np.array(origin) + (index * np.array(spacing)) @ np.array(direction).reshape(3, 3).T
    centre = np.array(origin) + np.array(direction).reshape(3, 3) @ (np.array([0.3, 0.35, 0.6]) * np.array(size) * spacing)
    inside = (np.linalg.norm(points - centre, axis=1) < radius).reshape(size).transpose(2, 1, 0)  # (z, y, x)
    values = np.where(inside, 60.0, -950.0).astype(np.float32)
    scan = sitk.GetImageFromArray(values)
    scan.CopyInformation(image)
    return scan, inside.astype(np.uint8)


def _dice(a, b):
    return 2 * np.logical_and(a, b).sum() / (a.sum() + b.sum())


@pytest.mark.parametrize("suffix", [".nii.gz", ".nrrd", ".mha"])
def test_the_mask_comes_back_in_the_scans_own_geometry(tmp_path, suffix):
    scan, truth = _scan(size=(45, 37, 23), radius=12.0)
    path = str(tmp_path / f"scan{suffix}")
    sitk.WriteImage(scan, path)
    source = ct_io.VolumeSource(path=path)
    original = sitk.ReadImage(path)
    for spacing in (None, PREPROCESSING["spacing"]):  # reoriented only; reoriented and resampled (1.7×1.7×2.25 mm)
        prepared = scan_grid.prepare(source, dict(PREPROCESSING, spacing=spacing))
        # A model-independent "model": the soft-tissue probability is the windowed intensity (60 HU -> 0.52, air 0).
        foreground = np.clip(prepared.volume[..., 0] / 0.52, 0, 1)
        mask, _ = scan_grid.to_original_grid(np.stack([1 - foreground, foreground], axis=-1), prepared.grid,
                                           prepared.original)
        written = str(tmp_path / f"mask{scan_grid.FORMATS[scan_grid.output_format(source, None)]}")
        assert written.endswith(suffix)
        sitk.WriteImage(mask, written)
        back = sitk.ReadImage(written)
        assert back.GetSize() == original.GetSize() == (45, 37, 23)
        for field in ("GetSpacing", "GetOrigin", "GetDirection"):
            np.testing.assert_allclose(getattr(back, field)(), getattr(original, field)(), atol=1e-6, err_msg=field)
        labels = sitk.GetArrayFromImage(back)
        if spacing is None:  # every axis flipped or permuted on the way in is undone on the way out, voxel for voxel
            assert np.array_equal(labels, truth)
            continue
        # Resampled twice (onto the coarser model grid and back), a sphere's rim blurs; its place does not.
        correct = _dice(labels == 1, truth == 1)
        assert correct >= 0.85
        for axis, voxel_mm in enumerate(original.GetSpacing()[::-1]):  # numpy axes: z, y, x
            assert _dice(np.flip(labels, axis) == 1, truth == 1) < correct - 0.3, axis
            shift = int(np.ceil(3.0 / voxel_mm))  # a mask 3 mm off
            assert _dice(np.roll(labels, shift, axis=axis) == 1, truth == 1) < correct - 0.1, axis


def _tiny_model(num_levels=2):
    import keras

    from trainer.engine import placement
    from trainer.models import unet

    keras.utils.set_random_seed(3)
    model = unet.build_unet(unet.UNetConfig(spatial_dims=3, num_classes=3, num_levels=num_levels, base_filters=4,
                                            stem="none"))
    state = placement.TrainState([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
                                 [])
    return model, state


@pytest.mark.slow  # compiles the UNet for five layouts
def test_partitioned_prediction_gives_the_class_ids_of_one_device():
    import jax

    from trainer.engine import inference
    from trainer.parallel import partitioning

    model, state = _tiny_model()
    rng = np.random.default_rng(0)
    volume = rng.normal(size=(19, 27, 13, 1)).astype(np.float32)  # odd sizes: padded for every layout
    one_device = inference.VolumePredictor(model, state, partitioning.PartitionConfig((1, 1, 1, 1, 1)),
                                           jax.devices(), 1)
    assert one_device.padded_shape((19, 27, 13)) == (20, 28, 14)
    for dims in [(1, 2, 1, 1, 1), (1, 4, 1, 1, 1), (1, 8, 1, 1, 1), (1, 2, 2, 1, 1)]:
        predictor = inference.VolumePredictor(model, state, partitioning.PartitionConfig(dims), jax.devices(), 1)
        padded = predictor.padded_shape((19, 27, 13))  # e.g. depth 24 for 8 parts (2 per pooling level and part)
        probabilities = predictor.probabilities(volume)
        assert probabilities.shape == (19, 27, 13, 3)
        # The same padded volume on one device: the split alone changes no class id.
        reference = np.argmax(one_device.probabilities(volume, pad_to=padded), axis=-1)
        assert len(np.unique(reference)) > 1
        assert np.array_equal(np.argmax(probabilities, axis=-1), reference), dims


@pytest.mark.slow  # compiles the UNet twice
def test_a_volume_too_large_for_the_devices_names_the_cores_it_needs():
    import jax

    from trainer.engine import inference
    from trainer.parallel import partitioning

    model, state = _tiny_model()
    volume = np.zeros((24, 20, 16, 1), np.float32)
    split = partitioning.PartitionConfig((1, 2, 1, 1, 1))
    roomy = inference.VolumePredictor(model, state, split, jax.devices(), 1, device_memory=2**30)
    assert roomy.probabilities(volume).shape == (24, 20, 16, 3)
    cramped = inference.VolumePredictor(model, state, split, jax.devices(), 1, device_memory=64 * 2**10)
    with pytest.raises(inference.VolumeTooLarge) as refused:
        cramped.probabilities(volume)
    message = str(refused.value)
    assert message.startswith("the volume, padded to 24×20×16, needs ") and "over 2 device(s), which hold 0.1 MiB" in message
    assert "split it over about " in message and "fullres plan --image-size 24,20,16" in message


@pytest.fixture(scope="module")
def trained_run(segmentation_run, tmp_path_factory):
    """A copy of the session's tiny segmentation run (smoke preset, split 4-way along depth), with the preprocessing
    of the scans below recorded as if training had recorded it (the synthetic records carry none)."""
    config, _, _ = segmentation_run
    return shared_runs.copied_run(config.output_dir, tmp_path_factory.mktemp("run"), preprocessing=PREPROCESSING)


@pytest.mark.slow  # predicts with the session's trained smoke model in a fresh process
def test_predict_writes_every_good_scan_and_dead_letters_the_bad_one(trained_run, tmp_path):
    from preprocessing.ct import demo_ct

    scans = tmp_path / "scans"
    scans.mkdir()
    for name, size in (("a.nii.gz", (25, 31, 19)), ("b.nrrd", (20, 17, 23))):
        sitk.WriteImage(_scan(size=size)[0], str(scans / name))
    (scans / "broken.nii.gz").write_bytes(b"\x1f\x8b not really gzip")
    series, _ = _scan(size=(16, 18, 12))
    for name in ("series", "no_frame_of_reference"):
        demo_ct.write_dicom_series(sitk.GetArrayFromImage(series), str(scans / name), spacing=series.GetSpacing(),
                                   origin=series.GetOrigin(), direction=series.GetDirection())
    import pydicom

    for path in (scans / "no_frame_of_reference").iterdir():  # as some exports are: a SEG cannot reference it
        dataset = pydicom.dcmread(path)
        del dataset.FrameOfReferenceUID
        dataset.save_as(path)
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    output = tmp_path / "masks"
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "predict", "--model", trained_run, "--input", str(scans),
         "--output", str(output), "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1", "--probabilities",
         "--max-failed-fraction", "0.25"],  # 1 of 5 scans is broken on purpose
        capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["failed"] == 1 and summary["dead_letters"][0]["source"].endswith("broken.nii.gz")
    assert summary["dead_letters"][0]["reason"] == "unreadable"
    by_case = {case["case_id"]: case for case in summary["cases"]}
    assert {"a", "b"} <= set(by_case) and all(c["input_partition_dims"] == [1, 2, 1, 1, 1] for c in by_case.values())
    for case_id, suffix in (("a", ".nii.gz"), ("b", ".nrrd")):
        mask, scan = sitk.ReadImage(str(output / f"{case_id}{suffix}")), sitk.ReadImage(str(scans / f"{case_id}{suffix}"))
        assert mask.GetSize() == scan.GetSize()
        np.testing.assert_allclose(mask.GetDirection(), scan.GetDirection(), atol=1e-6)
        np.testing.assert_allclose(mask.GetOrigin(), scan.GetOrigin(), atol=1e-6)
        assert all(os.path.exists(p) for p in by_case[case_id]["outputs"]) and len(by_case[case_id]["outputs"]) == 4
        # smoke model: 1 pooling; depth split in 2: depth padded to a multiple of 4, height and width of 2
        padded, grid = by_case[case_id]["padded_shape"], by_case[case_id]["model_grid_shape"]
        assert [p % m for p, m in zip(padded, (4, 2, 2))] == [0, 0, 0]
        assert all(0 <= p - g < m for p, g, m in zip(padded, grid, (4, 2, 2)))
    # DICOM input: a NIfTI mask and a DICOM SEG of the series, both on the series' grid.
    seg_path = next(p for p in by_case["series"]["outputs"] if p.endswith(".seg.dcm"))
    import highdicom

    seg = highdicom.seg.segread(seg_path)
    assert seg.SeriesInstanceUID != "" and len(seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence) == 12
    series_mask = sitk.ReadImage(str(output / "series.nii.gz"))
    assert series_mask.GetSize() == (16, 18, 12)
    # A series a SEG cannot be written for still gets its mask; the case says why it has no SEG.
    unreferenced = by_case["no_frame_of_reference"]
    assert [os.path.basename(p) for p in unreferenced["outputs"][:1]] == ["no_frame_of_reference.nii.gz"]
    assert not any(p.endswith(".seg.dcm") for p in unreferenced["outputs"])
    assert len(unreferenced["problems"]) == 1 and "FrameOfReferenceUID" in unreferenced["problems"][0]
    assert "broken: skipped (unreadable" in result.stdout


def test_predict_refuses_a_folder_that_is_not_a_run_in_one_sentence(tmp_path):
    scan = tmp_path / "scan.nii.gz"
    sitk.WriteImage(_scan()[0], str(scan))
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "predict", "--model", str(tmp_path), "--input",
                             str(scan), "--output", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=REPOSITORY, env=environment, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"fullres: error: --model {tmp_path} is not a fullres run (it lacks "
                                     "model_info.json or model.keras); pass the output directory of `fullres train`.")
    assert not (tmp_path / "out").exists()


def test_probabilities_are_resampled_then_argmaxed_on_the_original_grid():
    """Injected probabilities: the boundary lands between model voxels, where the interpolated probabilities put it."""
    original = sitk.Image(9, 1, 1, sitk.sitkFloat32)
    grid = sitk.Image(3, 1, 1, sitk.sitkFloat32)
    grid.SetSpacing((3.0, 1.0, 1.0))
    grid.SetOrigin((1.0, 0.0, 0.0))  # model voxel centres at x = 1, 4, 7
    # The model's class ids are (0, 0, 1): nearest neighbour on them would start the foreground at x = 6 (past the
    # midpoint 5.5); the interpolated probability crosses 0.5 at x = 4 + 3 * 0.05 / 0.55 = 4.27, so x = 5 is foreground.
    foreground = np.array([0.0, 0.45, 1.0], np.float32)
    probabilities = np.stack([1 - foreground, foreground], -1).reshape(1, 1, 3, 2)
    mask, back = scan_grid.to_original_grid(probabilities, grid, original)
    assert sitk.GetArrayViewFromImage(mask).ravel().tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    # Beyond the outermost model voxel centres (x = 0 and 8): the nearest one's value, not 0.
    np.testing.assert_allclose(sitk.GetArrayViewFromImage(back)[0, 0, :, 1],
                               [0, 0, 0.15, 0.3, 0.45, 0.45 + 0.55 / 3, 0.45 + 1.1 / 3, 1, 1], atol=1e-6)


def test_predict_never_overwrites_a_file_it_did_not_write(tmp_path):
    """An earlier predict output may be replaced file by file, but only the files its marker lists."""
    from common import output_guard

    run = _run_dir(tmp_path, {"task": "segmentation", "preprocessing": PREPROCESSING})
    scan = tmp_path / "a.nii.gz"
    sitk.WriteImage(_scan()[0], str(scan))
    output = tmp_path / "masks"
    output.mkdir()
    for name in ("a.nii.gz", "summary.json", "dead_letter.jsonl"):
        (output / name).write_text("written by predict")
    output_guard.write_marker(str(output), "predict", ["a.nii.gz", "dead_letter.jsonl", "summary.json"])
    assert output_guard.check_listed_output(str(output), "predict", {}) == ["a.nii.gz", "dead_letter.jsonl",
                                                                           "summary.json"]
    (output / "b.nii.gz").write_text("the user's own mask")  # same name a scan b.nii.gz would get
    with pytest.raises(output_guard.OutputRefused) as refused:
        predict.predict(run, str(scan), str(output), log=lambda line: None)
    assert f"--output {output} holds files fullres did not write (b.nii.gz)" in str(refused.value)
    assert (output / "b.nii.gz").read_text() == "the user's own mask"


def test_predict_s_summary_is_read_back_by_its_one_reader(tmp_path):
    summary = {"ok": 1, "failed": 0, "class_names": ["background", "liver"],
               "cases": [{"case_id": "a", "outputs": [str(tmp_path / "a.nii.gz")]}]}
    path = outputs.write_summary(str(tmp_path), summary)
    assert path == str(tmp_path / outputs.SUMMARY) and outputs.read_summary(str(tmp_path)) == summary
    with pytest.raises(FileNotFoundError, match="has no summary.json; pass the output directory of a finished"):
        outputs.read_summary(str(tmp_path / "elsewhere"))
