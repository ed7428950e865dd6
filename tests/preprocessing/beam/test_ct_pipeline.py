"""CT preprocessing: readers, transforms and the Beam pipeline, against independent references."""

import dataclasses
import json
import os

import apache_beam as beam
import numpy as np
import pytest
import SimpleITK as sitk
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from common import dead_letters
from preprocessing.beam import conversion, counting, ct_pipeline, local_workers
from preprocessing.ct import ct_io, ct_transforms, demo_ct, geometry, label_pairing, volume_discovery
from preprocessing.records import tfrecord_schema
from tests import hostile_inputs
from trainer.data import ct_input

IN_PROCESS = [f"--runner={local_workers.LOCAL_RUNNER}", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
SPACING = (0.8, 0.9, 2.5)  # anisotropic, (x, y, z) mm
DIRECTION = (0, 1, 0, 1, 0, 0, 0, 0, -1)  # rows and columns swapped, slices running feet-wards
ORIGIN = (10.0, -20.0, 30.0)
CONFIG = ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 2.0), window=(-200.0, 300.0), shape=(16, 24, 24))


def _image(volume, spacing=SPACING, origin=ORIGIN, direction=DIRECTION):
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(direction)
    return image


def _reference(image: sitk.Image, label: sitk.Image, config):
    """Independent reference: ITK's filters spelled out step by step, then NumPy windowing and centring."""
    oriented = sitk.DICOMOrientImageFilter()
    oriented.SetDesiredCoordinateOrientation(config.orientation)
    image, label = oriented.Execute(image), oriented.Execute(label)
    arrays = []
    for volume, interpolator, default, pixel in ((image, sitk.sitkLinear, -1024.0, sitk.sitkFloat32),
                                                 (label, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)):
        resampler = sitk.ResampleImageFilter()
        resampler.SetOutputSpacing(config.spacing)
        resampler.SetSize([int(round(n * s / t)) for n, s, t in zip(volume.GetSize(), volume.GetSpacing(), config.spacing)])
        resampler.SetOutputOrigin(volume.GetOrigin())
        resampler.SetOutputDirection(volume.GetDirection())
        resampler.SetInterpolator(interpolator)
        resampler.SetDefaultPixelValue(default)
        resampler.SetOutputPixelType(pixel)
        arrays.append(sitk.GetArrayFromImage(resampler.Execute(volume)))
    low, high = config.window
    scaled = (np.clip(arrays[0], low, high) - low) / (high - low)
    out_image, out_label = np.zeros(config.shape, np.float32), np.zeros(config.shape, np.uint8)
    for source, target in ((scaled, out_image), (arrays[1], out_label)):
        src, dst = [], []
        for n, t in zip(source.shape, config.shape):
            if n >= t:
                src.append(slice((n - t) // 2, (n - t) // 2 + t))
                dst.append(slice(0, t))
            else:
                src.append(slice(0, n))
                dst.append(slice((t - n) // 2, (t - n) // 2 + n))
        target[tuple(dst)] = source[tuple(src)]
    return out_image, out_label


def _read_output(pattern):
    records = {}
    for example in ct_input.read_examples(pattern):
        records[example["case_id"]] = (example["image"][..., 0], example["label"])
    return records


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """A NIfTI case (NRRD label) and a DICOM case (shuffled file order, NIfTI label), with their inputs."""
    root = tmp_path_factory.mktemp("ct")
    rng = np.random.default_rng(0)
    inputs = {}
    (root / "images").mkdir(), (root / "labels").mkdir()
    volume, label = demo_ct.synthetic_case(rng, (14, 20, 22))
    sitk.WriteImage(_image(volume), str(root / "images" / "nifti7.nii.gz"))
    sitk.WriteImage(_image(label), str(root / "labels" / "nifti7.nrrd"))
    # The reference reads the very files the pipeline reads: NIfTI keeps geometry in float32,
    # which moves nearest-neighbour ties of the label compared with the in-memory image.
    inputs["nifti7"] = (sitk.ReadImage(str(root / "images" / "nifti7.nii.gz"), sitk.sitkFloat32),
                        sitk.ReadImage(str(root / "labels" / "nifti7.nrrd"), sitk.sitkUInt8))
    volume, label = demo_ct.synthetic_case(rng, (12, 18, 20))
    demo_ct.write_dicom_series(volume, str(root / "images" / "dicom3"), SPACING, ORIGIN, DIRECTION, rng=rng)
    sitk.WriteImage(_image(label), str(root / "labels" / "dicom3.nii.gz"))
    reader = sitk.ImageSeriesReader()  # GDCM's own slice ordering: an independent DICOM reader
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(root / "images" / "dicom3")))
    inputs["dicom3"] = (sitk.Cast(reader.Execute(), sitk.sitkFloat32),
                        sitk.ReadImage(str(root / "labels" / "dicom3.nii.gz"), sitk.sitkUInt8))
    return root, inputs


def test_round_trip_equals_independent_reference(cases, tmp_path):
    root, inputs = cases
    summary = ct_pipeline.run(str(root / "images"), str(tmp_path / "out"), labels=str(root / "labels"),
                              config=CONFIG, pipeline_args=IN_PROCESS, log=lambda line: None)
    assert summary["ok"] == 2 and summary["failed"] == 0
    records = _read_output(str(tmp_path / "out" / "data-*.tfrecord"))
    assert sorted(records) == ["dicom3", "nifti7"]
    for case_id, (image, label) in inputs.items():
        expected_image, expected_label = _reference(image, label, CONFIG)
        # The reference's 1e-5, plus what the records' int16 storage rounds (half a step of peak / 32767).
        rounding = 0.5 * np.abs(expected_image).max() / 32767
        np.testing.assert_allclose(records[case_id][0], expected_image, atol=1e-5 + rounding, err_msg=case_id)
        np.testing.assert_array_equal(records[case_id][1], expected_label, err_msg=case_id)
        assert expected_label.any()  # the organs survived resampling and cropping


def test_record_keeps_geometry(cases):
    root, _ = cases
    images, _ = volume_discovery.discover(str(root / "images"))
    case = ct_io.CaseSource("nifti7", images["nifti7"], ct_io.VolumeSource(str(root / "labels" / "nifti7.nrrd")))
    record = ct_transforms.preprocess_case(case, CONFIG)
    assert record.spacing == pytest.approx((1.0, 1.0, 2.0))
    assert record.direction == pytest.approx((1, 0, 0, 0, 1, 0, 0, 0, 1))  # canonical LPS
    assert record.source_path.endswith("nifti7.nii.gz")
    # The stored origin is where output voxel (0, 0, 0) sits: voxel index -> physical point agrees.
    oriented = sitk.DICOMOrient(sitk.ReadImage(str(root / "images" / "nifti7.nii.gz")), "LPS")
    size = [int(round(n * s / t)) for n, s, t in zip(oriented.GetSize(), oriented.GetSpacing(), CONFIG.spacing)]
    start_xyz = [(n - t) // 2 for n, t in zip(size, CONFIG.shape[::-1])]
    expected = np.array(oriented.GetOrigin()) + np.array(start_xyz) * np.array(CONFIG.spacing)
    np.testing.assert_allclose(record.origin, expected, atol=1e-6)


def _dicom_case(root, name, positions_mm=None, duplicate=False):
    volume, _ = demo_ct.synthetic_case(np.random.default_rng(5), (6, 8, 8))
    paths = demo_ct.write_dicom_series(volume, str(root / name), spacing=(1.0, 1.0, 2.0))
    if duplicate:  # a second file at slice 2's position with other pixels (an identical copy is dropped instead)
        import pydicom
        dataset = pydicom.dcmread(paths[2])
        dataset.PixelData = (dataset.pixel_array + 7).astype(dataset.pixel_array.dtype).tobytes()
        dataset.save_as(str(root / name / "copy.dcm"))
    if positions_mm is not None:
        import pydicom
        for path, z in zip(paths, positions_mm):
            dataset = pydicom.dcmread(path)
            dataset.ImagePositionPatient = [0, 0, z]
            dataset.save_as(path)
    return paths


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """One good case and one of every bad kind, in a single input tree."""
    root = tmp_path_factory.mktemp("bad")
    images, labels = root / "images", root / "labels"
    images.mkdir(), labels.mkdir()
    good, good_label = demo_ct.synthetic_case(np.random.default_rng(1), (8, 12, 12))
    for name in ("good1", "good2"):
        sitk.WriteImage(_image(good), str(images / f"{name}.nii.gz"))
        sitk.WriteImage(_image(good_label), str(labels / f"{name}.nii.gz"))
    (images / "corrupt.nii.gz").write_bytes(b"not a nifti file")
    (labels / "corrupt.nii.gz").write_bytes(b"")
    (images / "notes.dcm").write_bytes(b"neither DICOM nor anything else")
    (images / "empty.nii.gz").write_bytes(b"")  # an empty file
    sitk.WriteImage(_image(good_label), str(labels / "empty.nii.gz"))
    # A missing slice and uneven gaps are resampled, not refused: tests/preprocessing/ct/test_dicom_series.py.
    _dicom_case(images, "duplicate_slice", duplicate=True)
    for name in ("duplicate_slice",):
        sitk.WriteImage(_image(np.zeros((6, 8, 8), np.uint8)), str(labels / f"{name}.nii.gz"))
    sitk.WriteImage(_image(good), str(images / "shape_mismatch.nii.gz"))
    sitk.WriteImage(_image(np.zeros((8, 12, 10), np.uint8)), str(labels / "shape_mismatch.nii.gz"))
    sitk.WriteImage(_image(good), str(images / "moved.nii.gz"))
    sitk.WriteImage(_image(good_label, origin=(50.0, 0.0, 0.0)), str(labels / "moved.nii.gz"))
    sitk.WriteImage(_image(good), str(images / "unlabelled.nii.gz"))
    with_nan = good.copy()
    with_nan[2, 3, 4] = np.nan
    sitk.WriteImage(_image(with_nan), str(images / "nan.nii.gz"))
    sitk.WriteImage(_image(good_label), str(labels / "nan.nii.gz"))
    return root


EXPECTED_REASONS = {
    "corrupt.nii.gz": "unreadable",
    "notes.dcm": "unreadable",
    "empty.nii.gz": "empty_file",
    "duplicate_slice": "duplicate_slice",
    "shape_mismatch.nii.gz": "geometry_mismatch",
    "moved.nii.gz": "geometry_mismatch",
    "unlabelled.nii.gz": "missing_label",
    "nan.nii.gz": "non_finite_voxels",
}


def test_every_bad_case_is_a_dead_letter_and_no_good_case_is_lost(bad_inputs, tmp_path):
    with pytest.raises(conversion.PreprocessingFailed, match=r"8 of 10 inputs failed \(80%\), more than "
                                                              r"--max-failed-fraction 0.1; see .*dead_letter.jsonl"):
        ct_pipeline.run(str(bad_inputs / "images"), str(tmp_path / "out"), labels=str(bad_inputs / "labels"),
                        config=CONFIG, pipeline_args=IN_PROCESS, log=lambda line: None)
    output = tmp_path / "out"
    letters = [json.loads(line) for line in (output / "dead_letter.jsonl").read_text().splitlines()]
    by_source = {os.path.basename(letter["source"]): letter for letter in letters}
    assert {name: letter["reason"] for name, letter in by_source.items()} == EXPECTED_REASONS
    assert all(letter["stage"] and letter["detail"] for letter in letters)
    assert sorted(_read_output(str(output / "data-*.tfrecord"))) == ["good1", "good2"]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["failed"] == 8
    assert summary["reasons"]["geometry_mismatch"] == 2 and summary["reasons"]["unreadable"] == 2


def test_empty_input_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no CT volumes \(DICOM, .nii.gz, .*\) found under"):
        ct_pipeline.run(str(tmp_path / "empty"), str(tmp_path / "out"), pipeline_args=IN_PROCESS)


def test_rerun_replaces_output_whole(bad_inputs, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "data-00000-of-00009.tfrecord").write_bytes(b"stale shard of an earlier run")
    ct_pipeline.run(str(bad_inputs / "images" / "good1.nii.gz"), str(output), config=CONFIG,
                    pipeline_args=IN_PROCESS, log=lambda line: None)
    assert sorted(os.listdir(output)) == [".fullres-output", "data-00000-of-00001.tfrecord", "dead_letter.jsonl",
                                          "summary.json"]
    assert [p for p in os.listdir(tmp_path) if p != "out"] == []  # no staging or old directories left


def test_preprocess_fn_in_test_pipeline(bad_inputs):
    images, _ = volume_discovery.discover(str(bad_inputs / "images"))
    good = ct_io.CaseSource("good1", images["good1"])
    corrupt = ct_io.CaseSource("corrupt", images["corrupt"])
    with TestPipeline(argv=IN_PROCESS) as pipeline:
        outputs = (
            pipeline
            | beam.Create([good, corrupt])
            | beam.ParDo(ct_pipeline.PreprocessCaseFn(CONFIG)).with_outputs(counting.DEAD_LETTER, main="records")
        )
        case_ids = outputs.records | beam.Map(lambda data: tfrecord_schema.parse_ct_example(data)["case_id"].numpy())
        assert_that(case_ids, equal_to([b"good1"]), label="records")
        reasons = outputs[counting.DEAD_LETTER] | beam.Map(lambda letter: letter["reason"])
        assert_that(reasons, equal_to(["unreadable"]), label="dead_letters")


@pytest.mark.parametrize(
    "shape, size, start",
    [((4, 6, 6), (4, 4, 8), (0, 1, -1)), ((5, 5, 5), (3, 7, 5), (1, -1, 0)), ((5, 5, 5), (6, 4, 5), (0, 0, 0))],
)
def test_crop_or_pad_centres(shape, size, start):
    array = np.arange(np.prod(shape)).reshape(shape)
    output, origin_index = geometry.crop_or_pad(array, size, -1)
    assert output.shape == size and tuple(origin_index) == start
    for index in np.ndindex(*size):
        source = tuple(i + s for i, s in zip(index, start))
        inside = all(0 <= v < n for v, n in zip(source, shape))
        assert output[index] == (array[source] if inside else -1)


@pytest.mark.parametrize("suffix", [".nii.gz", ".nrrd", ".mha"])
@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_non_finite_voxels_are_refused_in_every_format(tmp_path, suffix, bad_value):
    # ITK's NIfTI reader turns NaN/Inf into 0 silently; the check must see them anyway.
    volume = np.zeros((4, 5, 6), np.float32)
    volume[1, 2, 3] = bad_value
    path = str(tmp_path / f"case{suffix}")
    sitk.WriteImage(_image(volume), path)
    with pytest.raises(dead_letters.CaseError, match="1 voxels .* are NaN or infinite|1 voxels are NaN or infinite") as error:
        ct_transforms.preprocess_case(ct_io.CaseSource("case", ct_io.VolumeSource(path)), CONFIG)
    assert error.value.reason == "non_finite_voxels"


def test_labels_from_a_manifest_csv(bad_inputs, tmp_path):
    images = bad_inputs / "images"
    manifest = tmp_path / "manifest.csv"
    manifest.write_text(
        "image,label\n"
        f"{images / 'good1.nii.gz'},{bad_inputs / 'labels' / 'good1.nii.gz'}\n"
        f"{images / 'good2.nii.gz'},{bad_inputs / 'labels' / 'good1.nii.gz'}\n"  # any file may serve as a label
        f"{tmp_path / 'elsewhere.nii.gz'},{bad_inputs / 'labels' / 'good1.nii.gz'}\n"
    )
    volumes, _ = volume_discovery.discover(str(images))
    cases, dead = label_pairing.pair_with_labels({k: volumes[k] for k in ("good1", "good2", "unlabelled")}, str(manifest))
    assert [(c.case_id, os.path.basename(c.label.path)) for c in cases] == [("good1", "good1.nii.gz"),
                                                                             ("good2", "good1.nii.gz")]
    assert sorted(d["reason"] for d in dead) == ["missing_image", "missing_label"]
    assert any(d["source"].endswith("manifest.csv:4") for d in dead)


def test_manifest_without_header_is_refused(tmp_path):
    (tmp_path / "m.csv").write_text("a.nii.gz,b.nii.gz\n")
    with pytest.raises(ValueError, match=r"manifest .*m.csv needs a header row with the columns image,label"):
        label_pairing.pair_with_labels({}, str(tmp_path / "m.csv"))


def test_metaimage_with_missing_raw_file_is_unreadable(tmp_path):
    sitk.WriteImage(_image(np.zeros((4, 5, 6), np.float32)), str(tmp_path / "case.mhd"))
    os.remove(tmp_path / "case.raw")
    with pytest.raises(dead_letters.CaseError, match="SimpleITK cannot read") as error:
        ct_io.read_volume(ct_io.VolumeSource(str(tmp_path / "case.mhd")))
    assert error.value.reason == "unreadable"


def _gzip_bomb(path, shape_xyz=(2048, 2048, 512)):
    """A .nii.gz whose header claims `shape_xyz` uint8 voxels (2 GiB), all zeros, in about 10 MB.

    The zeros are one compressed 64 MiB gzip member repeated: gzip readers join
    concatenated members, so the file really does expand to the size it claims.
    """
    import gzip
    import zlib

    import nibabel

    header = nibabel.Nifti1Header()
    header.set_data_dtype(np.uint8)
    header.set_data_shape(shape_xyz)
    header.set_zooms((0.7, 0.7, 1.0))
    header.set_sform(np.diag([0.7, 0.7, 1.0, 1.0]), code=1)  # placed like a scan: refused for its size, not geometry
    header["vox_offset"] = 352
    prefix = header.binaryblock + b"\0" * (int(header["vox_offset"]) - len(header.binaryblock))
    chunk = 64 * 2**20
    total = int(np.prod(shape_xyz))
    zeros = zlib.compressobj(6, zlib.DEFLATED, 31)
    member = zeros.compress(bytes(chunk)) + zeros.flush()
    with open(path, "wb") as file:
        file.write(gzip.compress(prefix + bytes(chunk - len(prefix)), 6))
        for _ in range(total // chunk - 1):
            file.write(member)
        file.write(gzip.compress(bytes(len(prefix)), 6))  # the bytes the header displaced
    return path


BOMB_UNDER_A_MEMORY_CAP = """
import json, resource, sys
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from preprocessing.beam import ct_pipeline
from preprocessing.ct import ct_io, ct_transforms
case = ct_io.CaseSource("bomb", ct_io.VolumeSource(sys.argv[1]))
outputs = list(ct_pipeline.PreprocessCaseFn(ct_transforms.CtPreprocessConfig(spacing=None)).process(case))
print(json.dumps([getattr(output, "value", None) for output in outputs]))
"""


@pytest.mark.slow
def test_a_gzip_bomb_is_a_dead_letter_without_being_decompressed(tmp_path):
    import subprocess
    import sys

    bomb = _gzip_bomb(str(tmp_path / "bomb.nii.gz"))
    assert os.path.getsize(bomb) < 16 * 2**20  # 2 GiB of voxels in a few MB
    # The header alone tells the size; a real NIfTI reader agrees on what the file holds.
    import nibabel
    assert nibabel.load(bomb).shape == (2048, 2048, 512)
    # 2 GiB of address space: Python, Beam and SimpleITK take ~0.8 GiB; the volume (2 GiB as stored, 8 GiB as
    # float32) cannot fit, so the case must be refused from its header.
    run = subprocess.run([sys.executable, "-c", BOMB_UNDER_A_MEMORY_CAP, bomb, str(2 * 2**30)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    [letter] = json.loads(run.stdout.splitlines()[-1])
    assert letter["reason"] == "too_many_voxels"
    assert letter["detail"] == ("bomb.nii.gz holds 2048 x 2048 x 512 = 2,147,483,648 voxels, more than --max-voxels "
                                "536,870,912; raise --max-voxels if each worker has about 20 bytes per voxel of memory")


def _labelled_case(root, name, label, image=None):
    """A plain CT volume with `label` (any dtype) as its label map, both NIfTI, identity geometry."""
    image = np.full(label.shape, -500.0, np.float32) if image is None else image
    sitk.WriteImage(sitk.GetImageFromArray(image), str(root / f"{name}.nii.gz"))
    sitk.WriteImage(sitk.GetImageFromArray(label), str(root / f"{name}_label.nii.gz"))
    return ct_io.CaseSource(name, ct_io.VolumeSource(str(root / f"{name}.nii.gz")),
                            ct_io.VolumeSource(str(root / f"{name}_label.nii.gz")))


@pytest.mark.parametrize(
    "values, dtype, max_label, reason, detail",
    [
        ((0, 1, 300, -1), np.int16, 255, "label_out_of_range",
         "label map lung1_label.nii.gz holds values -1, 300; labels must be integers 0..255 (class ids; fullres "
         "stores at most 256 classes)"),
        ((0, 0.7, 1.6, 1), np.float32, 255, "non_integer_labels",
         "label map lung1_label.nii.gz holds non-integer values 0.7, 1.6; labels must be whole class ids 0..255, not "
         "probabilities or interpolated values (resample label maps with nearest-neighbour interpolation)"),
        ((0, 1, 2, 2), np.uint8, 1, "label_out_of_range",
         "label map lung1_label.nii.gz holds values 2; labels must be integers 0..1 for --num-classes 2; pass the "
         "data's number of classes"),
    ],
)
def test_label_values_that_are_not_class_ids_are_refused(tmp_path, values, dtype, max_label, reason, detail):
    label = np.zeros((4, 6, 6), dtype)
    label[1, 2, :4] = values  # today's uint8 reading made 300 into 44, -1 into 0 and 1.6 into 1
    case = _labelled_case(tmp_path, "lung1", label)
    config = ct_transforms.CtPreprocessConfig(spacing=None, max_label=max_label)
    with pytest.raises(dead_letters.CaseError) as error:
        ct_transforms.preprocess_case(case, config)
    assert (error.value.reason, error.value.detail) == (reason, detail)


def test_whole_float_labels_are_accepted_and_their_values_recorded(tmp_path):
    label = np.zeros((4, 6, 6), np.float64)
    label[1, 2, 1], label[2, 3, 4] = 2.0, 5.0
    record = ct_transforms.preprocess_case(_labelled_case(tmp_path, "case", label),
                                           ct_transforms.CtPreprocessConfig(spacing=None))
    assert record.label_values == (0, 2, 5)
    np.testing.assert_array_equal(record.label, label.astype(np.uint8))
    unlabelled = ct_io.CaseSource("case", ct_io.VolumeSource(str(tmp_path / "case.nii.gz")))
    assert ct_transforms.preprocess_case(unlabelled, ct_transforms.CtPreprocessConfig(spacing=None)).label_values == ()


def test_resampling_beyond_the_voxel_budget_is_refused_from_the_header(tmp_path):
    case = _labelled_case(tmp_path, "small", np.zeros((4, 6, 6), np.uint8))  # 6 x 6 x 4 voxels of 1 mm
    config = ct_transforms.CtPreprocessConfig(spacing=(0.25, 0.25, 0.25), max_voxels=5_000)
    with pytest.raises(dead_letters.CaseError) as error:
        ct_transforms.preprocess_case(case, config)
    assert error.value.reason == "too_many_voxels"
    assert error.value.detail == (
        "small.nii.gz resampled to --spacing 0.25,0.25,0.25 would hold 24 x 24 x 16 = 9,216 voxels, "
        "more than --max-voxels 5,000; raise --max-voxels if each worker has about 20 bytes per voxel of memory")
    # A grid so fine that numpy's int64 count wrapped around (1e-6 mm) slipped past the budget into ITK's allocator;
    # finer still (1e-300 mm) the count was an OverflowError. Both are refused by the same rule, readably.
    for spacing, sizes in (((1e-6,) * 3, "6000000 x 6000000 x 4000000 = 1.44e+20"),
                           ((1e-300,) * 3, "6.00e+300 x 6.00e+300 x 4.00e+300 = 1.44e+902")):
        with pytest.raises(dead_letters.CaseError) as error:
            ct_transforms.preprocess_case(case, ct_transforms.CtPreprocessConfig(spacing=spacing))
        assert error.value.reason == "too_many_voxels" and f" would hold {sizes} voxels, more than" in error.value.detail


def _off_centre_case(tmp_path):
    """A 16 x 24 x 24 volume whose tumour (class 2) sits in a corner, with a central organ (class 1)."""
    label = np.zeros((16, 24, 24), np.uint8)
    label[6:10, 10:14, 10:14] = 1
    label[1:4, 2:6, 17:22] = 2
    return _labelled_case(tmp_path, "corner", label), label


def test_centre_crop_counts_the_labelled_voxels_it_cuts(tmp_path):
    case, label = _off_centre_case(tmp_path)
    config = ct_transforms.CtPreprocessConfig(spacing=None, shape=(8, 12, 12))
    record = ct_transforms.preprocess_case(case, config)
    kept = label[4:12, 6:18, 6:18]  # the centre crop, spelled out
    assert record.cropped_voxels == ((2, int((label == 2).sum() - (kept == 2).sum())),)
    assert record.cropped_voxels == ((2, 60),)  # the whole tumour: 3 x 4 x 5 voxels
    parsed = tfrecord_schema.parse_ct_example(tfrecord_schema.encode_ct_example(record))  # the record still parses
    assert parsed["label"].numpy().max() == 1


def test_foreground_crop_centres_on_the_labelled_region(tmp_path):
    case, label = _off_centre_case(tmp_path)
    config = ct_transforms.CtPreprocessConfig(spacing=None, shape=(12, 20, 20), crop="foreground")
    record = ct_transforms.preprocess_case(case, config)
    # Foreground box z 1..9, y 2..13, x 10..21: centre (5.5, 8, 16), moved inside the volume: start (0, 0, 4).
    assert record.cropped_voxels == ()
    np.testing.assert_array_equal(record.label, label[0:12, 0:20, 4:24])
    centred = ct_transforms.preprocess_case(case, dataclasses.replace(config, crop="center"))
    assert dict(centred.cropped_voxels)[2] > 0  # the same shape, centred on the volume, cuts the tumour


def test_summary_lists_label_values_and_crop_cuts(tmp_path):
    case, _ = _off_centre_case(tmp_path)
    other = np.zeros((16, 24, 24), np.uint8)
    other[8, 12, 12] = 1
    _labelled_case(tmp_path, "centred", other)
    (tmp_path / "images").mkdir(), (tmp_path / "labels").mkdir()
    for name in ("corner", "centred"):
        os.rename(tmp_path / f"{name}.nii.gz", tmp_path / "images" / f"{name}.nii.gz")
        os.rename(tmp_path / f"{name}_label.nii.gz", tmp_path / "labels" / f"{name}.nii.gz")
    lines = []
    config = ct_transforms.CtPreprocessConfig(spacing=None, shape=(8, 12, 12))
    summary = ct_pipeline.run(str(tmp_path / "images"), str(tmp_path / "out"), labels=str(tmp_path / "labels"),
                              config=config, pipeline_args=IN_PROCESS, log=lines.append)
    assert summary["label_values"] == {"0": 2, "1": 2, "2": 1}
    assert summary["cropped_voxels"] == {"2": 60} and summary["cropped_cases"] == {"2": 1}
    assert summary["preprocessing"] == {"spacing": None, "orientation": "LPS", "window": [-1000.0, 1000.0],
                                        "modality": "auto", "shape": [8, 12, 12]}  # what predict repeats
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    assert lines[-1] == ("the crop to --shape 8,12,12 (center) cut labelled voxels (class 2: 60 voxels in 1 cases); "
                         "see label/cropped_voxels in each record, and try --crop foreground or a larger --shape")
    # Already cropped around the foreground: only a larger --shape is left to try.
    foreground = dataclasses.replace(config, crop="foreground")
    assert ct_pipeline.crop_warning(summary, foreground) == (
        "the crop to --shape 8,12,12 (foreground) cut labelled voxels (class 2: 60 voxels in 1 cases); "
        "see label/cropped_voxels in each record, and try a larger --shape")
    import tensorflow as tf
    fields = {}
    for serialized in tf.data.TFRecordDataset(sorted(str(p) for p in (tmp_path / "out").glob("data-*"))):
        example = tf.train.Example.FromString(serialized.numpy()).features.feature
        fields[example["case_id"].bytes_list.value[0].decode()] = [
            list(example[key].int64_list.value) for key in ("label/values", "label/cropped_classes", "label/cropped_voxels")]
    assert fields == {"corner": [[0, 1, 2], [2], [60]], "centred": [[0, 1], [], []]}


def test_series_folders_reached_through_symlinks_are_found_once_with_follow_links(tmp_path):
    written = demo_ct.write_demo_cases(str(tmp_path / "elsewhere"), 2, (8, 16, 16), seed=0, formats=("dicom",))
    scans = tmp_path / "scans"
    scans.mkdir()
    os.symlink(os.path.join(written["dicom"], "images", "case000"), scans / "case000")  # a series folder, linked in
    os.symlink(os.path.join(written["dicom"], "images"), scans / "more")  # a folder of series, linked in
    os.symlink(scans, scans / "loop")  # a link back to the top
    volumes, dead = volume_discovery.discover(str(scans), follow_links=True)
    assert sorted(volumes) == ["case000", "case001"] and all(v.is_dicom for v in volumes.values())
    # case000 is reachable twice (directly and through more/); it is read once, and nothing loops.
    assert dead == []
    # Without --follow-links, links out of the input are left alone and named; the one inside it is followed.
    found = volume_discovery.find_volumes(str(scans))
    assert found.images == {} and found.dead == []
    assert found.notes == ("2 link(s) lead outside the input and were not followed (case000, more); pass "
                           "--follow-links to read what they point to",)


def test_a_link_up_out_of_the_input_is_not_followed(tmp_path):
    """The issue's `up -> ..`: preprocess read the whole parent tree, predict a patient-named scan in it."""
    hostile_inputs.write_volume(hostile_inputs.ct_volume(), str(tmp_path / "PATIENT_JANE.nii.gz"), True)
    scans = tmp_path / "scans"
    scans.mkdir()
    hostile_inputs.write_volume(hostile_inputs.ct_volume(), str(scans / "good.nii.gz"), True)
    (scans / "inside").mkdir()
    os.symlink("../good.nii.gz", scans / "inside" / "again.nii.gz")  # resolves inside: followed
    os.symlink("..", scans / "up")
    found = volume_discovery.find_volumes(str(scans))
    assert sorted(found.images) == ["again", "good"]
    assert found.notes[-1].startswith("1 link(s) lead outside the input and were not followed (up)")
    assert sorted(volume_discovery.find_volumes(str(scans), follow_links=True).images) == [
        "PATIENT_JANE", "again", "good"]


def test_turned_demo_cases_hold_the_same_anatomy_in_another_voxel_order(tmp_path):
    plain = demo_ct.write_demo_cases(str(tmp_path / "plain"), 1, (8, 16, 12), seed=4, formats=("nifti",))["nifti"]
    turned = demo_ct.write_demo_cases(str(tmp_path / "turned"), 1, (8, 16, 12), seed=4, formats=("nifti",),
                                      turned=True)["nifti"]
    for kind in ("images", "labels"):
        original = sitk.ReadImage(os.path.join(plain, kind, "case000.nii.gz"))
        stored = sitk.ReadImage(os.path.join(turned, kind, "case000.nii.gz"))
        assert stored.GetSize() == (16, 12, 8)  # x and y swapped
        assert not np.allclose(stored.GetDirection(), np.eye(3).ravel())
        assert not np.array_equal(sitk.GetArrayFromImage(stored).transpose(0, 2, 1), sitk.GetArrayFromImage(original))
        # Back on the original grid, voxel for voxel the same: only the storage changed, not the anatomy.
        back = sitk.Resample(stored, original, sitk.Transform(), sitk.sitkNearestNeighbor)
        np.testing.assert_array_equal(sitk.GetArrayFromImage(back), sitk.GetArrayFromImage(original))
    with pytest.raises(ValueError, match="NIfTI only"):
        demo_ct.write_demo_cases(str(tmp_path / "dicom"), 1, (8, 16, 12), formats=("dicom", "nifti"), turned=True)
