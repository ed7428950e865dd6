"""Where a case's voxels lie: the label map on the image's grid, resampling to a spacing, cropping or padding to a shape.

Plain functions on SimpleITK images and NumPy arrays; a label grid that does
not match the image's is a dead letter naming the difference in mm.
"""

from __future__ import annotations

import itertools

import numpy as np
import SimpleITK as sitk

from common import dead_letters

# A label grid within this fraction of a voxel of the image grid is the same grid (nearest neighbour is exact).
GRID_TOLERANCE_VOXELS = 0.1
# The fewest voxels a volume has along each axis, as stored and on the model's grid: a point or one slice is not a
# scan, and padding it to a training or prediction shape would make a record of padding. DICOM series, volume files,
# `preprocess ct` and `predict` all follow this one rule.
MIN_VOXELS_PER_AXIS = 2


def resample(image: sitk.Image, spacing, interpolator, default_value: float, pixel_type) -> sitk.Image:
    """Resamples onto a grid of `spacing` covering the same physical extent, same origin and direction."""
    if spacing is None:
        return sitk.Cast(image, pixel_type)
    size = [max(1, int(round(n * s / t))) for n, s, t in zip(image.GetSize(), image.GetSpacing(), spacing)]
    return sitk.Resample(
        image, size, sitk.Transform(), interpolator, image.GetOrigin(), tuple(spacing), image.GetDirection(),
        default_value, pixel_type,
    )


