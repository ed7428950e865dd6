"""Headers are read before any voxel: geometry is never guessed, 4-D files and points are refused, memory is counted in bytes.

Inputs are written by the real libraries (nibabel, SimpleITK, pydicom) and then
given the quirks users meet: a NIfTI whose pixdim and affine are zero (both
readers would call it 1 mm), a MetaImage with zero spacing, a 4-D NIfTI, a
1×1×1 "scan", a float64 volume under the voxel cap whose decoded bytes are not.
"""

import gzip
import io
import json
import os
import subprocess
import sys
import zlib

import nibabel
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from preprocessing.beam import ct_pipeline
from preprocessing.ct import ct_io, ct_transforms, demo_ct, volume_discovery

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIG = ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 2.0), shape=(8, 8, 8))
GEOMETRY_FIX = "fullres does not guess geometry, so write the scan's true voxel size into its header"
ORIENTATION_FIX = "fullres does not guess orientation, so write the scan's true orientation into its header"


def _nifti(path, data, edit=None):
    """A NIfTI written by nibabel, its header then edited as stored (nibabel's own writer would repair the edits)."""
    image = nibabel.Nifti1Image(data, np.diag([0.8, 0.8, 2.0, 1.0]))
    buffer = io.BytesIO()
    image.to_file_map({"header": nibabel.FileHolder(fileobj=buffer), "image": nibabel.FileHolder(fileobj=buffer)})
    stored = bytearray(buffer.getvalue())
    if edit is not None:
        header = nibabel.Nifti1Header.from_fileobj(io.BytesIO(bytes(stored[:348])), check=False)
        edit(header)
        stored[:348] = header.binaryblock
    with open(path, "wb") as file:
        file.write(gzip.compress(bytes(stored)))
    return str(path)


def _zero_geometry(header):
    """pixdim and both affines all zero, as a converter that lost the geometry writes them."""
    header["pixdim"][:] = 0
    header["qform_code"], header["sform_code"] = 0, 0
    for axis in "xyz":
        header[f"srow_{axis}"][:] = 0


def _nan_spacing(header):
    header["pixdim"][2] = np.nan


def _zero_sform(header):
    header["qform_code"], header["sform_code"] = 0, 2
    for axis in "xyz":
        header[f"srow_{axis}"][:] = 0


def _sheared_sform(header):
    """An sform whose rows slant (each row of voxels 0.24 mm further along x), its qform the nearest rotation: as
    nibabel writes a sheared affine, and as ITK would then read it, silently."""
    sheared = np.array([[0.8, 0.24, 0, 10], [0, 0.8, 0, 20], [0, 0, 2.0, -30], [0, 0, 0, 1]])
    header.set_sform(sheared, code=2)
    header.set_qform(sheared, code=1)


def _no_transform(header):
    """Neither qform nor sform (codes 0): the ANALYZE-era 'method 1', orientation unknown."""
    header["qform_code"], header["sform_code"] = 0, 0


def _conflicting_forms(header):
    """A qform and an sform 5 mm apart along each axis (a registration that updated only the sform)."""
    header.set_sform(np.array([[0.8, 0, 0, 10], [0, 0.8, 0, 20], [0, 0, 2.0, -30], [0, 0, 0, 1]]), code=2)
    header.set_qform(np.array([[0.8, 0, 0, 15], [0, 0.8, 0, 25], [0, 0, 2.0, -25], [0, 0, 0, 1]]), code=1)


def _metaimage(path, replace):
    sitk.WriteImage(sitk.GetImageFromArray(np.full((6, 7, 8), -500.0, np.float32)), str(path))
    stored = open(path, "rb").read()
    old, new = replace
    assert old in stored
    with open(path, "wb") as file:
        file.write(stored.replace(old, new))
    return str(path)


def _without_spacing(path):
    """A MetaImage or NRRD whose header says nothing of the voxel size (hand-written headers, converters that drop
    it): readers take 1 mm."""
    voxels = np.full((6, 7, 8), -500, np.int16).tobytes()
    if str(path).endswith(".mha"):
        header = (b"ObjectType = Image\nNDims = 3\nBinaryData = True\nBinaryDataByteOrderMSB = False\n"
                  b"DimSize = 8 7 6\nElementType = MET_SHORT\nElementDataFile = LOCAL\n")
    else:
        header = b"NRRD0004\ntype: short\ndimension: 3\nsizes: 8 7 6\nendian: little\nencoding: raw\n\n"
    path.write_bytes(header + voxels)
    return str(path)


