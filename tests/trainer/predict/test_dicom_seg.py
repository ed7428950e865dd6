"""DICOM SEG output, on CT series written here with pydicom: oblique, shuffled file names and InstanceNumbers.

The truth is the test's own geometry: the slice each source file was written
at. The SEG is read back with highdicom (and with fullres's SEG reader) and
compared with the mask voxel for voxel through the SOP instances it references,
so a SEG whose slices follow file names or InstanceNumbers fails.

No mark: no JAX, no Beam; the whole file takes about 10 s on 2 busy cores.
"""

import os

import highdicom
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, JPEG2000Lossless, generate_uid

from common import dead_letters
from common import output_guard
from preprocessing.ct import ct_io, volume_discovery
from trainer.predict import dicom_seg

CLASSES = ("liver", "tumour", "kidney")  # kidney is never predicted: an empty class
SPACING = (0.7, 0.8, 2.5)  # (x, y, z) mm
ORIGIN = np.array([-40.0, 12.5, 230.0])


def _rotation() -> np.ndarray:
    """An oblique orientation: columns are the row, column and slice-normal directions."""
    a, b = np.deg2rad(25.0), np.deg2rad(-15.0)
    about_z = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    about_x = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    return about_z @ about_x


def _write_series(directory, depth=12, rows=16, columns=20, seed=0, syntax=ExplicitVRLittleEndian) -> list[str]:
    """A CT series (CT Image IOD attributes); returns the paths in slice order (slice k at ORIGIN + k·2.5 mm·normal).

    File names and InstanceNumbers are two different shuffles, neither following position.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    rotation = _rotation()
    study, series, frame_of_reference = generate_uid(), generate_uid(), generate_uid()
    names, numbers = rng.permutation(depth), rng.permutation(depth)
    paths = []
    for z in range(depth):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        dataset = Dataset()
        dataset.file_meta = meta
        dataset.SOPClassUID, dataset.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        dataset.PatientName, dataset.PatientID, dataset.PatientBirthDate, dataset.PatientSex = "Test^Seg", "P1", "", "O"
        dataset.StudyInstanceUID, dataset.StudyDate, dataset.StudyTime, dataset.StudyID = study, "20260101", "120000", "1"
        dataset.AccessionNumber, dataset.ReferringPhysicianName = "", ""
        dataset.SeriesInstanceUID, dataset.SeriesNumber, dataset.Modality = series, 4, "CT"
        dataset.FrameOfReferenceUID, dataset.PositionReferenceIndicator = frame_of_reference, ""
        dataset.Manufacturer, dataset.ImageType, dataset.KVP = "ACME", ["ORIGINAL", "PRIMARY", "AXIAL"], "120"
        dataset.InstanceNumber = int(numbers[z]) + 1
        dataset.ImagePositionPatient = [f"{v:.4f}" for v in ORIGIN + z * SPACING[2] * rotation[:, 2]]
        dataset.ImageOrientationPatient = [f"{v:.6f}" for v in (*rotation[:, 0], *rotation[:, 1])]
        dataset.PixelSpacing, dataset.SliceThickness = [SPACING[1], SPACING[0]], SPACING[2]
        dataset.Rows, dataset.Columns, dataset.SamplesPerPixel, dataset.PhotometricInterpretation = rows, columns, 1, "MONOCHROME2"
        dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit, dataset.PixelRepresentation = 16, 16, 15, 1
        dataset.RescaleSlope, dataset.RescaleIntercept, dataset.RescaleType = 1, -1024, "HU"
        dataset.PixelData = (rng.integers(0, 2000, (rows, columns)) + 100 * z).astype(np.int16).tobytes()
        if syntax != ExplicitVRLittleEndian:
            dataset.compress(syntax)
        path = os.path.join(directory, f"IM{int(names[z]):04d}.dcm")
        dataset.save_as(path, enforce_file_format=True)
        paths.append(path)
    assert sorted(paths) != paths and sorted(paths, key=lambda p: int(pydicom.dcmread(p).InstanceNumber)) != paths
    return paths


def _read(directory):
    volumes, dead = volume_discovery.discover(str(directory))
    assert dead == [] and len(volumes) == 1
    source = next(iter(volumes.values()))
    return source, ct_io.read_volume(source)


def _mask_on(image, foreground) -> sitk.Image:
    """Class ids on `image`'s grid: foreground is {class id: [(z, rows slice, columns slice), ...]}."""
    labels = np.zeros(sitk.GetArrayViewFromImage(image).shape, np.uint8)  # (D, H, W)
    for class_id, boxes in foreground.items():
        for z, rows, columns in boxes:
            labels[z, rows, columns] = class_id
    mask = sitk.GetImageFromArray(labels)
    mask.CopyInformation(image)
    return mask


