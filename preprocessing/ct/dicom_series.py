"""One DICOM volume from its files: ordering the slices along the slice normal, and stacking their pixels.

Slices are ordered by their position along the slice normal, never by file
name or InstanceNumber. Gaps that vary by up to `spacing_tolerance` (scanners
round positions) are taken as uniform; beyond it (a missing slice, a variable
pitch) the slices are interpolated linearly onto a uniform grid at the median
gap, from their true positions, and the case carries a `slices_resampled` note.
What one file holds (its slices' geometry, its decoded pixels) is
`dicom_frames`; grouping files into volumes is `dicom_grouping`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pydicom
import SimpleITK as sitk

from common import dead_letters
from preprocessing.ct import dicom_frames, geometry

DEFAULT_SPACING_TOLERANCE = 0.05


def along_normal(frames: list[dicom_frames.Frame]) -> np.ndarray:
    return np.array([f.position for f in frames]) @ dicom_frames.normal(frames[0].orientation)


def slice_grid(along: np.ndarray, tolerance: float) -> tuple[float, bool]:
    """The slice step of sorted positions `along` (mm) and whether they must be resampled to it.

    The step is the median gap; the positions are uniform when every gap is
    within `tolerance` (a fraction) of it.
    """
    gaps = np.diff(along)
    step = float(np.median(gaps))
    return step, bool(np.abs(gaps - step).max() > tolerance * step + 1e-3)


def drop_identical(frames: list[dicom_frames.Frame], along: np.ndarray) -> tuple[list[dicom_frames.Frame], list[tuple[str, str, str]]]:
    """Drops files that repeat another file's position and pixels; refuses a position with different pixels.

    Returns:
        (frames left, `duplicate_file` notes naming each dropped file).

    Raises:
        CaseError: `duplicate_slice`, naming both files, when their pixels differ.
    """
    order = np.argsort(along, kind="stable")
    kept, notes = [order[0]], []
    step = float(np.median(np.abs(np.diff(np.sort(along))))) if len(along) > 1 else 1.0
    for index in order[1:]:
        previous = kept[-1]
        if abs(along[index] - along[previous]) > 1e-3 * max(step, 1e-3):
            kept.append(index)
            continue
        first, second = frames[previous], frames[index]
        same = first.index is None and second.index is None and _same_pixels(first.path, second.path)
        if not same:
            raise dead_letters.CaseError("read", "duplicate_slice", f"{first.name} and {second.name} lie at the same "
                                      "position with different pixels; remove the one that does not belong to the series")
        notes.append((second.path, "duplicate_file", f"{second.path} repeats {first.path} (same position and pixels); "
                                                     "it was left out"))
    kept.sort()
    return [frames[i] for i in kept], notes


def _same_pixels(first: str, second: str) -> bool:
    (a, pixels_a), (b, pixels_b) = dicom_frames.read_pixels(first), dicom_frames.read_pixels(second)
    return pixels_a.shape == pixels_b.shape and np.array_equal(pixels_a, pixels_b) and dicom_frames.rescale(a, None) == dicom_frames.rescale(b, None)


@dataclasses.dataclass(frozen=True)
class SliceStack:
    """The slices of one volume in the order of its z axis, and the grid they lie on.

    `frames` are sorted by their position along the slice normal (`along`, mm),
    never by file name or InstanceNumber. The volume's slice k lies at
    `along[0] + k * step`; `volume_slices` says on which slice each frame lies.
    """

    frames: tuple[dicom_frames.Frame, ...]
    along: tuple[float, ...]  # each frame's position along the slice normal, ascending, mm
    step: float  # slice spacing of the volume, mm
    resampled: bool  # the gaps vary beyond the tolerance: the volume is interpolated onto a uniform grid

    @property
    def depth(self) -> int:
        """The number of slices of the volume read from these frames."""
        if not self.resampled:
            return len(self.frames)
        return int(round((self.along[-1] - self.along[0]) / self.step)) + 1

    def volume_slices(self) -> list[int]:
        """The volume slice of each frame: its rank, or the nearest grid slice where the volume is resampled."""
        if not self.resampled:
            return list(range(len(self.frames)))
        return [int(round((along - self.along[0]) / self.step)) for along in self.along]

    def geometry(self) -> tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, ...]]:
        """(spacing, origin, direction) of the volume, as SimpleITK takes them: x along rows, y along columns, z the normal."""
        orientation = np.asarray(self.frames[0].orientation)
        row_spacing, column_spacing = self.frames[0].pixel_spacing
        # ITK direction: row-major 3×3 whose columns are the x (row), y (column) and z (normal) axes.
        direction = np.stack([orientation[:3], orientation[3:], dicom_frames.normal(orientation)], axis=1).reshape(-1)
        return (column_spacing, row_spacing, self.step), self.frames[0].position, tuple(direction.tolist())


def slice_stack(frames: list[dicom_frames.Frame], spacing_tolerance: float = DEFAULT_SPACING_TOLERANCE) -> SliceStack:
    """Orders the frames of one volume along the slice normal, as `read_series` stacks them.

    Files that repeat another one (same position, same pixels) are left out.

    Raises:
        CaseError: too few slices, inconsistent orientation or size, or two
            different slices at one position; the detail names the files.
    """
    if len(frames) < geometry.MIN_VOXELS_PER_AXIS:
        files = sorted({frame.path for frame in frames})
        raise dead_letters.CaseError("read", "too_few_slices", f"{', '.join(files)} hold {len(frames)} slice; a volume "
                                     f"needs at least {geometry.MIN_VOXELS_PER_AXIS}")
    for frame in frames[1:]:
        if np.abs(np.subtract(frame.orientation, frames[0].orientation)).max() > 1e-4:
            raise dead_letters.CaseError("read", "inconsistent_orientation", f"{frame.name} and {frames[0].name} have "
                                      "different ImageOrientationPatient; keep one orientation per series folder")
        if frame.size != frames[0].size:
            raise dead_letters.CaseError("read", "inconsistent_slice_shape", f"{frame.name} has {frame.size} rows×columns, "
                                      f"{frames[0].name} has {frames[0].size}")
    frames, _ = drop_identical(frames, along_normal(frames))
    along = along_normal(frames)
    order = np.argsort(along, kind="stable")
    frames, along = [frames[i] for i in order], along[order]
    check_untilted(frames, along)
    step, resample = slice_grid(along, spacing_tolerance)
    return SliceStack(tuple(frames), tuple(float(v) for v in along), step, resample)


def check_untilted(frames: list[dicom_frames.Frame], along: np.ndarray) -> None:
    """Refuses slices whose positions drift within their own plane (a gantry-tilted acquisition), in one sentence.

    The volume is stacked along the slice normal from the first slice's
    position; a tilted series' slices also shift along their rows or columns
    (by step × tan(tilt) each), so stacking would place the last slice that far
    from where the scanner says it is. Drift up to half a voxel over the whole
    series (scanners' rounding of positions) is accepted.

    Raises:
        CaseError: `gantry_tilt`, naming the first and last file, the drift in mm and voxels, the tilt and the fix.
    """
    orientation = np.asarray(frames[0].orientation)
    offsets = np.array([frame.position for frame in frames]) - np.asarray(frames[0].position)
    row_spacing, column_spacing = frames[0].pixel_spacing
    # Position moves along the row direction (x, voxels of column spacing) and the column direction (y, row spacing).
    drift = np.stack([offsets @ orientation[:3], offsets @ orientation[3:]], axis=1)
    in_voxels = np.abs(drift / np.array([column_spacing, row_spacing])).max()
    if in_voxels <= 0.5:
        return
    worst = int(np.argmax(np.abs(drift).max(axis=1)))
    millimetres = float(np.hypot(*drift[worst]))
    depth = abs(float(along[worst] - along[0]))
    tilt = float(np.degrees(np.arctan2(millimetres, depth))) if depth > 0 else 90.0
    raise dead_letters.CaseError(
        "read", "gantry_tilt",
        f"{frames[worst].name} lies {millimetres:.2f} mm ({in_voxels:.1f} voxels) off the line through "
        f"{frames[0].name} along the slice normal: a gantry tilt of {tilt:.1f}°, which stacking along the normal "
        "would misplace; correct the tilt first (e.g. dcm2niix, which resamples tilted series to an untilted grid) and "
        "convert the NIfTI it writes")


def read_series(files: tuple[str, ...], spacing_tolerance: float = DEFAULT_SPACING_TOLERANCE) -> sitk.Image:
    """Reads the files of one volume into a float32 image (rescaled: HU for CT) with its patient-space geometry.

    Headers are read first (no pixel data); then each file's pixels are
    decoded in slice order straight into one float32 volume, one file at a
    time, so the read holds the volume (and, at the end, SimpleITK's copy of
    it), never every file's stored pixels beside a list of float slices.

    Raises:
        CaseError: unreadable or undecodable files, too few slices, inconsistent
            orientation or size, or two different slices at one position; the
            detail names the files.
    """
    frames = []
    for path in files:
        try:
            header = pydicom.dcmread(path, stop_before_pixels=True)
        except Exception as error:  # pydicom raises many kinds for corrupt files
            raise dead_letters.CaseError("read", "unreadable", f"{path} cannot be read ({error})") from None
        frames.extend(dicom_frames.frames_of(header, path))
    stack = slice_stack(frames, spacing_tolerance)
    volume = np.empty((len(stack.frames), *stack.frames[0].size), np.float32)  # (D, H, W)
    current, dataset, pixels = None, None, None
    for slice_index, frame in enumerate(stack.frames):
        if frame.path != current:  # a multi-frame file's frames come together; single-frame files one each
            current = frame.path
            dataset, pixels = dicom_frames.read_pixels(frame.path)
        slope, intercept = dicom_frames.rescale(dataset, frame.index)
        volume[slice_index] = pixels[frame.index or 0].astype(np.float32) * slope + intercept  # as scanners rescale
    dataset = pixels = None
    if stack.resampled:
        volume = _interpolate_slices(volume, np.asarray(stack.along), stack.step)
    spacing, origin, direction = stack.geometry()
    image = sitk.GetImageFromArray(volume)  # (D, H, W)
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(direction)
    return image


def _interpolate_slices(volume: np.ndarray, along: np.ndarray, step: float) -> np.ndarray:
    """Linear interpolation of (D, H, W) slices at sorted positions `along` onto a uniform grid of `step` mm."""
    count = int(round((along[-1] - along[0]) / step)) + 1
    targets = along[0] + step * np.arange(count)
    upper = np.clip(np.searchsorted(along, targets, side="right"), 1, len(along) - 1)
    lower = upper - 1
    weight = np.clip((targets - along[lower]) / (along[upper] - along[lower]), 0.0, 1.0).astype(np.float32)
    output = np.empty((count, *volume.shape[1:]), np.float32)  # (count, H, W), filled a slice at a time
    for index in range(count):
        output[index] = volume[lower[index]] * (1 - weight[index]) + volume[upper[index]] * weight[index]
    return output
