"""`fullres predict`'s model side: the run records its preprocessing, and older runs are refused in one sentence."""

import json

import pytest

from preprocessing import ct_transforms
from trainer import config as config_lib, predict, tasks


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
    config = config_lib.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(tmp_path / "run"))
    task = tasks.make_task(config)
    assert task.preprocessing() == {"spacing": [0.8, 0.8, 2.5], "orientation": "LPS", "window": [-160, 240],
                                    "modality": "ct", "shape": None}
    (tmp_path / "summary.json").write_text(json.dumps({"label_values": {"0": 1}}))  # a conversion from before
    assert task.preprocessing() is None


def test_a_run_with_its_preprocessing_is_accepted(tmp_path):
    recorded = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 2.0)))
    run = _run_dir(tmp_path, {"task": "segmentation", "image_shape": [16, 16, 16, 1], "preprocessing": recorded})
    assert predict.read_model_info(run)["preprocessing"]["spacing"] == [1.0, 1.0, 2.0]


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
        predict.read_model_info(run)
    message = str(refused.value)
    assert words in message and run in message
    assert message.count(". ") == 0 and message.endswith(".")


# ---- the per-scan path: geometry, partitioning, bad input ---------------------------------------------------------

import os  # noqa: E402

import numpy as np  # noqa: E402
import SimpleITK as sitk  # noqa: E402

from preprocessing import ct_io  # noqa: E402

# A flip of x and a 30° rotation about it, with anisotropic spacing and an odd size: what a real scan header holds.
_ANGLE = np.deg2rad(30)
DIRECTION = (-1.0, 0.0, 0.0,
             0.0, np.cos(_ANGLE), -np.sin(_ANGLE),
             0.0, np.sin(_ANGLE), np.cos(_ANGLE))
SPACING, ORIGIN, SIZE = (0.9, 1.3, 2.1), (-12.5, 30.25, 7.0), (25, 31, 19)  # size (x, y, z)
PREPROCESSING = {"spacing": [1.5, 1.5, 1.5], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
                 "shape": None}


def _true_mask() -> np.ndarray:
    """(z, y, x) class ids in the scan's own grid: an off-centre ball (1) and a box at one corner (2), so any flip
    or shift of the mask moves them."""
    z, y, x = np.mgrid[: SIZE[2], : SIZE[1], : SIZE[0]]
    mask = np.zeros((SIZE[2], SIZE[1], SIZE[0]), np.uint8)
    mask[((x - 11) * SPACING[0]) ** 2 + ((y - 17) * SPACING[1]) ** 2 + ((z - 7) * SPACING[2]) ** 2 <= 9.0**2] = 1
    mask[13:18, 2:9, 18:24] = 2
    return mask


def _scan(path: str) -> sitk.Image:
    """Writes a CT scan in HU whose classes are told apart by intensity, in the odd geometry above."""
    hu = np.where(_true_mask() == 1, 100.0, np.where(_true_mask() == 2, 250.0, -900.0)).astype(np.int16)
    image = sitk.GetImageFromArray(hu)
    image.SetSpacing(SPACING)
    image.SetOrigin(ORIGIN)
    image.SetDirection(DIRECTION)
    sitk.WriteImage(image, path)
    return image


def _intensity_model(volume: np.ndarray, fill: float) -> np.ndarray:
    """A model-free stand-in for the network: class probabilities from the windowed intensity alone.

    The window (-200, 300) HU maps -900 -> 0, 100 -> 0.6, 250 -> 0.9; each class's probability peaks at its value.
    """
    centres = np.array([0.0, 0.6, 0.9])
    logits = -((volume[..., None] - centres) ** 2) / 0.01
    return np.exp(logits - logits.max(-1, keepdims=True)) / np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                                                          keepdims=True)


def _dice(a: np.ndarray, b: np.ndarray, label: int) -> float:
    return 2 * np.count_nonzero((a == label) & (b == label)) / (np.count_nonzero(a == label) + np.count_nonzero(b == label))


def _centroid(mask: np.ndarray, label: int) -> np.ndarray:
    """(z, y, x) voxel index of the centre of `label` within 13 mm of the ball (the box's rim, between -900 and 250
    HU, passes through the ball's intensity and is left out)."""
    z, y, x = np.mgrid[: SIZE[2], : SIZE[1], : SIZE[0]]
    near = ((x - 11) * SPACING[0]) ** 2 + ((y - 17) * SPACING[1]) ** 2 + ((z - 7) * SPACING[2]) ** 2 <= 13.0**2
    return np.argwhere((mask == label) & near).mean(axis=0)


def _predict_file(tmp_path, suffix: str, preprocessing: dict):
    path = str(tmp_path / f"scan{suffix}")
    written = _scan(path)
    output = tmp_path / "out"
    output.mkdir()
    entry = predict.predict_case(ct_io.VolumeSource(path), "scan", preprocessing, _intensity_model, str(output),
                                 predict.output_suffix(path, False, None), ["background", "ball", "box"], True)
    return path, written, output, entry