def _by_position(paths) -> list[str]:
    """SOPInstanceUIDs in the test's own slice order (position along the normal), independent of fullres."""
    normal = _rotation()[:, 2]
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in paths]
    headers.sort(key=lambda h: float(np.dot(np.asarray(h.ImagePositionPatient, float), normal)))
    return [str(h.SOPInstanceUID) for h in headers]


def _assert_frames_on_slices(segmentation, paths, labels):
    """Each SEG frame sits at its source instance's position; per instance, the segments equal `labels`' slice."""
    positions = {str(h.SOPInstanceUID): np.asarray(h.ImagePositionPatient, float)
                 for h in (pydicom.dcmread(p, stop_before_pixels=True) for p in paths)}
    for group in segmentation.PerFrameFunctionalGroupsSequence:
        source = str(group.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID)
        np.testing.assert_allclose(np.asarray(group.PlanePositionSequence[0].ImagePositionPatient, float),
                                   positions[source], atol=1e-3)
    read_back = segmentation.get_pixels_by_source_instance(
        _by_position(paths), combine_segments=True, assert_missing_frames_are_empty=True)  # (D, H, W)
    np.testing.assert_array_equal(read_back, labels)


@pytest.fixture(scope="module")
def oblique(tmp_path_factory):
    """A shuffled oblique series, its files in slice order, what fullres reads from it, and a mask on that grid."""
    directory = tmp_path_factory.mktemp("series") / "ct"
    paths = _write_series(directory)
    source, image = _read(directory)
    mask = _mask_on(image, {1: [(2, slice(3, 9), slice(4, 12)), (3, slice(5, 10), slice(2, 7))],
                            2: [(7, slice(0, 4), slice(15, 20)), (3, slice(12, 16), slice(0, 3))]})
    return paths, source, image, mask


def test_seg_references_the_series_and_its_frames_land_on_the_right_slices(oblique, tmp_path):
    paths, source, image, mask = oblique
    np.testing.assert_allclose(image.GetOrigin(), ORIGIN, atol=1e-3)  # slice 0 of the grid is the test's slice 0
    sitk.WriteImage(mask, str(tmp_path / "ct.nii.gz"))  # as predict writes it: the oblique affine in float32
    mask = sitk.ReadImage(str(tmp_path / "ct.nii.gz"))
    output = dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES, str(tmp_path / "out" / "ct.seg.dcm"),
                                       algorithm_parameters={"model": "run-7"})
    segmentation = highdicom.seg.segread(output)
    first = pydicom.dcmread(paths[0], stop_before_pixels=True)
    referenced = segmentation.ReferencedSeriesSequence[0]
    assert referenced.SeriesInstanceUID == first.SeriesInstanceUID == source.series_uid
    assert {str(i.ReferencedSOPInstanceUID) for i in referenced.ReferencedInstanceSequence} == set(_by_position(paths))
    assert (segmentation.StudyInstanceUID, segmentation.FrameOfReferenceUID) == (first.StudyInstanceUID,
                                                                                 first.FrameOfReferenceUID)
    assert segmentation.SegmentationType == "BINARY" and segmentation.SeriesNumber == 1004
    assert segmentation.get_segment_numbers() == [1, 2, 3]
    descriptions = [segmentation.get_segment_description(n) for n in (1, 2, 3)]
    assert [d.segment_label for d in descriptions] == list(CLASSES)
    assert {d.algorithm_type.value for d in descriptions} == {"AUTOMATIC"}
    algorithm = descriptions[0].SegmentationAlgorithmIdentificationSequence[0]
    assert (algorithm.AlgorithmName, algorithm.AlgorithmVersion) == ("fullres", dicom_seg.fullres_version())
    assert descriptions[0].segmented_property_type.value == "85756007"  # SNOMED CT Tissue
    # Only frames with foreground are stored: 2 slices of liver, 2 of tumour, none of the empty kidney class.
    numbers = [int(g.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
               for g in segmentation.PerFrameFunctionalGroupsSequence]
    assert sorted(numbers) == [1, 1, 2, 2]
    _assert_frames_on_slices(segmentation, paths, sitk.GetArrayFromImage(mask))
    # fullres's own SEG reader puts it back on the image grid, voxel for voxel.
    label = ct_io.read_volume(ct_io.VolumeSource(output, (output,), source.series_uid, "SEG"), reference=image,
                              classes=CLASSES)
    np.testing.assert_array_equal(sitk.GetArrayFromImage(label), sitk.GetArrayFromImage(mask))


def test_seg_of_a_compressed_series(tmp_path):
    paths = _write_series(tmp_path / "j2k", depth=5, rows=32, columns=32, syntax=JPEG2000Lossless)  # JPEG 2000: 32 px a side
    assert {pydicom.dcmread(p).file_meta.TransferSyntaxUID for p in paths} == {JPEG2000Lossless}
    source, image = _read(tmp_path / "j2k")
    mask = _mask_on(image, {1: [(1, slice(0, 8), slice(0, 8))], 2: [(4, slice(20, 32), slice(10, 30))]})
    output = dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES[:2], str(tmp_path / "j2k.seg.dcm"))
    _assert_frames_on_slices(highdicom.seg.segread(output), paths, sitk.GetArrayFromImage(mask))