def _missing_data_file(path):
    """A MetaImage header whose .raw was not copied with it."""
    sitk.WriteImage(sitk.GetImageFromArray(np.full((6, 7, 8), -500, np.int16)), str(path))
    os.remove(str(path)[:-4] + ".raw")
    return str(path)


def _empty(path):
    path.write_bytes(b"")
    return str(path)


def _volume():
    return np.full((6, 7, 8), -500.0, np.float32)  # (z, y, x) as nibabel takes (x, y, z): any order does here


def _refusal(case, config=CONFIG):
    """The dead letter the Beam transform writes for `case`."""
    [letter] = [output.value for output in ct_pipeline.PreprocessCaseFn(config).process(case)]
    return letter["reason"], letter["detail"]


@pytest.mark.parametrize("name, write, reason, detail", [
    ("zero.nii.gz", lambda p: _nifti(p, _volume(), _zero_geometry), "invalid_geometry",
     f"zero.nii.gz has voxel spacing 0 x 0 x 0 mm in its header (NIfTI pixdim[1:4]); {GEOMETRY_FIX}"),
    ("nan.nii.gz", lambda p: _nifti(p, _volume(), _nan_spacing), "invalid_geometry",
     f"nan.nii.gz has voxel spacing 0.8 x nan x 2 mm in its header (NIfTI pixdim[1:4]); {GEOMETRY_FIX}"),
    ("sform.nii.gz", lambda p: _nifti(p, _volume(), _zero_sform), "invalid_geometry",
     "sform.nii.gz has a zero or non-finite affine in its header (NIfTI sform: srow_x, srow_y, srow_z); "
     f"{ORIENTATION_FIX}"),
    ("sheared.nii.gz", lambda p: _nifti(p, _volume(), _sheared_sform), "sheared_geometry",
     "sheared.nii.gz has a sheared affine in its header (NIfTI sform: its voxel axes i and j meet at 73.30° instead "
     "of 90°), which ITK-based readers and fullres's records cannot hold (ITK would silently take the qform's "
     "rotation instead); resample the scan onto a grid with perpendicular axes first (e.g. 3D Slicer's Resample "
     "Scalar Volume, or antsApplyTransforms)"),
    ("unplaced.nii.gz", lambda p: _nifti(p, _volume(), _no_transform), "invalid_geometry",
     "unplaced.nii.gz has neither a qform nor an sform in its header (NIfTI qform_code and sform_code 0), so where it "
     "lies and which way it faces are unknown (ITK and nibabel would place it mirrored left to right); fullres does "
     "not guess orientation, so write the scan's true orientation into its header (e.g. nibabel: "
     "image.set_sform(affine, code=1))"),
    ("forms.nii.gz", lambda p: _nifti(p, _volume(), _conflicting_forms), "conflicting_geometry",
     "forms.nii.gz has a qform and an sform that place the volume up to 8.7 mm apart (NIfTI qform_code 1, "
     "sform_code 2); readers choose between them differently, so fullres does not guess: make them agree, e.g. with "
     "nibabel (image.set_qform(image.get_sform())) or FSL (fslorient -copysform2qform)"),
    ("unsized.mha", _without_spacing, "invalid_geometry",
     f"unsized.mha gives no voxel spacing in its header (ElementSpacing or ElementSize), which readers take as 1 mm; "
     f"{GEOMETRY_FIX}"),
    ("unsized.nrrd", _without_spacing, "invalid_geometry",
     f"unsized.nrrd gives no voxel spacing in its header (space directions or spacings), which readers take as 1 mm; "
     f"{GEOMETRY_FIX}"),
    ("alone.mhd", _missing_data_file, "missing_data_file",
     "alone.mhd keeps its voxels in alone.raw (its header's ElementDataFile), which does not exist beside it; copy "
     "the data file next to the header, or correct the header's file name"),
    ("empty.nii.gz", _empty, "empty_file",
     "empty.nii.gz is empty (0 bytes): a copy or download that never wrote it; copy it again from its source"),
    ("spacing.mha", lambda p: _metaimage(p, (b"ElementSpacing = 1 1 1", b"ElementSpacing = 0 0 0")),
     "invalid_geometry", f"spacing.mha has voxel spacing 0 x 0 x 0 mm in its header (ElementSpacing); {GEOMETRY_FIX}"),
    ("direction.mha", lambda p: _metaimage(p, (b"TransformMatrix = 1 0 0 0 1 0 0 0 1",
                                               b"TransformMatrix = 0 0 0 0 0 0 0 0 0")),
     "invalid_geometry", f"direction.mha has a zero or non-finite direction in its header (TransformMatrix); "
                         f"{ORIENTATION_FIX}"),
    ("four.nii.gz", lambda p: _nifti(p, np.zeros((8, 7, 6, 3), np.int16)), "four_dimensional",
     "four.nii.gz is 4-D, 3 volumes of 8 x 7 x 6 voxels; fullres reads one 3-D volume per file, so save the volume "
     "to use as a file of its own (e.g. nibabel.load(path).slicer[..., INDEX])"),
    ("point.nii.gz", lambda p: _nifti(p, np.full((1, 1, 1), 40, np.int16)), "too_small",
     "point.nii.gz is 1 x 1 x 1 voxels; a volume needs at least 2 along each axis (a point or a single slice is not "
     "padded into a scan)"),
    ("slice.nii.gz", lambda p: _nifti(p, np.full((8, 7), 40, np.int16)), "too_small",
     "slice.nii.gz is 8 x 7 x 1 voxels; a volume needs at least 2 along each axis (a point or a single slice is not "
     "padded into a scan)"),
])
def test_a_volume_fullres_would_have_to_guess_about_is_a_dead_letter_naming_the_field(tmp_path, name, write, reason,
                                                                                        detail):
    # Before: zero/NaN pixdim was read as 1 mm and the point padded into an all-padding record (no dead letter at
    # all); the MetaImage and sform cases were `unreadable` in SimpleITK's words; the 4-D file an `unexpected_error`
    # about DICOMOrient's pixel types.
    path = write(tmp_path / name)
    case = ct_io.CaseSource("case", ct_io.VolumeSource(path, name=name))
    assert _refusal(case) == (reason, detail)


