"""Images and label maps pair by physical grid, whatever axis order or flips their files use."""

import nibabel
import numpy as np
import pytest
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import ct_io, ct_transforms, demo_ct

CONFIG = ct_transforms.CtPreprocessConfig(modality="ct")  # no --spacing, no --shape: the case's own grid
SHAPE = (6, 8, 10)  # (D, H, W)
SPACING = (0.98, 0.98, 2.0)  # (x, y, z) mm, as the CT
ORIGIN = (-250.0, -437.5, 61.5)
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _truth():
    volume = np.full(SHAPE, 40.0, np.float32)
    volume[:, :2] = -1000.0
    label = np.zeros(SHAPE, np.uint8)
    label[1:3, 4:7, 6:9] = 2  # an off-centre blob: any flip or swap moves it
    label[4, 1, 1] = 1
    return volume, label


def _affine(image: sitk.Image) -> np.ndarray:
    """ITK image index (x, y, z) -> LPS point, as a 4×4 matrix."""
    affine = np.eye(4)
    affine[:3, :3] = np.array(image.GetDirection()).reshape(3, 3) @ np.diag(image.GetSpacing())
    affine[:3, 3] = image.GetOrigin()
    return affine


def _write_label_with_nibabel(label_zyx, image: sitk.Image, path, index_map):
    """Writes `label_zyx` (on `image`'s grid) as another tool would: RAS affine, axes swapped and flipped.

    `index_map` (4×4 integer) takes the stored array's index (a, b, c) to the image index (x, y, z).
    qform and sform both carry the affine, with code 1 (scanner), as dcm2niix writes them.
    """
    on_grid = label_zyx.transpose(2, 1, 0)  # (x, y, z)
    stored_shape = np.abs(index_map[:3, :3]).T @ np.array(on_grid.shape)
    abc = np.indices(stored_shape).reshape(3, -1)
    xyz = (index_map @ np.vstack([abc, np.ones(abc.shape[1])]))[:3].astype(int)
    stored = on_grid[tuple(xyz)].reshape(stored_shape)
    nifti = nibabel.Nifti1Image(stored, LPS_TO_RAS @ _affine(image) @ index_map)
    nifti.set_qform(nifti.affine, code=1)
    nifti.set_sform(nifti.affine, code=1)
    nibabel.save(nifti, str(path))


# Stored (a, b, c) -> image (x, y, z): x = b, y = H-1-a, z = c (swap x/y, flip y) ...
SWAP_FLIP_Y = np.array([[0, 1, 0, 0], [-1, 0, 0, SHAPE[1] - 1], [0, 0, 1, 0], [0, 0, 0, 1]])
# ... and z first, flipped: x = b, y = c, z = D-1-a.
Z_FIRST_FLIPPED = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [-1, 0, 0, SHAPE[0] - 1], [0, 0, 0, 1]])


def _physical_centre(mask_zyx, spacing, origin, direction):
    index_xyz = np.argwhere(mask_zyx).mean(axis=0)[::-1]
    return np.array(origin) + np.array(direction).reshape(3, 3) @ (index_xyz * np.array(spacing))


@pytest.mark.parametrize("index_map", [SWAP_FLIP_Y, Z_FIRST_FLIPPED], ids=["swap-flip-y", "z-first-flipped"])
def test_dicom_series_with_a_flipped_and_permuted_nifti_label(tmp_path, index_map):
    volume, label = _truth()
    demo_ct.write_dicom_series(volume, str(tmp_path / "series"), SPACING, ORIGIN)
    source = ct_io.VolumeSource(str(tmp_path / "series"), tuple(sorted(str(p) for p in (tmp_path / "series").iterdir())))
    image = ct_io.read_volume(source)
    _write_label_with_nibabel(label, image, tmp_path / "series.nii.gz", index_map)
    stored = sitk.ReadImage(str(tmp_path / "series.nii.gz"))
    assert stored.GetSize() != image.GetSize() or stored.GetOrigin() != pytest.approx(image.GetOrigin())  # really stored otherwise

    record = ct_transforms.preprocess_case(ct_io.CaseSource("series", source, ct_io.VolumeSource(str(tmp_path / "series.nii.gz"))), CONFIG)
    np.testing.assert_array_equal(record.label, label)  # every voxel where it belongs
    # The blob sits at the same point in patient space as in the truth.
    expected = _physical_centre(label == 2, SPACING, ORIGIN, np.eye(3).reshape(-1))
    np.testing.assert_allclose(_physical_centre(record.label == 2, record.spacing, record.origin, record.direction),
                               expected, atol=1e-3)


def test_oblique_nifti_image_with_a_flipped_nifti_label(tmp_path):
    volume, label = _truth()
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing(SPACING)
    image.SetOrigin(ORIGIN)
    image.SetDirection((0, 1, 0, 1, 0, 0, 0, 0, -1))  # rows and columns swapped, slices running feet-wards
    sitk.WriteImage(image, str(tmp_path / "ct.nii.gz"))
    same_grid = sitk.GetImageFromArray(label)
    same_grid.CopyInformation(image)
    sitk.WriteImage(same_grid, str(tmp_path / "same_grid.nii.gz"))
    _write_label_with_nibabel(label, sitk.ReadImage(str(tmp_path / "ct.nii.gz")), tmp_path / "flipped.nii.gz", Z_FIRST_FLIPPED)

    image_source = ct_io.VolumeSource(str(tmp_path / "ct.nii.gz"))
    flipped = ct_transforms.preprocess_case(
        ct_io.CaseSource("ct", image_source, ct_io.VolumeSource(str(tmp_path / "flipped.nii.gz"))), CONFIG)
    reference = ct_transforms.preprocess_case(
        ct_io.CaseSource("ct", image_source, ct_io.VolumeSource(str(tmp_path / "same_grid.nii.gz"))), CONFIG)
    np.testing.assert_array_equal(flipped.label, reference.label)
    assert flipped.label.sum() == label.sum()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(origin=(ORIGIN[0], ORIGIN[1] + 12.0, ORIGIN[2])),
         r"the label's first voxel is 12\.0 mm from the image's \(x, y, z shift 0, 12, 0 mm\)"),
        (dict(spacing=(0.98, 0.98, 2.5)), r"label voxels are 0\.98×0\.98×2\.5 mm, image voxels 0\.98×0\.98×2 mm"),
        (dict(width=9), r"the label spans 7\.84×6\.86×10 mm \(9×8×6 voxels\), the image 8\.82×6\.86×10 mm \(10×8×6 voxels\)"),
    ],
    ids=["shifted", "other-spacing", "other-size"],
)
def test_a_real_mismatch_is_refused_naming_millimetres(tmp_path, change, message):
    volume, label = _truth()
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing(SPACING)
    image.SetOrigin(ORIGIN)
    sitk.WriteImage(image, str(tmp_path / "ct.nrrd"))
    wrong = sitk.GetImageFromArray(label[:, :, : change.get("width", SHAPE[2])])
    wrong.SetSpacing(change.get("spacing", SPACING))
    wrong.SetOrigin(change.get("origin", ORIGIN))
    sitk.WriteImage(wrong, str(tmp_path / "label.nrrd"))
    case = ct_io.CaseSource("ct", ct_io.VolumeSource(str(tmp_path / "ct.nrrd")), ct_io.VolumeSource(str(tmp_path / "label.nrrd")))
    with pytest.raises(dead_letters.CaseError, match=message) as error:
        ct_transforms.preprocess_case(case, CONFIG)
    assert error.value.reason == "geometry_mismatch"
    assert error.value.detail.startswith("the label map does not cover the image's voxel grid: ")
