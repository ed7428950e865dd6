"""Inputs a careless copy or a curious folder leaves behind, for the preprocess and predict tests.

Every readable format cut short, as a copy or a download that stopped leaves it; a DICOM series with a missing
slice; a named pipe with a volume's name; a link back up out of the input folder.
"""

import os

import numpy as np
import pydicom
import SimpleITK as sitk

from preprocessing.ct import demo_ct

# name -> (suffix, compressed, the file that holds the voxels and is cut, the fraction of it kept)
CUT_SHORT = {
    "nifti_third": (".nii", False, None, 1 / 3),
    "nifti_gz": (".nii.gz", True, None, 0.6),
    "nrrd_raw": (".nrrd", False, None, 0.6),
    "nrrd_gzip": (".nrrd", True, None, 0.6),
    "mha_raw": (".mha", False, None, 0.6),
    "mha_zlib": (".mha", True, None, 0.6),
    "mhd_raw": (".mhd", False, ".raw", 0.6),
    "mhd_zraw": (".mhd", True, ".zraw", 0.6),
}


def ct_volume(shape=(12, 24, 20), seed: int = 0) -> np.ndarray:
    """A small synthetic CT (HU), big enough that its voxels outweigh any header."""
    volume, _ = demo_ct.synthetic_case(np.random.default_rng(seed), shape)
    return volume


def write_volume(volume: np.ndarray, path: str, compressed: bool) -> None:
    image = sitk.GetImageFromArray(np.round(volume).astype(np.int16))
    image.SetSpacing((1.1, 1.1, 2.5))
    sitk.WriteImage(image, path, useCompression=compressed)


def cut(path: str, fraction: float) -> None:
    """Keeps the first `fraction` of the file, as a copy that stopped there."""
    with open(path, "r+b") as file:
        file.truncate(int(os.path.getsize(path) * fraction))


def write_cut_short(folder, volume: np.ndarray) -> dict[str, str]:
    """Every volume format of `CUT_SHORT`, written whole and then cut; returns {name: the path discovery finds}."""
    os.makedirs(folder, exist_ok=True)
    written = {}
    for name, (suffix, compressed, data_suffix, fraction) in CUT_SHORT.items():
        path = os.path.join(folder, name + suffix)
        write_volume(volume, path, compressed)
        cut(path[:-len(suffix)] + data_suffix if data_suffix else path, fraction)
        written[name] = path
    return written


def write_series(volume: np.ndarray, directory, patient_name: str | None = None, missing: tuple[int, ...] = (),
                 cut_slice: int | None = None) -> list[str]:
    """A CT DICOM series; `missing` slices left out (a gap), `cut_slice` cut to 60% inside its pixel data, and a
    PatientName written as given (a one-part name, "JANEDOE7731", is what highdicom warns about)."""
    paths = demo_ct.write_dicom_series(volume, str(directory), spacing=(1.1, 1.1, 2.5))
    if patient_name is not None:
        for path in paths:
            dataset = pydicom.dcmread(path)
            dataset.PatientName = patient_name
            dataset.save_as(path)
    for index in missing:
        os.remove(paths[index])
    if cut_slice is not None:
        cut(paths[cut_slice], 0.6)
    return [path for index, path in enumerate(paths) if index not in missing]


def add_fifo_and_link_up(folder) -> None:
    """A named pipe called like a scan (reading it blocks for ever) and `up -> ..`, a link out of the folder."""
    os.mkfifo(os.path.join(folder, "pipe.nii.gz"))
    os.symlink("..", os.path.join(folder, "up"))