def test_a_label_map_with_a_guessed_spacing_is_refused_too(tmp_path):
    image = _nifti(tmp_path / "case.nii.gz", _volume())
    label = _nifti(tmp_path / "case_label.nii.gz", np.zeros((6, 7, 8), np.uint8), _zero_geometry)
    case = ct_io.CaseSource("case", ct_io.VolumeSource(image, name="case.nii.gz"),
                            ct_io.VolumeSource(label, name="case_label.nii.gz"))
    assert _refusal(case) == ("invalid_geometry", "case_label.nii.gz has voxel spacing 0 x 0 x 0 mm in its header "
                                                  f"(NIfTI pixdim[1:4]); {GEOMETRY_FIX}")


def test_a_sound_nifti_still_reads_and_the_point_rule_is_the_dicom_rule(tmp_path):
    path = _nifti(tmp_path / "fine.nii.gz", np.full((2, 2, 2), 40, np.int16))  # the smallest volume accepted
    record = ct_transforms.preprocess_case(ct_io.CaseSource("fine", ct_io.VolumeSource(path)),
                                           ct_transforms.CtPreprocessConfig(spacing=None))
    assert record.image.shape == (2, 2, 2) and record.spacing == pytest.approx((0.8, 0.8, 2.0))
    # A one-slice DICOM series is refused by the same number, in its own words.
    demo_ct.write_dicom_series(np.zeros((1, 8, 8), np.float32), str(tmp_path / "dicom" / "one"))
    _, dead = volume_discovery.discover(str(tmp_path / "dicom"))
    assert [letter["reason"] for letter in dead] == ["too_few_slices"]
    assert dead[0]["detail"].endswith("holds the only slice of its series; a volume needs at least 2")