@pytest.mark.parametrize("suffix", [".nii.gz", ".nrrd", ".mha"])
def test_the_mask_comes_back_in_the_scans_own_geometry(tmp_path, suffix):
    path, written, output, entry = _predict_file(tmp_path, suffix, PREPROCESSING)
    read_back = sitk.ReadImage(path)  # NIfTI stores its header in float32: compare with what the file holds
    assert entry["outputs"]["mask"] == f"scan{suffix}"
    mask = sitk.ReadImage(str(output / entry["outputs"]["mask"]))
    assert mask.GetSize() == SIZE
    for name in ("GetSpacing", "GetOrigin", "GetDirection"):
        np.testing.assert_allclose(getattr(mask, name)(), getattr(read_back, name)(), atol=1e-6)
        np.testing.assert_allclose(getattr(mask, name)(), getattr(written, name)(), atol=1e-4)
    assert entry["model_shape"] != list(sitk.GetArrayViewFromImage(written).shape)  # resampled and reoriented between
    truth, found = _true_mask(), sitk.GetArrayFromImage(mask)
    # Through the 1.5 mm model grid and back, the ball lands where it is: its centre within 0.4 voxel on every
    # axis, where a mask shifted by one voxel, or flipped along any axis, is 1 voxel or more off.
    assert _dice(found, truth, 1) >= 0.85
    np.testing.assert_array_less(np.abs(_centroid(found, 1) - _centroid(truth, 1)), 0.4)
    for wrong in (np.roll(truth, 1, axis=0), np.roll(truth, 1, axis=1), np.roll(truth, 1, axis=2),
                  truth[::-1], truth[:, ::-1], truth[:, :, ::-1]):
        assert np.abs(_centroid(wrong, 1) - _centroid(truth, 1)).max() >= 1.0
    ball = sitk.ReadImage(str(output / entry["outputs"]["probability_ball"]))
    assert ball.GetSize() == SIZE and sitk.GetArrayViewFromImage(ball)[truth == 1].mean() > 0.8


@pytest.mark.parametrize("suffix", [".nii.gz", ".mha"])
def test_reorientation_alone_returns_the_exact_mask(tmp_path, suffix):
    """Without resampling, the flip and rotation are undone voxel for voxel: every class id is where it was."""
    _, _, output, entry = _predict_file(tmp_path, suffix, {**PREPROCESSING, "spacing": None})
    assert entry["model_shape"] == [SIZE[2], SIZE[1], SIZE[0]]  # DICOMOrient to LPS flipped x only
    np.testing.assert_array_equal(sitk.GetArrayFromImage(sitk.ReadImage(str(output / entry["outputs"]["mask"]))),
                                  _true_mask())


def test_probabilities_are_resampled_then_argmaxed_on_the_original_grid():
    """Injected probabilities: the boundary lands between model voxels, where the interpolated probabilities put it."""
    original = sitk.Image(9, 1, 1, sitk.sitkFloat32)
    original.SetSpacing((1.0, 1.0, 1.0))
    grid = sitk.Image(3, 1, 1, sitk.sitkFloat32)
    grid.SetSpacing((3.0, 1.0, 1.0))
    grid.SetOrigin((1.0, 0.0, 0.0))  # model voxel centres at x = 1, 4, 7
    # The model's class ids are (0, 0, 1): nearest neighbour on them would start the foreground at x = 6 (past the
    # midpoint 5.5); the interpolated probability crosses 0.5 at x = 4 + 3 * 0.05 / 0.55 = 4.27, so x = 5 is foreground.
    foreground = np.array([0.0, 0.45, 1.0], np.float32)
    probabilities = np.stack([1 - foreground, foreground], -1).reshape(1, 1, 3, 2)
    mask, back = predict.to_original_geometry(probabilities, grid, original)
    assert sitk.GetArrayViewFromImage(mask).ravel().tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    # Beyond the outermost model voxel centres (x = 0 and 8) the nearest one's value, not 0.
    np.testing.assert_allclose(sitk.GetArrayViewFromImage(back)[0, 0, :, 1],
                               [0, 0, 0.15, 0.3, 0.45, 0.45 + 0.55 / 3, 0.45 + 1.1 / 3, 1, 1], atol=1e-6)


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    """A run directory as `fullres train` leaves it, with an untrained 2-level UNet (partitioning is what's tested)."""
    from trainer import tasks as tasks_lib

    run = tmp_path_factory.mktemp("run")
    config = config_lib.smoke(train_data=str(run / "none-*.tfrecord"), output_dir=str(run))
    model = tasks_lib.make_task(config).build_model()
    model.save(str(run / "model.keras"))
    (run / "train_config.json").write_text(json.dumps(config_lib.to_dict(config)))
    (run / "model_info.json").write_text(json.dumps({
        "task": "segmentation", "image_shape": [16, 16, 16, 1], "class_names": None,
        "preprocessing": {**PREPROCESSING, "spacing": [2.0, 2.0, 2.0]}}))
    return str(run)


