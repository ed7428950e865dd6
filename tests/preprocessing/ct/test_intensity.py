"""Intensity by modality: CT windowed in HU, MR z-scored and never clipped, and the choice recorded."""

import json

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from preprocessing.beam import ct_pipeline, local_workers
from preprocessing.ct import ct_io, ct_transforms, demo_ct, intensity
from preprocessing.records import tfrecord_schema

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def _mr(background: float = 0.0) -> np.ndarray:
    """An MR-like volume: a bright ellipsoid (200..3000, well above any CT window) in a dark background."""
    rng = np.random.default_rng(3)
    volume = np.full((12, 16, 16), background, np.float32)
    grid = np.indices(volume.shape).astype(np.float32)
    inside = sum(((g - c) / r) ** 2 for g, c, r in zip(grid, (6, 8, 8), (5, 6, 6))) <= 1
    volume[inside] = rng.uniform(200, 3000, int(inside.sum()))
    if background:
        volume[~inside] += rng.normal(0, 5, int((~inside).sum())).astype(np.float32)
    return volume


def _write(volume, path):
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing((1.2, 1.2, 3.0))
    sitk.WriteImage(image, str(path))
    return ct_io.VolumeSource(str(path))


def test_mr_is_z_scored_over_the_body_and_not_clipped(tmp_path):
    volume = _mr()
    record = ct_transforms.preprocess_case(ct_io.CaseSource("mr", _write(volume, tmp_path / "mr.nii.gz")),
                                           ct_transforms.CtPreprocessConfig())
    assert record.normalization == "zscore"
    body = volume != 0  # the background is exactly 0: the non-zero voxels are the normalization mask
    assert abs(record.image[body].mean()) < 1e-4 and record.image[body].std() == pytest.approx(1.0, abs=1e-4)
    assert np.all(record.image[~body] == 0)
    mean, std = record.window  # the record says what was subtracted and divided by
    np.testing.assert_allclose(record.image[body], (volume[body] - mean) / std, rtol=1e-5, atol=1e-5)
    # Values far beyond the old CT window (1000) keep their order and spacing: nothing is clipped.
    assert volume.max() > 2900 and record.image.max() == pytest.approx((volume.max() - mean) / std, rel=1e-5)
    parsed = tfrecord_schema.parse_ct_example(tfrecord_schema.encode_ct_example(record))
    assert parsed["normalization"].numpy() == b"zscore"


def test_mr_with_a_noisy_background_is_z_scored_over_the_whole_volume():
    volume = _mr(background=20.0)
    normalized, (mean, std), padding = intensity.zscore(volume)
    assert abs(normalized.mean()) < 1e-4 and normalized.std() == pytest.approx(1.0, abs=1e-4)
    assert (mean, std) == pytest.approx((float(volume.mean()), float(volume.std())), rel=1e-5)
    assert padding == pytest.approx(normalized.min(), abs=1e-5)  # padding gets the background's value


def test_dicom_modality_tag_decides_under_auto(tmp_path):
    volume, _ = demo_ct.synthetic_case(np.random.default_rng(0), (4, 8, 8))  # HU-like values...
    paths = demo_ct.write_dicom_series(volume, str(tmp_path / "series"))
    for path in paths:  # ...but the scanner says MR
        dataset = pydicom.dcmread(path)
        dataset.Modality = "MR"
        dataset.save_as(path)
    source = ct_io.VolumeSource(str(tmp_path / "series"), tuple(paths))
    assert intensity.dicom_modality(source) == "MR"
    record = ct_transforms.preprocess_case(ct_io.CaseSource("s", source), ct_transforms.CtPreprocessConfig())
    assert record.normalization == "zscore" and record.warnings == ()
    forced = ct_transforms.preprocess_case(ct_io.CaseSource("s", source), ct_transforms.CtPreprocessConfig(modality="ct"))
    assert forced.normalization == "ct_window" and forced.warnings == (intensity.WARNING_MODALITY,)


@pytest.mark.parametrize(
    "kind, expected",
    [("ct", True), ("ct_with_fov_padding", True), ("mr", False), ("zscored", False), ("ct_without_air", False)],
)
def test_looks_like_hu(kind, expected):
    ct, _ = demo_ct.synthetic_case(np.random.default_rng(1), (8, 16, 16))
    padded = ct.copy()
    padded[:, :4, :4] = -3024.0  # the value some scanners write outside the round field of view
    volumes = {"ct": ct, "ct_with_fov_padding": padded, "mr": _mr(), "zscored": intensity.zscore(_mr(20.0))[0],
               "ct_without_air": np.random.default_rng(2).normal(50, 30, (8, 16, 16))}
    assert intensity.looks_like_hu(volumes[kind]) is expected


def test_summary_counts_normalizations_and_warns_about_a_ct_window_on_mr(tmp_path):
    ct, _ = demo_ct.synthetic_case(np.random.default_rng(4), (8, 12, 12))
    (tmp_path / "in").mkdir()
    _write(ct, tmp_path / "in" / "ct.nii.gz")
    _write(_mr(), tmp_path / "in" / "mr.nii.gz")
    logged = []
    summary = ct_pipeline.run(str(tmp_path / "in"), str(tmp_path / "out"),
                              config=ct_transforms.CtPreprocessConfig(modality="ct"), pipeline_args=IN_PROCESS,
                              log=logged.append)
    assert summary["normalization"] == {"ct_window": 2, "zscore": 0} and summary["modality"] == "ct"
    assert summary["warnings"] == {"ct_window_on_non_hu_values": 1}
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"] == summary["warnings"]
    assert "warning: 1 case(s) ct window on non hu values (the workers' log names them; see summary.json)" in logged


def test_summary_records_what_the_scans_turned_out_to_be(tmp_path):
    """--modality auto records `auto`; `data_modality` records what the scans were: the DICOM tag, else CT from
    HU-like values (or MR), and the range the values mostly lie in (what predict checks new scans against)."""
    ct, _ = demo_ct.synthetic_case(np.random.default_rng(4), (8, 12, 12))
    (tmp_path / "in").mkdir()
    _write(ct, tmp_path / "in" / "ct.nii.gz")  # a volume file: CT from its values
    paths = demo_ct.write_dicom_series(_mr(), str(tmp_path / "in" / "brain"))
    for path in paths:  # an MR series says so in its Modality tag
        dataset = pydicom.dcmread(path)
        dataset.Modality = "MR"
        dataset.save_as(path)
    summary = ct_pipeline.run(str(tmp_path / "in"), str(tmp_path / "out"), pipeline_args=IN_PROCESS,
                              log=lambda line: None)
    assert summary["modality"] == "auto" and summary["ok"] == 2
    seen = summary["data_modality"]
    assert seen["modalities"] == {"CT": 1, "MR": 1}
    low, high = seen["intensity_range"]  # the lowest 1st and highest 99th percentile over the scans, as read
    assert abs(low - min(np.percentile(ct, 1), np.percentile(_mr(), 1))) <= 1  # whole numbers (Beam distributions)
    assert abs(high - max(np.percentile(ct, 99), np.percentile(_mr(), 99))) <= 1
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["data_modality"] == seen