def test_uneven_series_frames_take_the_mask_slice_at_their_true_position(tmp_path):
    paths = _write_series(tmp_path / "gap", depth=7, seed=3)
    os.remove(paths[3])  # a slice that never arrived: the reader interpolates slice 3 from 2 and 4
    source, image = _read(tmp_path / "gap")
    assert image.GetSize()[2] == 7
    mask = _mask_on(image, {1: [(z, slice(0, 16), slice(z, z + 2)) for z in range(7)]})  # a different column per slice
    output = dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES[:1], str(tmp_path / "gap.seg.dcm"))
    kept = [path for z, path in enumerate(paths) if z != 3]
    _assert_frames_on_slices(highdicom.seg.segread(output), kept, sitk.GetArrayFromImage(mask)[[0, 1, 2, 4, 5, 6]])


def test_an_empty_prediction_is_still_a_seg_of_the_series(oblique, tmp_path):
    paths, source, image, _ = oblique
    output = dicom_seg.write_dicom_seg(_mask_on(image, {}), source.dicom_files, CLASSES, str(tmp_path / "empty.dcm"))
    segmentation = highdicom.seg.segread(output)
    assert [segmentation.get_segment_description(n).segment_label for n in (1, 2, 3)] == list(CLASSES)
    _assert_frames_on_slices(segmentation, paths, np.zeros(sitk.GetArrayViewFromImage(image).shape, np.uint8))


def test_a_mask_off_the_series_grid_is_refused_in_one_sentence(oblique, tmp_path):
    _, source, image, mask = oblique
    flipped = sitk.Flip(mask, (False, False, True))  # same voxels, z axis reversed: the classic flipped mask
    cropped = mask[:, :, :-1]
    for wrong, fields in ((flipped, "its origin"), (cropped, "its size [20, 16, 11] (the series: [20, 16, 12])")):
        with pytest.raises(dead_letters.CaseError) as error:
            dicom_seg.write_dicom_seg(wrong, source.dicom_files, CLASSES, str(tmp_path / "wrong.dcm"))
        assert error.value.reason == "geometry_mismatch" and "not on the grid of series" in error.value.detail
        assert fields in error.value.detail
        assert "map the prediction back onto the image" in error.value.detail and error.value.detail.count(". ") == 0
    with pytest.raises(dead_letters.CaseError, match="class ids \\[2\\] but only 1 class names"):
        dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES[:1], str(tmp_path / "ids.dcm"))
    assert not os.path.exists(tmp_path / "wrong.dcm") and not os.path.exists(tmp_path / "ids.dcm")


