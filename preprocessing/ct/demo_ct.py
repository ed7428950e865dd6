"""Synthetic CT-like volumes with label maps, for the demo and the tests.

Each case is a body (soft tissue with a fat rim, in air) holding two labelled
"organs" — a large ellipsoid (class 1, liver-like, ~100 HU) and a small one
(class 2, kidney-like, ~180 HU) — and an unlabelled bright "spine" (~700 HU)
as a distractor. Pose, size and position are random; the intensities carry
smooth texture and scanner-like noise, in Hounsfield units. Nothing is
downloaded: every voxel comes from a seeded random generator.
"""

from __future__ import annotations

import os

import numpy as np
from scipy import ndimage

from preprocessing.ct import ct_transforms, intensity
from preprocessing.records import dataset_files, tfrecord_schema

AIR_HU, FAT_HU, TISSUE_HU = -1000.0, -100.0, 40.0
ORGAN_HU = {1: 100.0, 2: 180.0}
BONE_HU = 700.0
DEMO_WINDOW = (-200.0, 300.0)
CLASS_NAMES = ("background", "liver", "kidney")


def _rotation(rng: np.random.Generator, max_degrees: float) -> np.ndarray:
    """A random 3×3 rotation: three Euler angles of up to `max_degrees` each."""
    matrix = np.eye(3)
    for axes in ((0, 1), (0, 2), (1, 2)):
        angle = np.deg2rad(rng.uniform(-max_degrees, max_degrees))
        plane = np.eye(3)
        i, j = axes
        plane[i, i] = plane[j, j] = np.cos(angle)
        plane[i, j], plane[j, i] = -np.sin(angle), np.sin(angle)
        matrix = matrix @ plane
    return matrix


def _ellipsoid(grid: np.ndarray, center, semi_axes, rotation: np.ndarray) -> np.ndarray:
    """Boolean mask of an ellipsoid on `grid` (3, D, H, W) of normalized coordinates."""
    offset = grid - np.asarray(center, np.float32)[:, None, None, None]  # (3, D, H, W)
    local = np.einsum("ij,jdhw->idhw", rotation.T.astype(np.float32), offset)  # (3, D, H, W)
    return np.sum((local / np.asarray(semi_axes, np.float32)[:, None, None, None]) ** 2, axis=0) <= 1.0