def crop_or_pad(array: np.ndarray, shape, fill, centre=None) -> tuple[np.ndarray, np.ndarray]:
    """Crops or pads (D, H, W) `array` to `shape`, around the volume's centre or `centre`.

    Args:
        centre: (z, y, x) index (may be fractional) the crop is centred on, moved
            as little as needed to stay inside the volume; None: the volume's centre.
            Axes that are padded are always padded evenly.

    Returns:
        (array, start): `start` (z, y, x) is the index in the input of output
        voxel (0, 0, 0) — negative where padding was added.
    """
    # Centre; an odd remainder is cropped from, or padded at, the end of the axis.
    start = np.array([(n - t) // 2 if n >= t else -((t - n) // 2) for n, t in zip(array.shape, shape)])
    if centre is not None:
        start = np.array([min(max(int(np.floor(c - t / 2 + 0.5)), 0), n - t) if n >= t else s
                          for c, t, n, s in zip(centre, shape, array.shape, start)])
    output = np.full(shape, fill, array.dtype)
    source = tuple(slice(max(s, 0), max(s, 0) + min(t, n - max(s, 0))) for s, t, n in zip(start, shape, array.shape))
    target = tuple(slice(max(-s, 0), max(-s, 0) + (src.stop - src.start)) for s, src in zip(start, source))
    output[target] = array[source]
    return output, start


def foreground_centre(labels: np.ndarray) -> tuple[float, ...] | None:
    """The centre (z, y, x) of the bounding box of the labelled (non-zero) voxels; None if there are none."""
    if not labels.any():
        return None
    centre = []
    for axis in range(labels.ndim):
        present = np.flatnonzero(labels.any(axis=tuple(a for a in range(labels.ndim) if a != axis)))
        centre.append((present[0] + present[-1] + 1) / 2)
    return tuple(centre)


def _grid(image: sitk.Image) -> np.ndarray:
    """(4, 4) affine from voxel index (x, y, z) to physical point (mm)."""
    affine = np.eye(4)
    affine[:3, :3] = np.array(image.GetDirection()).reshape(3, 3) @ np.diag(image.GetSpacing())
    affine[:3, 3] = image.GetOrigin()
    return affine


def label_on_image_grid(image: sitk.Image, label: sitk.Image) -> sitk.Image:
    """The label map on the image's voxel grid, when both cover the same physical grid.

    The grids are compared in physical space, so a label stored with its axes
    in another order or flipped (NIfTI from dcm2niix, nibabel, 3D Slicer,
    TotalSegmentator beside a DICOM series) pairs. Callers reorient both to the
    canonical orientation first (`sitk.DICOMOrient`), after which such a label
    has the image's grid and is returned as it is. Otherwise every label voxel
    centre must land within `GRID_TOLERANCE_VOXELS` of an image voxel centre, one
    to one, and the label is resampled onto the image grid by nearest neighbour,
    which only reorders its voxels.

    Raises:
        dead_letters.CaseError: `geometry_mismatch`, naming the difference in mm.
    """
    if (image.GetSize() == label.GetSize() and np.allclose(image.GetSpacing(), label.GetSpacing(), rtol=1e-3)
            and np.allclose(image.GetOrigin(), label.GetOrigin(), atol=1e-2 * max(image.GetSpacing()))
            and np.allclose(image.GetDirection(), label.GetDirection(), atol=1e-4)):
        return label
    to_image = np.linalg.inv(_grid(image)) @ _grid(label)  # label index -> image continuous index
    linear = np.round(to_image[:3, :3])
    signed_permutation = (np.all(np.isin(linear, (-1.0, 0.0, 1.0)))
                          and np.all(np.abs(linear).sum(axis=0) == 1) and np.all(np.abs(linear).sum(axis=1) == 1))
    corners = np.array([[*corner, 1.0] for corner in itertools.product(*[(0, n - 1) for n in label.GetSize()])]).T
    mapped = (to_image @ corners)[:3]  # (3, 8) image indices of the label's corner voxels
    image_corners = {tuple(c) for c in itertools.product(*[(0, n - 1) for n in image.GetSize()])}
    if (signed_permutation and np.abs(mapped - np.round(mapped)).max() <= GRID_TOLERANCE_VOXELS
            and {tuple(int(v) for v in c) for c in np.round(mapped).T} == image_corners):
        return sitk.Resample(label, image, sitk.Transform(), sitk.sitkNearestNeighbor, 0, label.GetPixelID())
    raise dead_letters.CaseError("validate", "geometry_mismatch", describe_grid_mismatch(image, label))


def describe_grid_mismatch(image: sitk.Image, label: sitk.Image) -> str:
    """One sentence on how the label's grid differs from the image's, in mm, after reorienting both to LPS."""
    image, label = sitk.DICOMOrient(image, "LPS"), sitk.DICOMOrient(label, "LPS")
    parts = []
    image_spacing, label_spacing = np.array(image.GetSpacing()), np.array(label.GetSpacing())
    if not np.allclose(image_spacing, label_spacing, rtol=1e-3):
        parts.append(f"label voxels are {_mm(label_spacing)} mm, image voxels {_mm(image_spacing)} mm")
    image_extent = (np.array(image.GetSize()) - 1) * image_spacing
    label_extent = (np.array(label.GetSize()) - 1) * label_spacing
    if np.abs(image_extent - label_extent).max() > GRID_TOLERANCE_VOXELS * image_spacing.min():
        parts.append(f"the label spans {_mm(label_extent)} mm ({'×'.join(map(str, label.GetSize()))} voxels), "
                     f"the image {_mm(image_extent)} mm ({'×'.join(map(str, image.GetSize()))} voxels)")
    shift = np.array(label.GetOrigin()) - np.array(image.GetOrigin())
    if np.linalg.norm(shift) > GRID_TOLERANCE_VOXELS * image_spacing.min():
        parts.append(f"the label's first voxel is {np.linalg.norm(shift):.1f} mm from the image's "
                     f"(x, y, z shift {_mm(shift, ', ')} mm)")
    rotation = np.array(image.GetDirection()).reshape(3, 3).T @ np.array(label.GetDirection()).reshape(3, 3)
    angle = float(np.degrees(np.arccos(np.clip((np.trace(rotation) - 1) / 2, -1.0, 1.0))))
    if angle > 0.1:
        parts.append(f"the label's axes are rotated {angle:.1f}° from the image's")
    return ("the label map does not cover the image's voxel grid: " + "; ".join(parts or ["the grids differ"])
            + "; use the label map made for this image, or resample it onto the image first")


def _mm(values, separator: str = "×") -> str:
    return separator.join(f"{v:.4g}" for v in values)