def test_a_source_without_frame_of_reference_is_named(tmp_path):
    paths = _write_series(tmp_path / "nofor", depth=3)
    broken = pydicom.dcmread(paths[1])
    del broken.FrameOfReferenceUID
    broken.save_as(paths[1])
    mask = sitk.Image(20, 16, 3, sitk.sitkUInt8)
    with pytest.raises(dead_letters.CaseError) as error:
        dicom_seg.write_dicom_seg(mask, paths, CLASSES, str(tmp_path / "seg.dcm"))
    assert error.value.reason == "missing_reference"
    assert error.value.detail.startswith(f"{paths[1]} has no FrameOfReferenceUID")


def test_only_a_seg_fullres_wrote_is_replaced(oblique, tmp_path):
    _, source, _, mask = oblique
    output = tmp_path / "case.dcm"
    output.write_bytes(b"someone else's file")
    with pytest.raises(output_guard.OutputRefused, match="is not a DICOM SEG fullres wrote"):
        dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES, str(output))
    assert output.read_bytes() == b"someone else's file"
    output.unlink()
    first_uid = highdicom.seg.segread(dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES, str(output))).SOPInstanceUID
    second_uid = highdicom.seg.segread(dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES, str(output))).SOPInstanceUID
    assert first_uid != second_uid and sorted(os.listdir(tmp_path)) == ["case.dcm"]  # replaced, no temporary left


@pytest.mark.parametrize("names, message", [((), "class_names is empty"), (("liver", "liver"), "repeat"),
                                            (("a" * 65,), "cannot be a DICOM SegmentLabel")])
def test_class_names_that_cannot_be_segment_labels(oblique, tmp_path, names, message):
    _, source, image, _ = oblique
    with pytest.raises(ValueError, match=message):
        dicom_seg.write_dicom_seg(_mask_on(image, {}), source.dicom_files, names, str(tmp_path / "seg.dcm"))