def test_resampling_to_fewer_than_two_slices_is_refused_from_the_header(tmp_path):
    path = _nifti(tmp_path / "thin.nii.gz", np.full((8, 8, 2), 40, np.int16))  # two 2 mm slices
    config = ct_transforms.CtPreprocessConfig(spacing=(1.0, 1.0, 5.0))
    case = ct_io.CaseSource("thin", ct_io.VolumeSource(path, name="thin.nii.gz"))
    assert _refusal(case, config) == (
        "too_small", "thin.nii.gz resampled to --spacing 1,1,5 would be 6 x 6 x 1 voxels; a volume needs at least 2 "
                     "along each axis (a point or a single slice is not padded into a scan)")


@pytest.mark.parametrize("field, value, shown", [
    ("PixelSpacing", [0, 0], "PixelSpacing 0\\0"),
    ("ImageOrientationPatient", [0, 0, 0, 0, 0, 0], "ImageOrientationPatient 0\\0\\0\\0\\0\\0"),
])
def test_a_dicom_series_with_zero_geometry_is_refused_naming_the_field(tmp_path, field, value, shown):
    paths = demo_ct.write_dicom_series(np.zeros((3, 8, 8), np.float32), str(tmp_path / "series"))
    for path in paths:
        dataset = pydicom.dcmread(path)
        setattr(dataset, field, value)
        dataset.save_as(path)
    volumes, dead = volume_discovery.discover(str(tmp_path))
    assert volumes == {} and len(dead) == 3
    assert {letter["reason"] for letter in dead} == {"invalid_geometry"}
    letter = next(letter for letter in dead if letter["source"] == paths[0])
    assert letter["detail"] == (f"{paths[0]} has {shown}; fullres does not guess geometry, so export the series with "
                                "its true geometry")


# ---------------------------------------------------------------------------------------------------------------
# Bytes, not voxels: the cap counts the stored type and the float32 working copy, from the header.

def test_the_decoded_bytes_of_a_volume_are_counted_from_its_stored_type(tmp_path):
    path = _nifti(tmp_path / "wide.nii.gz", np.zeros((10, 10, 10), np.float64))
    case = ct_io.CaseSource("wide", ct_io.VolumeSource(path, name="wide.nii.gz"))
    config = ct_transforms.CtPreprocessConfig(spacing=None, max_decoded_bytes=10_000)
    assert _refusal(case, config) == (
        "too_many_bytes", "wide.nii.gz holds 10 x 10 x 10 float64 voxels, 11.7 KiB once decoded (8 bytes a voxel as "
                          "stored and 4 as float32), more than --max-decoded-bytes 9.8 KiB; raise --max-decoded-bytes "
                          "if each worker has that memory to spare")
    narrow = _nifti(tmp_path / "narrow.nii.gz", np.zeros((10, 10, 10), np.int16))  # 6 bytes a voxel: 6,000 bytes
    ct_transforms.check_size(ct_io.CaseSource("narrow", ct_io.VolumeSource(narrow)), config)