@pytest.mark.slow  # 5 splits, 10 compilations: about 50 s on 2 busy cores
def test_partitioned_prediction_gives_the_class_ids_of_one_device(untrained_run):
    from trainer import evaluate, inference, partitioning

    # W = 19 is padded to 20 under every split (the same padding: instance normalization sees the padded volume).
    volume = np.random.default_rng(0).normal(size=(1, 32, 24, 19, 1)).astype(np.float32)
    results = {}
    for dims in [(1, 1, 1, 1, 1), (1, 2, 1, 1, 1), (1, 4, 1, 1, 1), (1, 8, 1, 1, 1), (1, 2, 2, 1, 1)]:
        config, _, model, state, distribution = evaluate.load_trained(
            untrained_run, partition=partitioning.PartitionConfig(dims), batch_size=1)
        assert distribution.device_mesh.devices.size == np.prod(dims)  # one replica, the split's cores
        forward = inference.Inference(model, state, distribution, config.model.downsampling_levels)
        results[dims] = forward.class_ids(volume)
        probabilities = forward.probabilities(volume)
        assert probabilities.shape == (1, 32, 24, 19, 3)
        np.testing.assert_array_equal(probabilities.argmax(-1), results[dims])
    reference = results[(1, 1, 1, 1, 1)]
    assert reference.shape == (1, 32, 24, 19) and len(np.unique(reference)) > 1  # not a constant map
    for dims, class_ids in results.items():
        np.testing.assert_array_equal(class_ids, reference, err_msg=str(dims))


def test_padded_shape_is_the_nearest_the_model_and_split_accept():
    from trainer import inference

    assert inference.padded_shape((25, 31, 19), (1, 1, 1, 1, 1), 2) == (28, 32, 20)
    assert inference.padded_shape((25, 31, 19), (1, 2, 2, 1, 1), 2) == (32, 32, 20)
    assert inference.padded_shape((32, 24, 20), (1, 8, 1, 1, 1), 1) == (32, 24, 20)


def test_a_bad_scan_is_a_dead_letter_and_the_others_are_predicted(untrained_run, tmp_path):
    scans = tmp_path / "scans"
    scans.mkdir()
    _scan(str(scans / "alpha.nii.gz"))
    _scan(str(scans / "beta.nrrd"))
    (scans / "broken.nii.gz").write_bytes(b"\x1f\x8b not really a gzip")  # a transfer cut short
    output = tmp_path / "masks"
    lines = []
    summary = predict.predict_scans(untrained_run, str(scans), str(output), log=lines.append)
    assert summary["predicted"] == 2 and summary["failed"] == 1
    assert [case["case_id"] for case in summary["cases"]] == ["alpha", "beta"]
    for case in summary["cases"]:
        mask = sitk.ReadImage(str(output / case["outputs"]["mask"]))
        assert mask.GetSize() == SIZE and case["seconds"] > 0 and case["partitioning"] == [1, 1, 1, 1, 1]
    assert sorted(os.listdir(output)) == [".fullres-output", "alpha.nii.gz", "beta.nrrd", "dead_letter.jsonl",
                                          "summary.json"]
    (letter,) = [json.loads(line) for line in (output / "dead_letter.jsonl").read_text().splitlines()]
    assert letter["source"].endswith("broken.nii.gz") and letter["reason"] == "unreadable"
    assert any(line.startswith("[1/3] alpha: 19×31×25 voxels") for line in lines)
    assert any("broken: failed: SimpleITK cannot read" in line for line in lines)
    # A rerun replaces its own files; a file fullres did not write makes it refuse, naming the file.
    predict.predict_scans(untrained_run, str(scans / "alpha.nii.gz"), str(output), log=lines.append)
    (output / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files fullres did not write \\(notes.txt\\)"):
        predict.predict_scans(untrained_run, str(scans), str(output), log=lines.append)
    assert (output / "notes.txt").read_text() == "mine"


def test_predict_command_refuses_a_model_that_is_not_a_fullres_run(tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    _scan(str(tmp_path / "scan.nii.gz"))
    (tmp_path / "notes").mkdir()
    result = CliRunner().invoke(cli.app, ["predict", "--model", str(tmp_path / "notes"), "--input",
                                          str(tmp_path / "scan.nii.gz"), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert f"--model {tmp_path / 'notes'} is not a fullres run" in result.output
    assert result.output.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_volume_too_large_for_the_devices_is_one_sentence(untrained_run):
    from trainer import evaluate, inference

    config, _, model, state, distribution = evaluate.load_trained(untrained_run, batch_size=1)
    forward = inference.Inference(model, state, distribution, config.model.downsampling_levels,
                                  device_memory_bytes=2**20)  # a 1 MiB device
    with pytest.raises(inference.VolumeTooLarge) as refused:
        forward.probabilities(np.zeros((1, 32, 32, 32, 1), np.float32))
    message = str(refused.value)
    assert message.startswith("the volume, padded to 32×32×32, does not fit the memory of 1 device(s) under "
                              "input_partition_dims [1, 1, 1, 1, 1] (")
    assert "it needs about" in message and message.endswith("on as many devices.") and message.count(". ") == 0