def synthetic_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic CT case.

    Args:
        rng: the random generator (its state decides the whole case).
        shape: (D, H, W) in voxels.

    Returns:
        (volume, label): (D, H, W) float32 in HU and (D, H, W) uint8 class ids
        (0 background, 1 liver-like, 2 kidney-like).
    """
    axes = [np.linspace(-1.0, 1.0, n, dtype=np.float32) for n in shape]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"))  # (3, D, H, W)
    pose = _rotation(rng, 15.0)

    body_axes = np.array([1.1, 0.8, 0.9]) * rng.uniform(0.9, 1.05, 3)
    body = _ellipsoid(grid, (0, 0, 0), body_axes, pose)
    inner = _ellipsoid(grid, (0, 0, 0), body_axes * 0.88, pose)
    volume = np.full(shape, AIR_HU, np.float32)
    volume[body] = FAT_HU
    volume[inner] = TISSUE_HU
    label = np.zeros(shape, np.uint8)

    liver_center = pose @ np.array([rng.uniform(-0.15, 0.15), rng.uniform(-0.2, 0.05), rng.uniform(-0.35, -0.1)])
    liver = _ellipsoid(grid, liver_center, np.array([0.55, 0.45, 0.4]) * rng.uniform(0.8, 1.2, 3), pose @ _rotation(rng, 25.0))
    kidney_center = pose @ np.array([rng.uniform(-0.2, 0.2), rng.uniform(0.1, 0.3), rng.uniform(0.25, 0.45)])
    kidney = _ellipsoid(grid, kidney_center, np.array([0.3, 0.22, 0.22]) * rng.uniform(0.8, 1.2, 3), pose @ _rotation(rng, 30.0))
    spine = _ellipsoid(grid, pose @ np.array([0.0, 0.55, 0.0]), (1.2, 0.1, 0.1), pose)
    for mask, class_id in ((liver & inner, 1), (kidney & inner, 2)):
        volume[mask] = ORGAN_HU[class_id] + rng.normal(0, 8)
        label[mask] = class_id
    volume[spine & inner] = BONE_HU
    label[spine & inner] = 0

    texture = ndimage.gaussian_filter(rng.normal(0, 1, shape).astype(np.float32), sigma=2.0)
    volume += np.where(body, 60.0 * texture, 0.0).astype(np.float32)
    volume += rng.normal(0, 20, shape).astype(np.float32)
    return volume, label


def write_demo_tfrecords(
    output_dir: str,
    num_train: int = 24,
    num_eval: int = 6,
    shape: tuple[int, int, int] = (32, 32, 32),
    seed: int = 0,
    spacing: tuple[float, float, float] = (1.5, 1.5, 2.5),
) -> dict:
    """Writes synthetic cases straight into CT TFRecords (one shard per split) and the folder's `summary.json`.

    The summary describes the records as a conversion would (their shards, the
    cases holding each label value, the preprocessing: spacing, window, shape),
    so training accepts them and records that preprocessing; both splits share
    the folder, so name each by its pattern.

    Returns:
        `{"train": pattern, "eval": pattern, "num_classes": 3, "shape": shape}`.
    """
    import tensorflow as tf

    os.makedirs(output_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    patterns, shards, label_values = {}, [], {}
    for split, count in (("train", num_train), ("eval", num_eval)):
        path = os.path.join(output_dir, f"{split}-00000-of-00001.tfrecord")
        shards.append(os.path.basename(path))
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for index in range(count):
                volume, label = synthetic_case(rng, shape)
                for value in np.unique(label):
                    label_values[str(value)] = label_values.get(str(value), 0) + 1
                record = tfrecord_schema.CtRecord(
                    case_id=f"demo-{split}-{index:04d}",
                    source_path=f"synthetic://{split}/{index}",
                    image=intensity.window_and_scale(volume, DEMO_WINDOW),
                    label=label,
                    spacing=spacing,
                    window=DEMO_WINDOW,
                )
                writer.write(tfrecord_schema.encode_ct_example(record))
        os.replace(path + ".tmp", path)
        patterns[split] = os.path.join(output_dir, f"{split}-*.tfrecord")
    preprocessing = ct_transforms.preprocessing_record(
        ct_transforms.CtPreprocessConfig(spacing=spacing, window=DEMO_WINDOW, shape=tuple(shape), modality="ct"))
    dataset_files.write_summary(output_dir, {
        "ok": num_train + num_eval, "failed": 0, "reasons": {}, "shards": shards,
        "label_values": dict(sorted(label_values.items(), key=lambda item: int(item[0]))),
        "modality": "ct", "preprocessing": preprocessing})
    return {**patterns, "num_classes": len(CLASS_NAMES), "shape": list(shape)}


def write_dicom_series(
    volume_hu: np.ndarray,
    directory: str,
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0),
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0),
    direction: tuple[float, ...] = (1, 0, 0, 0, 1, 0, 0, 0, 1),
    rng: np.random.Generator | None = None,
) -> list[str]:
    """Writes a (D, H, W) HU volume as a CT DICOM series, one file per slice.

    Stored values are int16 with RescaleSlope 1 and RescaleIntercept -1024, as
    scanners write them. With `rng`, file names and InstanceNumbers are shuffled,
    so a reader that trusts either orders the slices wrongly.

    Returns:
        The paths written, in slice order.
    """
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    os.makedirs(directory, exist_ok=True)
    matrix = np.asarray(direction, float).reshape(3, 3)
    row, column, normal = matrix[:, 0], matrix[:, 1], matrix[:, 2]
    series_uid, study_uid, frame_of_reference = generate_uid(), generate_uid(), generate_uid()
    depth = volume_hu.shape[0]
    names = np.arange(depth) if rng is None else rng.permutation(depth)
    paths = []
    for z in range(depth):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        dataset = pydicom.Dataset()
        dataset.file_meta = meta
        dataset.SOPClassUID, dataset.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        dataset.StudyInstanceUID, dataset.SeriesInstanceUID = study_uid, series_uid
        dataset.FrameOfReferenceUID = frame_of_reference  # Type 1 in CT: a DICOM SEG of the series shares it
        dataset.Modality, dataset.PatientID = "CT", "fullres-demo"
        dataset.InstanceNumber = int(names[z]) + 1
        position = np.asarray(origin, float) + z * spacing[2] * normal
        dataset.ImagePositionPatient = [f"{v:.6f}" for v in position]
        dataset.ImageOrientationPatient = [f"{v:.6f}" for v in (*row, *column)]
        dataset.PixelSpacing = [f"{spacing[1]:.6f}", f"{spacing[0]:.6f}"]  # (row spacing, column spacing)
        dataset.SliceThickness = f"{spacing[2]:.6f}"
        dataset.Rows, dataset.Columns = volume_hu.shape[1], volume_hu.shape[2]
        dataset.SamplesPerPixel, dataset.PhotometricInterpretation = 1, "MONOCHROME2"
        dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit, dataset.PixelRepresentation = 16, 16, 15, 1
        dataset.RescaleSlope, dataset.RescaleIntercept = 1, -1024
        stored = np.clip(np.round(volume_hu[z] + 1024), -32768, 32767).astype(np.int16)
        dataset.PixelData = stored.tobytes()
        path = os.path.join(directory, f"IM{int(names[z]):05d}.dcm")
        dataset.save_as(path, enforce_file_format=True)
        paths.append(path)
    return paths


def demo_case_files(num_cases: int, shape: tuple[int, int, int], formats: tuple[str, ...] = ("dicom", "nifti")
                    ) -> list[str]:
    """The files `write_demo_cases` writes, relative to its `output_dir` (what `fullres demo-data ct` claims)."""
    files = []
    for index in range(num_cases):
        case_id = f"case{index:03d}"
        if "dicom" in formats:
            files += [f"dicom/images/{case_id}/IM{z:05d}.dcm" for z in range(shape[0])]
        if "nifti" in formats:
            files.append(f"nifti/images/{case_id}.nii.gz")
        files += [f"{kind}/labels/{case_id}.nii.gz" for kind in formats]
    return sorted(files)


def write_demo_cases(output_dir: str, num_cases: int = 8, shape: tuple[int, int, int] = (48, 64, 64),
                     seed: int = 0, formats: tuple[str, ...] = ("dicom", "nifti"), turned: bool = False) -> dict:
    """Writes the same synthetic cases as DICOM series and as NIfTI, each with a NIfTI label map.

    Spacing varies from case to case (anisotropic, thicker slices), as in real
    scans, so preprocessing has something to resample. With `turned`, the NIfTI
    scans and label maps store the same anatomy in another voxel order: rows and
    columns swapped and two axes flipped, recorded in a non-identity direction
    (as scans from other scanners and tools come); NIfTI only.

    Returns:
        `{"dicom": dir, "nifti": dir}` (the `formats` asked for); each holds `images/` and `labels/`.
    """
    import SimpleITK as sitk

    rng = np.random.default_rng(seed)
    unknown = set(formats) - {"dicom", "nifti"}
    if unknown:
        raise ValueError(f"unknown demo formats {sorted(unknown)}; use dicom and/or nifti.")
    if turned and "dicom" in formats:
        raise ValueError("turned cases are written as NIfTI only; ask for formats=('nifti',).")
    roots = {kind: os.path.join(output_dir, kind) for kind in formats}
    for root in roots.values():
        os.makedirs(os.path.join(root, "images"), exist_ok=True)
        os.makedirs(os.path.join(root, "labels"), exist_ok=True)
    for index in range(num_cases):
        case_id = f"case{index:03d}"
        volume, label = synthetic_case(rng, shape)
        spacing = (float(rng.uniform(0.7, 1.0)),) * 2 + (float(rng.choice([1.5, 2.0, 2.5, 3.0])),)
        origin = tuple(float(v) for v in rng.uniform(-200, 0, 3))
        if "dicom" in roots:
            write_dicom_series(volume, os.path.join(roots["dicom"], "images", case_id), spacing, origin, rng=rng)
        image = sitk.GetImageFromArray(volume)
        image.SetSpacing(spacing)
        image.SetOrigin(origin)
        labels = sitk.GetImageFromArray(label)
        labels.CopyInformation(image)
        if turned:  # x and y swapped, x and z flipped: the direction says so, the anatomy stays where it was
            image, labels = (sitk.Flip(sitk.PermuteAxes(v, [1, 0, 2]), [True, False, True]) for v in (image, labels))
        if "nifti" in roots:
            sitk.WriteImage(image, os.path.join(roots["nifti"], "images", f"{case_id}.nii.gz"))
        for root in roots.values():
            sitk.WriteImage(labels, os.path.join(root, "labels", f"{case_id}.nii.gz"))
    return roots