def test_seg_of_a_multi_frame_source_names_its_frames(tmp_path):
    paths = _write_series(tmp_path / "single", depth=6, seed=5)
    (tmp_path / "enhanced").mkdir()
    shuffled = [pydicom.dcmread(p) for p in sorted(paths)]  # frames in file-name order, not slice order
    highdicom.legacy.LegacyConvertedEnhancedCTImage(shuffled, generate_uid(), 7, generate_uid(), 1).save_as(
        str(tmp_path / "enhanced" / "ct.dcm"))
    source, image = _read(tmp_path / "enhanced")
    mask = _mask_on(image, {1: [(0, slice(0, 5), slice(0, 5)), (4, slice(8, 16), slice(10, 20))],
                            2: [(5, slice(2, 6), slice(2, 6))]})
    segmentation = highdicom.seg.segread(
        dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES[:2], str(tmp_path / "seg.dcm")))
    enhanced = pydicom.dcmread(source.dicom_files[0], stop_before_pixels=True)
    normal = _rotation()[:, 2]
    labels, found = sitk.GetArrayFromImage(mask), set()
    for index, group in enumerate(segmentation.PerFrameFunctionalGroupsSequence):
        frame_number = int(group.DerivationImageSequence[0].SourceImageSequence[0].ReferencedFrameNumber)
        source_group = enhanced.PerFrameFunctionalGroupsSequence[frame_number - 1]
        position = np.asarray(source_group.PlanePositionSequence[0].ImagePositionPatient, float)
        np.testing.assert_allclose(np.asarray(group.PlanePositionSequence[0].ImagePositionPatient, float), position, atol=1e-3)
        z = int(round(np.dot(position - ORIGIN, normal) / SPACING[2]))  # the test's own slice of that source frame
        number = int(group.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
        np.testing.assert_array_equal(segmentation.get_frame(index + 1), labels[z] == number)
        found.add((number, z))
    assert found == {(1, 0), (1, 4), (2, 5)}


def test_anonymised_series_without_patient_and_study_attributes(tmp_path):
    """fullres's demo series, like many anonymised exports, lacks PatientName, StudyDate...: the SEG leaves them empty."""
    from preprocessing.ct import demo_ct

    paths = demo_ct.write_dicom_series(np.zeros((4, 8, 10)), str(tmp_path / "demo"), rng=np.random.default_rng(0))
    assert "PatientName" not in pydicom.dcmread(paths[0])
    source, image = _read(tmp_path / "demo")
    mask = _mask_on(image, {1: [(2, slice(1, 4), slice(2, 6))]})
    segmentation = highdicom.seg.segread(
        dicom_seg.write_dicom_seg(mask, source.dicom_files, CLASSES[:1], str(tmp_path / "seg.dcm")))
    assert (segmentation.PatientName, segmentation.PatientID, segmentation.StudyDate) == ("", "fullres-demo", "")
    uids = [str(h.SOPInstanceUID) for h in sorted((pydicom.dcmread(p) for p in paths),
                                                  key=lambda h: float(h.ImagePositionPatient[2]))]
    np.testing.assert_array_equal(segmentation.get_pixels_by_source_instance(
        uids, combine_segments=True, assert_missing_frames_are_empty=True), sitk.GetArrayFromImage(mask))


def test_a_one_part_patient_name_is_not_printed_by_a_warning(tmp_path):
    """highdicom warns that "JANEDOE7731" is "unlikely to represent the intended person name", quoting it: on the
    terminal of a predict run. The SEG keeps the name as the source has it; no warning carries it."""
    import warnings

    paths = _write_series(tmp_path / "series", depth=4)
    for path in paths:
        header = pydicom.dcmread(path)
        header.PatientName = "JANEDOE7731"
        header.save_as(path)
    source, image = _read(tmp_path / "series")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = dicom_seg.write_dicom_seg(_mask_on(image, {1: [(1, slice(2, 5), slice(3, 7))]}), source.dicom_files,
                                            CLASSES[:1], str(tmp_path / "seg.dcm"))
    assert [str(w.message) for w in caught if "JANEDOE7731" in str(w.message)] == []
    assert highdicom.seg.segread(written).PatientName == "JANEDOE7731"


def test_other_refusals_name_the_file_or_field(oblique, tmp_path):
    paths, source, image, mask = oblique
    probabilities = sitk.Cast(mask, sitk.sitkFloat32) * 0.5
    with pytest.raises(dead_letters.CaseError, match="holds non-integer values; pass class ids") as error:
        dicom_seg.write_dicom_seg(probabilities, source.dicom_files, CLASSES, str(tmp_path / "seg.dcm"))
    assert error.value.reason == "not_class_ids"
    with pytest.raises(dead_letters.CaseError, match="no DICOM files were given"):
        dicom_seg.write_dicom_seg(mask, (), CLASSES, str(tmp_path / "seg.dcm"))
    # One file of the series claims another study: highdicom refuses, and the sentence names the series' file.
    copies = _write_series(tmp_path / "two-studies", depth=12)
    stray = pydicom.dcmread(copies[5])
    stray.StudyInstanceUID = generate_uid()
    stray.save_as(copies[5])
    other, other_image = _read(tmp_path / "two-studies")
    with pytest.raises(dead_letters.CaseError, match="highdicom cannot build a DICOM SEG referencing the series of") as error:
        dicom_seg.write_dicom_seg(_mask_on(other_image, {}), other.dicom_files, CLASSES, str(tmp_path / "seg.dcm"))
    assert error.value.reason == "seg_refused" and copies[0] in error.value.detail
    # Two multi-frame files as one volume: a SEG references one multi-frame source.
    halves = [pydicom.dcmread(p) for p in paths]
    for number, part in enumerate((halves[:6], halves[6:])):
        highdicom.legacy.LegacyConvertedEnhancedCTImage(part, generate_uid(), 7, generate_uid(), number + 1).save_as(
            str(tmp_path / f"part{number}.dcm"))
    parts = [str(tmp_path / "part0.dcm"), str(tmp_path / "part1.dcm")]
    with pytest.raises(dead_letters.CaseError, match="is made of 2 multi-frame files") as error:
        dicom_seg.write_dicom_seg(mask, parts, CLASSES, str(tmp_path / "seg.dcm"))
    assert error.value.reason == "mixed_multiframe" and not os.path.exists(tmp_path / "seg.dcm")