def zeros_nifti(path, shape_xyz, dtype):
    """A .nii.gz of zeros of `dtype` written without holding its voxels: a few MB that expand to gigabytes.

    The zeros are gzip members concatenated (what `gzip` itself reads as one stream), so the file really holds
    every voxel its header claims; nibabel and SimpleITK read it as an ordinary NIfTI.
    """
    header = nibabel.Nifti1Header()
    header.set_data_dtype(dtype)
    header.set_data_shape(shape_xyz)
    header.set_zooms((0.7, 0.7, 0.5))
    header.set_sform(np.diag([0.7, 0.7, 0.5, 1.0]), code=1)
    header["vox_offset"] = 352
    chunk = 64 * 2**20
    total = int(np.prod(shape_xyz)) * np.dtype(dtype).itemsize
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    member = compressor.compress(bytes(chunk)) + compressor.flush()
    with open(path, "wb") as file:
        file.write(gzip.compress(header.binaryblock + b"\0" * 4, 6))
        for _ in range(total // chunk):
            file.write(member)
        file.write(gzip.compress(bytes(total % chunk), 6))
    return str(path)


# The file: 2.2 MB of float64 zeros, 2.9e8 voxels (under --max-voxels 2^29), 2.16 GiB as stored.
FLOAT64_SHAPE = (512, 512, 1106)
F64_DETAIL = ("f64.nii.gz holds 512 x 512 x 1106 float64 voxels, 3.24 GiB once decoded (8 bytes a voxel as stored and "
              "4 as float32), more than --max-decoded-bytes 3.00 GiB; raise --max-decoded-bytes if each worker has "
              "that memory to spare")


def under_memory_limit(limit: int, *arguments: str) -> list[str]:
    """A command line that runs `python -m pipelines.cli ARGUMENTS` with `limit` bytes of address space.

    The limit is set in the child before it execs (not with `preexec_fn`, which is unsafe in this multi-threaded
    test process); the Beam workers the command starts inherit it.
    """
    start = ("import os, resource, sys; limit = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
             "os.execv(sys.executable, [sys.executable, '-m', 'pipelines.cli', *sys.argv[2:]])")
    return [sys.executable, "-c", start, str(limit), *arguments]


@pytest.mark.slow  # `fullres preprocess ct` in a fresh process (Beam, one worker) under the limit
def test_a_float64_volume_under_the_voxel_cap_is_refused_by_its_bytes_under_a_memory_limit(tmp_path):
    scans = tmp_path / "scans"
    scans.mkdir()
    path = zeros_nifti(scans / "f64.nii.gz", FLOAT64_SHAPE, np.float64)
    assert os.path.getsize(path) < 3 * 2**20
    assert int(np.prod(FLOAT64_SHAPE)) < ct_transforms.DEFAULT_MAX_VOXELS
    _nifti(scans / "good.nii.gz", np.full((16, 16, 8), 40, np.int16))  # an ordinary scan beside it is still written
    # Measured before the byte cap (2026-11-25, this machine): with no limit the case was read, the worker peaking at
    # 7.1 GB resident (6.8 GiB); under 2 GiB of address space SimpleITK's reader failed with std::bad_alloc. Now it
    # is refused from its header and the whole command, Beam included, stays under 2 GiB (0.35 GB resident).
    run = subprocess.run(
        under_memory_limit(2 * 2**30, "preprocess", "ct", "--input", str(scans), "--output", str(tmp_path / "out"),
                           "--workers", "1", "--max-failed-fraction", "0.5"),
        capture_output=True, text=True, timeout=300, cwd=REPOSITORY)
    assert run.returncode == 0, run.stderr[-2000:]
    [letter] = [json.loads(line) for line in (tmp_path / "out" / "dead_letter.jsonl").read_text().splitlines()]
    assert (letter["source"], letter["reason"], letter["detail"]) == ("f64.nii.gz", "too_many_bytes", F64_DETAIL)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["ok"] == 1


def test_max_decoded_bytes_takes_a_size_and_says_so_in_one_sentence(tmp_path):
    from typer.testing import CliRunner

    from pipelines import cli

    result = CliRunner().invoke(cli.app, ["preprocess", "ct", "--input", str(tmp_path), "--output",
                                          str(tmp_path / "out"), "--max-decoded-bytes", "lots"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "fullres: error: --max-decoded-bytes 'lots' is not a size; write e.g. 16GiB or 32GB."
    assert not (tmp_path / "out").exists()


def test_a_dicom_series_is_read_into_one_float32_volume_not_several_copies(tmp_path):
    """What the reader holds beside the volume it returns, counted by tracemalloc (NumPy and pydicom report to it).

    Before: every file's stored bytes, every file's decoded pixels, a list of float32 slices and their stack,
    about 12 bytes a voxel for int16 slices (measured: 0.79 GB more resident for a 512×512×200 series, whose
    float32 volume is 0.2 GiB); the byte cap counts 2 + 4. Now: one file at a time, decoded into one volume.
    """
    import glob
    import tracemalloc

    from preprocessing.ct import dicom_series

    volume = np.random.default_rng(0).integers(-1000, 1000, (40, 96, 128)).astype(np.float32)
    demo_ct.write_dicom_series(volume, str(tmp_path / "series"))
    files = tuple(sorted(glob.glob(str(tmp_path / "series" / "*"))))
    tracemalloc.start()
    try:
        image = dicom_series.read_series(files)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(sitk.GetArrayFromImage(image), volume)
    assert peak < 1.5 * volume.nbytes, f"{peak / volume.nbytes:.2f} float32 volumes held at the peak"
