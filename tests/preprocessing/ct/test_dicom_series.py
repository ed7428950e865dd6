"""DICOM as scanners and PACS write it, and clinical label formats, on series written here with their quirks.

References are independent of the reader under test: the volume the series was
written from, GDCM (through SimpleITK) reading the uncompressed series, and
labels drawn analytically.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import EnhancedCTImageStorage, ExplicitVRLittleEndian, RTStructureSetStorage, generate_uid
from scipy import ndimage

from common import dead_letters
from preprocessing.ct import ct_io, ct_transforms, demo_ct, dicom_grouping, dicom_series, label_maps, label_pairing, volume_discovery

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPACING = (0.8, 0.9, 2.0)  # (x, y, z) mm
DIRECTION = (0, 1, 0, 1, 0, 0, 0, 0, -1)  # rows and columns swapped, slices running feet-wards
ORIGIN = (10.0, -20.0, 30.0)


def _volume(shape=(7, 16, 16), seed=0):
    volume, _ = demo_ct.synthetic_case(np.random.default_rng(seed), shape)
    return np.round(volume).astype(np.float32)  # the series stores integers: compare exactly


def _series(directory, volume, **kwargs):
    """A CT series with the attributes every real one has (frame of reference, patient and study modules)."""
    paths = demo_ct.write_dicom_series(volume, str(directory), kwargs.pop("spacing", SPACING), kwargs.pop("origin", ORIGIN),
                                       kwargs.pop("direction", DIRECTION), rng=np.random.default_rng(1))
    frame_of_reference = generate_uid()
    for path in paths:
        dataset = pydicom.dcmread(path)
        dataset.FrameOfReferenceUID = frame_of_reference
        dataset.PatientName, dataset.PatientBirthDate, dataset.PatientSex = "Anonymous^", "", "O"
        dataset.StudyDate, dataset.StudyTime, dataset.StudyID, dataset.AccessionNumber = "20260101", "120000", "1", ""
        dataset.ReferringPhysicianName, dataset.SeriesNumber, dataset.Manufacturer = "", 3, "fullres"
        dataset.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        for name, value in kwargs.items():
            setattr(dataset, name, value)
        dataset.save_as(path)
    return paths


def _move(path, z_mm):
    """Puts a slice at `z_mm` along the slice normal (the normal of DIRECTION is -z)."""
    dataset = pydicom.dcmread(path)
    dataset.ImagePositionPatient = [ORIGIN[0], ORIGIN[1], ORIGIN[2] - z_mm]
    dataset.save_as(path)


def _gdcm_reference(directory) -> sitk.Image:
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(directory)))
    return sitk.Cast(reader.Execute(), sitk.sitkFloat32)


def _assert_same_image(image, expected, atol=0.0):
    np.testing.assert_allclose(sitk.GetArrayFromImage(image), sitk.GetArrayFromImage(expected), atol=atol)
    np.testing.assert_allclose(image.GetSpacing(), expected.GetSpacing(), atol=1e-4)
    np.testing.assert_allclose(image.GetOrigin(), expected.GetOrigin(), atol=1e-4)
    np.testing.assert_allclose(image.GetDirection(), expected.GetDirection(), atol=1e-6)


def _discover_one(root):
    volumes, dead = volume_discovery.discover(str(root))
    assert dead == [] and len(volumes) == 1, (volumes, dead)
    return next(iter(volumes.items()))


def test_slice_jitter_within_tolerance_is_accepted(tmp_path):
    volume = _volume()
    paths = _series(tmp_path / "mr", volume)
    jitter = np.random.default_rng(2).uniform(-0.04, 0.04, len(paths))  # ±2 % of the 2 mm gap, as rounded positions give
    jitter[0] = 0.0
    for z, (path, shift) in enumerate(zip(paths, jitter)):
        _move(path, 2.0 * z + shift)
    case_id, source = _discover_one(tmp_path)
    assert case_id == "mr" and source.notes == ()
    image = ct_io.read_volume(source)
    np.testing.assert_array_equal(sitk.GetArrayFromImage(image), volume)  # no interpolation
    assert image.GetSpacing()[2] == pytest.approx(2.0, abs=0.05)
    # A tighter tolerance than the jitter resamples instead.
    assert dicom_series.slice_grid(np.sort(2.0 * np.arange(7) + jitter), 0.005)[1]


def _tilt(paths, degrees, jitter=None):
    """Shifts slice k along its column direction by k × 2 mm × tan(degrees) (+ jitter[k] mm): a gantry-tilted series
    as scanners write it, the slices still 2 mm apart along the table."""
    for k, path in enumerate(paths):
        dataset = pydicom.dcmread(path)
        column = np.asarray([float(v) for v in dataset.ImageOrientationPatient[3:]])
        shift = k * 2.0 * np.tan(np.radians(degrees)) + (0.0 if jitter is None else jitter[k])
        dataset.ImagePositionPatient = list(np.asarray([float(v) for v in dataset.ImagePositionPatient]) + shift * column)
        dataset.save_as(path)


def test_a_gantry_tilted_series_is_refused_not_stacked_off_its_positions(tmp_path):
    paths = _series(tmp_path / "tilted", _volume())
    _tilt(paths, 15.0)
    _, source = _discover_one(tmp_path)
    with pytest.raises(dead_letters.CaseError) as refused:
        ct_io.read_volume(source)
    assert refused.value.reason == "gantry_tilt"
    assert refused.value.detail.startswith(f"{paths[-1]} lies 3.22 mm (3.6 voxels) off the line through {paths[0]}")
    assert "a gantry tilt of 15.0°" in refused.value.detail and "dcm2niix" in refused.value.detail
    # Positions rounded in the plane (a few hundredths of a mm) are not a tilt: read as written.
    rounded = _series(tmp_path / "rounded", _volume())
    _tilt(rounded, 0.0, np.random.default_rng(3).uniform(-0.03, 0.03, len(rounded)))
    np.testing.assert_array_equal(sitk.GetArrayFromImage(ct_io.read_volume(_discover_one(tmp_path / "rounded")[1])),
                                  _volume())


def test_a_cd_export_with_its_dicomdir_and_desktop_litter_reads_its_series_and_fails_nothing(tmp_path):
    """A CD/PACS export as pydicom's FileSet writes it (DICOMDIR, files without extension in PT/ST/SE folders), with
    a Windows Thumbs.db and the index copied under another name: every series is read, nothing is a dead letter."""
    from pydicom.fileset import FileSet

    export = FileSet()
    for number in (1, 2):
        for path in _series(tmp_path / "written" / f"s{number}", _volume(seed=number), SeriesNumber=number,
                            SeriesInstanceUID=generate_uid()):
            export.add(pydicom.dcmread(path))
    export.write(str(tmp_path / "cd"))
    shutil.rmtree(tmp_path / "written")
    (tmp_path / "cd" / "Thumbs.db").write_bytes(b"\x00" * 64)
    shutil.copy(tmp_path / "cd" / "DICOMDIR", tmp_path / "cd" / "INDEX")
    volumes, dead = volume_discovery.discover(str(tmp_path / "cd"))
    assert dead == [] and len(volumes) == 2
    assert sorted(len(source.dicom_files) for source in volumes.values()) == [7, 7]
    # An empty file in the export is named as such (it was "not a readable DICOM" in pydicom's words).
    (tmp_path / "cd" / "IM_EMPTY").write_bytes(b"")
    _, dead = volume_discovery.discover(str(tmp_path / "cd"))
    assert [(d["reason"], d["detail"]) for d in dead] == [("empty_file", "the file is empty (0 bytes): a copy or "
                                                           "download that never wrote it; copy it again from its source")]


def test_missing_slice_is_resampled_from_true_positions_and_noted(tmp_path):
    volume = _volume()
    paths = _series(tmp_path / "scan", volume)
    os.remove(paths[3])  # slice 3 of 7 never arrived
    case_id, source = _discover_one(tmp_path)
    assert [(reason, os.path.basename(where)) for where, reason, _ in source.notes] == [("slices_resampled", "scan")]
    assert "2 to 4 mm" in source.notes[0][2] and "2 mm grid" in source.notes[0][2]
    image = ct_io.read_volume(source)
    resampled = sitk.GetArrayFromImage(image)
    assert resampled.shape == volume.shape and image.GetSpacing()[2] == pytest.approx(2.0)
    np.testing.assert_array_equal(resampled[[0, 1, 2, 4, 5, 6]], volume[[0, 1, 2, 4, 5, 6]])
    np.testing.assert_allclose(resampled[3], (volume[2] + volume[4]) / 2)  # linear, from the neighbours at 4 and 8 mm
    reference = _gdcm_reference(tmp_path / "scan")  # GDCM keeps the 6 slices; geometry of slice 0 must agree
    np.testing.assert_allclose(image.GetOrigin(), reference.GetOrigin(), atol=1e-4)
    np.testing.assert_allclose(image.GetDirection(), reference.GetDirection(), atol=1e-6)


def test_uneven_pitch_is_interpolated_at_the_true_positions(tmp_path):
    volume = np.repeat(np.arange(6, dtype=np.float32)[:, None, None] * 10, 8, 1).repeat(8, 2)  # value = 10 × slice
    positions = [0, 2, 4.7, 6, 8, 10]
    paths = _series(tmp_path / "uneven", volume)
    for path, z in zip(paths, positions):
        _move(path, z)
    _, source = _discover_one(tmp_path)
    resampled = sitk.GetArrayFromImage(ct_io.read_volume(source))[:, 0, 0]
    # On the 2 mm grid, 4 mm lies between 2 mm (10) and 4.7 mm (20): 10 + 10 × 2 / 2.7.
    np.testing.assert_allclose(resampled, [0, 10, 10 + 10 * 2 / 2.7, 30, 40, 50], rtol=1e-6)


def test_localizer_sharing_the_series_uid_is_set_aside_and_the_series_kept(tmp_path):
    volume = _volume()
    paths = _series(tmp_path / "study", volume)
    localizer = pydicom.dcmread(paths[0])
    localizer.SOPInstanceUID = localizer.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    localizer.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    localizer.ImageOrientationPatient = [0, 1, 0, 0, 0, -1]  # sagittal
    localizer.Rows, localizer.Columns = 12, 20
    localizer.PixelData = np.zeros((12, 20), np.int16).tobytes()
    localizer.save_as(str(tmp_path / "study" / "scout.dcm"))
    case_id, source = _discover_one(tmp_path)
    assert "scout.dcm" not in {os.path.basename(p) for p in source.dicom_files} and len(source.dicom_files) == 7
    assert [(os.path.basename(where), reason) for where, reason, _ in source.notes] == [("scout.dcm", "localizer")]
    _assert_same_image(ct_io.read_volume(source), _gdcm_reference_of(paths))


def _gdcm_reference_of(paths) -> sitk.Image:
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(sorted(paths, key=lambda p: -float(pydicom.dcmread(p).ImagePositionPatient[2])))
    return sitk.Cast(reader.Execute(), sitk.sitkFloat32)


def test_duplicate_file_is_dropped_and_noted_and_a_conflicting_one_refused(tmp_path):
    volume = _volume()
    paths = _series(tmp_path / "series", volume)
    shutil.copy(paths[2], tmp_path / "series" / "zz_copy_of_slice.dcm")  # a stray second export of one slice
    _, source = _discover_one(tmp_path)
    assert len(source.dicom_files) == 7
    (where, reason, detail), = source.notes
    assert reason == "duplicate_file" and os.path.basename(where) == "zz_copy_of_slice.dcm" and paths[2] in detail
    _assert_same_image(ct_io.read_volume(source), _gdcm_reference_of(paths))
    # The same position with other pixels: the series is refused, naming both files.
    conflicting = pydicom.dcmread(paths[2])
    conflicting.PixelData = (conflicting.pixel_array + 1).astype(np.int16).tobytes()
    conflicting.save_as(str(tmp_path / "series" / "zz_copy_of_slice.dcm"))
    _, source = _discover_one(tmp_path)  # the case stays, so that its label still pairs; reading refuses it
    with pytest.raises(dead_letters.CaseError, match="lie at the same position with different pixels") as error:
        ct_io.read_volume(source)
    assert error.value.reason == "duplicate_slice"
    assert paths[2] in error.value.detail and "zz_copy_of_slice.dcm" in error.value.detail


def _enhanced_ct(volume, path, frame_of_reference):
    """The volume as one Enhanced CT file: shared pixel measures and orientation, per-frame positions and rescale."""
    matrix = np.asarray(DIRECTION, float).reshape(3, 3)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = EnhancedCTImageStorage, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID = EnhancedCTImageStorage, meta.MediaStorageSOPInstanceUID
    dataset.StudyInstanceUID, dataset.SeriesInstanceUID, dataset.FrameOfReferenceUID = generate_uid(), generate_uid(), frame_of_reference
    dataset.Modality, dataset.SeriesNumber = "CT", 4
    dataset.Rows, dataset.Columns, dataset.NumberOfFrames = volume.shape[1], volume.shape[2], volume.shape[0]
    dataset.SamplesPerPixel, dataset.PhotometricInterpretation = 1, "MONOCHROME2"
    dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit, dataset.PixelRepresentation = 16, 16, 15, 1
    measures, orientation, shared = Dataset(), Dataset(), Dataset()
    measures.PixelSpacing, measures.SliceThickness = [SPACING[1], SPACING[0]], SPACING[2]
    orientation.ImageOrientationPatient = [*matrix[:, 0], *matrix[:, 1]]
    shared.PixelMeasuresSequence, shared.PlaneOrientationSequence = [measures], [orientation]
    dataset.SharedFunctionalGroupsSequence = [shared]
    order = np.random.default_rng(3).permutation(volume.shape[0])  # frames stored out of slice order
    groups, stored = [], []
    for z in order:
        position, transform, group = Dataset(), Dataset(), Dataset()
        position.ImagePositionPatient = list(np.asarray(ORIGIN) + z * SPACING[2] * matrix[:, 2])
        transform.RescaleSlope, transform.RescaleIntercept, transform.RescaleType = 1, -1024 - 5 * int(z), "HU"
        group.PlanePositionSequence, group.PixelValueTransformationSequence = [position], [transform]
        groups.append(group)
        stored.append((volume[z] + 1024 + 5 * int(z)).astype(np.int16))
    dataset.PerFrameFunctionalGroupsSequence = groups
    dataset.PixelData = np.stack(stored).tobytes()  # (frames, H, W)
    dataset.save_as(str(path), enforce_file_format=True)


def test_multi_frame_enhanced_ct_equals_the_single_frame_series(tmp_path):
    import highdicom

    volume = _volume()
    paths = _series(tmp_path / "single", volume)
    (tmp_path / "enhanced").mkdir(), (tmp_path / "legacy").mkdir()
    _enhanced_ct(volume, tmp_path / "enhanced" / "ct.dcm", str(pydicom.dcmread(paths[0]).FrameOfReferenceUID))
    # highdicom's own multi-frame writer (Legacy Converted Enhanced CT), as PACS conversions produce it.
    highdicom.legacy.LegacyConvertedEnhancedCTImage([pydicom.dcmread(p) for p in paths], generate_uid(), 7,
                                                    generate_uid(), 1).save_as(str(tmp_path / "legacy" / "ct.dcm"))
    volumes, dead = volume_discovery.discover(str(tmp_path))
    assert dead == [] and sorted(volumes) == ["enhanced", "legacy", "single"]
    assert [len(volumes[name].dicom_files) for name in ("enhanced", "legacy")] == [1, 1]
    single = ct_io.read_volume(volumes["single"])
    _assert_same_image(single, _gdcm_reference(tmp_path / "single"))
    for name in ("enhanced", "legacy"):
        multi_frame = ct_io.read_volume(volumes[name])
        _assert_same_image(multi_frame, single)
        np.testing.assert_array_equal(sitk.GetArrayFromImage(multi_frame), volume)


def _gdcm_transcode(path, syntax):
    import gdcm

    reader = gdcm.ImageReader()
    reader.SetFileName(path)
    assert reader.Read()
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(gdcm.TransferSyntax(syntax))
    change.SetInput(reader.GetImage())
    assert change.Change()
    writer = gdcm.ImageWriter()
    writer.SetFileName(path)
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()


@pytest.mark.parametrize("syntax", ["JPEG Lossless", "JPEG 2000 Lossless"])
def test_compressed_series_decode_to_the_uncompressed_pixels(tmp_path, syntax):
    import gdcm

    volume = _volume((5, 32, 32))  # JPEG 2000's default 6 resolution levels need 32 pixels a side
    plain = _series(tmp_path / "plain", volume)
    compressed = _series(tmp_path / "compressed", volume)
    for path in compressed:
        if syntax == "JPEG Lossless":  # pydicom cannot encode JPEG Lossless; GDCM can
            _gdcm_transcode(path, gdcm.TransferSyntax.JPEGLosslessProcess14_1)
        else:
            dataset = pydicom.dcmread(path)
            dataset.compress(pydicom.uid.JPEG2000Lossless)  # pylibjpeg-openjpeg encodes
            dataset.save_as(path)
    assert {pydicom.dcmread(p).file_meta.TransferSyntaxUID.name.split(",")[0] for p in compressed} == {
        "JPEG Lossless" if syntax == "JPEG Lossless" else "JPEG 2000 Image Compression (Lossless Only)"}
    volumes, dead = volume_discovery.discover(str(tmp_path))
    assert dead == []
    decoded = ct_io.read_volume(volumes["compressed"])
    _assert_same_image(decoded, ct_io.read_volume(volumes["plain"]))
    np.testing.assert_array_equal(sitk.GetArrayFromImage(decoded), volume)
    assert len(plain) == 5


def test_series_whose_uids_share_their_last_8_characters_get_distinct_ids(tmp_path):
    volume = _volume((3, 8, 8))
    root = tmp_path / "export"
    root.mkdir()
    for index, (uid, number) in enumerate([("1.2.826.0.1.3680043.8.498.1112345678", 2),
                                           ("1.2.826.0.1.3680043.8.498.2212345678", 2),
                                           ("1.2.826.0.1.3680043.8.498.3312345678", 5)]):
        for path in _series(tmp_path / f"tmp{index}", volume, SeriesInstanceUID=uid, SeriesNumber=number,
                            PatientName="Doe^Jane"):
            shutil.move(path, root / f"s{index}-{os.path.basename(path)}")  # all three series in one folder
    volumes, dead = volume_discovery.discover(str(root))
    assert dead == []
    assert sorted(volumes) == ["export-s2-112345678", "export-s2-212345678", "export-s5"]
    assert {volumes[i].series_uid[-10:] for i in volumes} == {"1112345678", "2212345678", "3312345678"}
    assert not any("doe" in case_id.lower() or "jane" in case_id.lower() for case_id in volumes)


def test_every_dicom_dead_letter_names_its_file(tmp_path):
    volume = _volume((3, 8, 8))
    paths = _series(tmp_path / "broken", volume)
    no_position = pydicom.dcmread(paths[0])
    del no_position.ImagePositionPatient
    no_position.save_as(paths[0])
    (tmp_path / "broken" / "garbage.dcm").write_bytes(b"not DICOM")
    lonely = _series(tmp_path / "lonely", volume[:1])
    volumes, dead = volume_discovery.discover(str(tmp_path))
    by_reason = {letter["reason"]: letter for letter in dead}
    assert sorted(by_reason) == ["missing_geometry", "too_few_slices", "unreadable"]
    assert by_reason["missing_geometry"]["source"] == paths[0] and "ImagePositionPatient" in by_reason["missing_geometry"]["detail"]
    assert by_reason["unreadable"]["source"].endswith("garbage.dcm")
    assert by_reason["too_few_slices"]["source"] == lonely[0]
    assert sorted(volumes) == ["broken"] and len(volumes["broken"].dicom_files) == 2


def _ellipse_truth(reference: sitk.Image, center_mm, radii_mm) -> np.ndarray:
    """(D, H, W) voxels whose centre lies inside an axis-aligned ellipsoid (mm), from the image geometry."""
    size = reference.GetSize()
    index = np.stack(np.meshgrid(*[np.arange(n) for n in size[::-1]], indexing="ij"), -1)[..., ::-1]  # (D, H, W, 3) x, y, z
    direction = np.asarray(reference.GetDirection()).reshape(3, 3)
    points = np.asarray(reference.GetOrigin()) + (index * reference.GetSpacing()) @ direction.T  # (D, H, W, 3) mm
    return (((points - center_mm) / radii_mm) ** 2).sum(-1) <= 1.0


def _within_one_voxel(mask, truth):
    structure = ndimage.generate_binary_structure(3, 3)
    boundary = ndimage.binary_dilation(truth, structure) & ~ndimage.binary_erosion(truth, structure)
    return not np.any((mask != truth) & ~boundary)


def _rtstruct(path, series_paths, rois):
    """An RTSTRUCT: `rois` maps ROI name -> list of (N, 3) closed planar contours in mm."""
    image = pydicom.dcmread(series_paths[0])
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = RTStructureSetStorage, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID = RTStructureSetStorage, meta.MediaStorageSOPInstanceUID
    dataset.Modality, dataset.SeriesInstanceUID, dataset.StudyInstanceUID = "RTSTRUCT", generate_uid(), image.StudyInstanceUID
    series, study, frame = Dataset(), Dataset(), Dataset()
    series.SeriesInstanceUID = image.SeriesInstanceUID
    study.RTReferencedSeriesSequence = [series]
    frame.FrameOfReferenceUID, frame.RTReferencedStudySequence = image.FrameOfReferenceUID, [study]
    dataset.ReferencedFrameOfReferenceSequence = [frame]
    dataset.StructureSetROISequence, dataset.ROIContourSequence = [], []
    for number, (name, contours) in enumerate(rois.items(), start=7):
        roi, roi_contour = Dataset(), Dataset()
        roi.ROINumber, roi.ROIName, roi.ReferencedFrameOfReferenceUID = number, name, image.FrameOfReferenceUID
        roi_contour.ReferencedROINumber, roi_contour.ContourSequence = number, []
        for points in contours:
            contour = Dataset()
            contour.ContourGeometricType, contour.NumberOfContourPoints = "CLOSED_PLANAR", len(points)
            contour.ContourData = [f"{v:.4f}" for v in np.asarray(points).reshape(-1)]
            roi_contour.ContourSequence.append(contour)
        dataset.StructureSetROISequence.append(roi)
        dataset.ROIContourSequence.append(roi_contour)
    dataset.save_as(str(path), enforce_file_format=True)


def _ellipse_contours(reference, center_mm, radii_mm, points=72):
    """One polygon per image slice that cuts the ellipsoid, in mm (the slice normal is z for DIRECTION)."""
    contours = []
    for z_index in range(reference.GetSize()[2]):
        z = reference.TransformIndexToPhysicalPoint((0, 0, z_index))[2]
        scale = 1 - ((z - center_mm[2]) / radii_mm[2]) ** 2
        if scale <= 0:
            continue
        angles = np.linspace(0, 2 * np.pi, points, endpoint=False)
        contours.append(np.stack([center_mm[0] + radii_mm[0] * np.sqrt(scale) * np.cos(angles),
                                  center_mm[1] + radii_mm[1] * np.sqrt(scale) * np.sin(angles),
                                  np.full(points, z)], -1))
    return contours


def test_rtstruct_is_rasterised_onto_the_series_grid(tmp_path):
    volume = _volume((9, 24, 24))
    paths = _series(tmp_path / "images" / "ct", volume)
    reference = ct_io.read_volume(_discover_one(tmp_path / "images")[1])
    centers = {"Liver": np.array([ORIGIN[0] + 6.0, ORIGIN[1] + 6.0, ORIGIN[2] - 8.0]),
               "GTV": np.array([ORIGIN[0] + 15.0, ORIGIN[1] + 14.0, ORIGIN[2] - 10.0])}
    radii = {"Liver": np.array([4.0, 4.0, 6.0]), "GTV": np.array([3.0, 4.0, 4.5])}  # apart: no overlap
    (tmp_path / "labels").mkdir()
    _rtstruct(tmp_path / "labels" / "rt.dcm", paths,
              {name: _ellipse_contours(reference, centers[name], radii[name]) for name in centers})
    volumes, dead = volume_discovery.discover(str(tmp_path / "images"))
    cases, pairing_dead = label_pairing.pair_with_labels(volumes, str(tmp_path / "labels"))  # RTSTRUCT under --labels
    assert dead == pairing_dead == [] and [c.case_id for c in cases] == ["ct"] and cases[0].label.dicom_label == "RTSTRUCT"
    label = ct_io.read_volume(cases[0].label, reference=reference, classes=("gtv", "liver"))
    array = sitk.GetArrayFromImage(label)
    for class_id, name in ((1, "GTV"), (2, "Liver")):
        truth = _ellipse_truth(reference, centers[name], radii[name])
        assert truth.sum() > 30 and _within_one_voxel(array == class_id, truth), name
        assert np.sum((array == class_id) != truth) < 0.1 * truth.sum(), name
    with pytest.raises(dead_letters.CaseError, match=r"names 'GTV' but the classes given are liver; list every name in "
                                              r"--classes \(e.g. --classes liver,GTV\)") as error:
        ct_io.read_volume(cases[0].label, reference=reference, classes=("liver",))
    assert error.value.reason == "unknown_segment"


def test_polygon_mask_takes_pixel_centres_and_holes():
    square = np.array([[1.5, 1.5], [5.5, 1.5], [5.5, 4.5], [1.5, 4.5]])  # (column, row)
    mask = ct_io.dicom_labels.polygon_mask(square, (7, 8))
    expected = np.zeros((7, 8), bool)
    expected[2:5, 2:6] = True  # centres 2..4 (rows) and 2..5 (columns) lie inside
    np.testing.assert_array_equal(mask, expected)


def test_dicom_seg_among_the_inputs_labels_its_series(tmp_path):
    import highdicom

    volume = _volume((6, 16, 16))
    paths = _series(tmp_path / "ct", volume)
    datasets = sorted((pydicom.dcmread(p) for p in paths), key=lambda d: -float(d.ImagePositionPatient[2]))
    truth = np.zeros((6, 16, 16, 2), bool)  # (slices in `datasets` order, H, W, segments)
    truth[1:4, 3:9, 4:10, 0] = True
    truth[2:5, 10:14, 9:13, 1] = True
    algorithm = highdicom.AlgorithmIdentificationSequence("test", highdicom.sr.CodedConcept("1", "99TEST", "t"), "1")
    descriptions = [highdicom.seg.SegmentDescription(
        number, name, highdicom.sr.CodedConcept("1", "99TEST", "organ"), highdicom.sr.CodedConcept("2", "99TEST", name),
        highdicom.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm) for number, name in ((1, "Liver"), (2, "Kidney"))]
    segmentation = highdicom.seg.Segmentation(
        datasets, truth, highdicom.seg.SegmentationTypeValues.BINARY, descriptions, generate_uid(), 9, generate_uid(), 1,
        "fullres", "test", "1", "1")
    segmentation.save_as(str(tmp_path / "ct" / "seg.dcm"))
    volumes, dead = volume_discovery.discover(str(tmp_path))
    cases, pairing_dead = label_pairing.pair_with_labels(volumes, None)
    assert dead == pairing_dead == [] and [(c.case_id, c.label.dicom_label) for c in cases] == [("ct", "SEG")]
    config = ct_transforms.CtPreprocessConfig(spacing=None, classes=("kidney", "liver"))
    record = ct_transforms.preprocess_case(cases[0], config)
    # The record is in LPS: flip the written order (slices feet-wards, rows/columns swapped) the same way.
    image = ct_io.read_volume(cases[0].image)
    expected = np.zeros(volume.shape, np.uint8)
    expected[truth[..., 1]], expected[truth[..., 0]] = 1, 2
    expected_image = sitk.GetImageFromArray(expected)
    expected_image.CopyInformation(image)
    np.testing.assert_array_equal(record.label, sitk.GetArrayFromImage(sitk.DICOMOrient(expected_image, "LPS")))
    assert (record.label == 1).sum() == truth[..., 1].sum() and (record.label == 2).sum() == truth[..., 0].sum()


@pytest.mark.slow
def test_preprocess_ct_command_on_a_scanner_export(tmp_path):
    """A folder as a PACS exports it: a series with a gap, a scout, a stray copy, and its RTSTRUCT."""
    volume = _volume((7, 16, 16))
    paths = _series(tmp_path / "export" / "CT1", volume)
    os.remove(paths[4])
    shutil.copy(paths[1], tmp_path / "export" / "CT1" / "copy.dcm")
    scout = pydicom.dcmread(paths[0])
    scout.SOPInstanceUID = scout.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    scout.ImageType, scout.ImageOrientationPatient = ["ORIGINAL", "PRIMARY", "LOCALIZER"], [0, 1, 0, 0, 0, -1]
    scout.save_as(str(tmp_path / "export" / "CT1" / "scout.dcm"))
    reference = ct_io.read_volume(ct_io.VolumeSource("", tuple(p for p in paths if os.path.exists(p))))
    center, radii = np.array([ORIGIN[0] + 7.0, ORIGIN[1] + 7.0, ORIGIN[2] - 6.0]), np.array([4.0, 4.0, 5.0])
    _rtstruct(tmp_path / "export" / "CT1" / "rtstruct.dcm", paths, {"Liver": _ellipse_contours(reference, center, radii)})
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "preprocess", "ct", "--input", str(tmp_path / "export"), "--output",
         str(tmp_path / "out"), "--spacing", "none", "--classes", "liver", "--spacing-tolerance", "0.05", "--workers", "1",
         "--direct_running_mode=in_memory"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 1 and summary["failed"] == 0
    assert summary["notes"] == {"duplicate_file": 1, "localizer": 1, "slices_resampled": 1}
    notes = json.loads((tmp_path / "out" / "notes.json").read_text())
    assert {(os.path.basename(n["source"]), n["reason"]) for n in notes} == {
        ("copy.dcm", "duplicate_file"), ("scout.dcm", "localizer"), ("CT1", "slices_resampled")}
    assert json.loads((tmp_path / "out" / "label_map.json").read_text()) == {"background": 0, "liver": 1}
    import tensorflow as tf

    from preprocessing.records import tfrecord_schema

    (record,) = [tfrecord_schema.parse_ct_example(r.numpy()) for r in
                 tf.data.TFRecordDataset(str(next((tmp_path / "out").glob("data-*.tfrecord"))))]
    assert record["case_id"].numpy() == b"CT1" and tuple(record["image"].shape) == (7, 16, 16, 1)
    truth = sitk.GetImageFromArray(_ellipse_truth(reference, center, radii).astype(np.uint8))
    truth.CopyInformation(reference)
    stored = record["label"].numpy()
    assert _within_one_voxel(stored == 1, sitk.GetArrayFromImage(sitk.DICOMOrient(truth, "LPS")).astype(bool))


def test_classes_from_a_label_map_file_and_refusals(tmp_path):
    (tmp_path / "label_map.json").write_text(json.dumps({"background": 0, "kidney": 2, "liver": 1}))
    assert label_maps.class_names(str(tmp_path / "label_map.json")) == ("liver", "kidney")
    assert label_maps.class_names("liver, kidney") == ("liver", "kidney")
    (tmp_path / "gap.json").write_text(json.dumps({"liver": 1, "kidney": 3}))
    with pytest.raises(ValueError, match=r"--classes .*gap.json must number its classes 1..2, got \[1, 3\]"):
        label_maps.class_names(str(tmp_path / "gap.json"))
    with pytest.raises(ValueError, match="--classes needs distinct, non-empty names"):
        ct_transforms.CtPreprocessConfig(classes=("liver", "Liver"))
    with pytest.raises(ValueError, match=r"--spacing-tolerance needs a fraction in \[0, 1\)"):
        ct_transforms.CtPreprocessConfig(spacing_tolerance=5)


def test_case_ids_stay_unique_for_groups_of_one_series_and_beside_other_volumes():
    def group(directory, uid, number):
        return dicom_grouping.SeriesGroup(directory, (f"{directory}/{uid}-{number}.dcm",), uid, number, "CT")

    groups = [group("/d/ct", "1.2.3.99912345678", "4"), group("/d/ct", "1.2.3.99912345678", "4"),  # two enhanced files
              group("/d/other", "1.2.3.5", "1")]
    # "other" is taken by a NIfTI volume: the series gets its UID's digits (all four of them) appended.
    assert dicom_grouping.case_ids(groups, taken={"other"}) == ["ct-s4-12345678", "ct-s4-12345678-2", "other-1235"]


@pytest.mark.parametrize("series_number", ["absent", "empty"])
def test_series_without_a_series_number_are_told_apart_by_their_uid_not_none(tmp_path, series_number):
    import re

    rng = np.random.default_rng(0)
    paths = []
    for name in ("a", "b"):  # two series in one folder, as exported from one study
        written = demo_ct.write_dicom_series(rng.normal(0, 50, (3, 8, 8)).astype(np.float32), str(tmp_path / name))
        for path in written:
            header = pydicom.dcmread(path)
            if series_number == "empty":
                header.SeriesNumber = None
            target = tmp_path / "ct" / f"{name}-{os.path.basename(path)}"
            target.parent.mkdir(exist_ok=True)
            header.save_as(target)
            paths.append(str(target))
    groups, _, dead = dicom_grouping.group_files(paths)
    assert not dead and [g.series_number for g in groups] == ["", ""]
    ids = dicom_grouping.case_ids(groups)
    uids = [re.sub(r"[^0-9]", "", g.series_uid) for g in groups]
    assert all("None" not in case_id for case_id in ids)
    assert all(case_id.startswith("ct-") and uid.endswith(case_id[3:]) for case_id, uid in zip(ids, uids))
