"""What `fullres predict` leaves when it cannot finish: a damaged model.keras, a full disk.

One sentence each, and never a 0-byte or cut-short mask or summary.json: every output is written under a
temporary name (`.fullres-partial.NAME`), checked, then renamed.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PREPROCESSING = {"spacing": [1.7, 1.7, 2.25], "orientation": "LPS", "window": [-200.0, 300.0], "modality": "ct",
                 "shape": [32, 32, 32]}


def _noisy_scan(path, seed):
    """A CT scan of noise (HU): its mask does not compress to nothing, so it needs room on the disk."""
    voxels = np.random.default_rng(seed).uniform(-1000, 400, (40, 120, 120)).astype(np.float32)  # (z, y, x)
    scan = sitk.GetImageFromArray(voxels)
    scan.SetSpacing((0.9, 0.9, 2.5))
    sitk.WriteImage(scan, str(path))


def _run_copy(segmentation_run, folder):
    """The session's tiny segmentation run, copied, with the preprocessing of the scans recorded."""
    config, _, _ = segmentation_run
    run = folder / "run"
    shutil.copytree(config.output_dir, run, ignore=shutil.ignore_patterns("checkpoints", "saved_model", "tensorboard"))
    info = json.loads((run / "model_info.json").read_text())
    (run / "model_info.json").write_text(json.dumps({**info, "preprocessing": PREPROCESSING}))
    return run


@pytest.mark.slow  # predicts with the session's trained smoke model in a fresh process
@pytest.mark.parametrize("scan_name", ["a.nii.gz", "a.nrrd"])
def test_disk_full_while_predicting_is_one_sentence_and_leaves_no_empty_mask(segmentation_run, tmp_path, scan_name):
    """The issue: a 0-byte mask and a 0-byte summary.json. ITK's NIfTI writer even reports nothing: its file
    was cut short silently, and read back without an error."""
    run = _run_copy(segmentation_run, tmp_path)
    (tmp_path / "scans").mkdir()
    _noisy_scan(tmp_path / "scans" / scan_name, seed=0)
    (tmp_path / "disk").mkdir()
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # 12 kB hold the marker, not the mask (13 kB compressed); what is left is listed before the namespace ends.
    command = ('mount -t tmpfs -o size=12k tmpfs "$0" && { "$@"; status=$?; '
               f'find "$0" -type f -printf "%s %P\\n" > "{tmp_path / "left.txt"}"; exit $status; }}')
    result = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", command, str(tmp_path / "disk"), sys.executable, "-m", "pipelines.cli",
         "predict", "--model", str(run), "--input", str(tmp_path / "scans"), "--output",
         str(tmp_path / "disk" / "masks"), "--virtual-devices", "2", "--input-partition-dims", "1,2,1,1,1"],
        capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=600)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert errors == [f"fullres: error: the disk is full while writing {tmp_path}/disk/masks/{scan_name}; free space "
                      "there or choose an --output on a disk with room, then run again."]
    left = dict(line.split(" ", 1)[::-1] for line in (tmp_path / "left.txt").read_text().splitlines())
    assert list(left) == ["masks/.fullres-output"], left  # no mask, whole or cut short, no summary.json
    assert int(left["masks/.fullres-output"]) > 0


def test_a_write_the_disk_refuses_keeps_the_previous_summary_and_no_partial_file(tmp_path):
    """summary.json (and the marker, dead_letter.jsonl) go through a temporary name; /dev/full stands for a full disk."""
    import errno

    from trainer.predict import outputs

    outputs.write_summary(str(tmp_path), {"ok": 1})
    os.symlink("/dev/full", tmp_path / ".fullres-partial.summary.json")
    with pytest.raises(OSError) as error:
        outputs.write_summary(str(tmp_path), {"ok": 2})
    assert error.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["summary.json"]
    assert outputs.read_summary(str(tmp_path)) == {"ok": 1}


def test_a_truncated_model_keras_is_one_sentence(tmp_path):
    """The issue: a traceback ending in zipfile.BadZipFile. A real model.keras (the smoke UNet's), cut short."""
    import keras
    from typer.testing import CliRunner

    from pipelines import cli
    from trainer import presets
    from trainer.engine import run_files
    from trainer.tasks import registry

    run = tmp_path / "run"
    run.mkdir()
    config = presets.smoke(train_data=str(tmp_path / "data-*.tfrecord"), output_dir=str(run))
    run_files.write_train_config(str(run), config)
    run_files.write_model_info(str(run), "segmentation", (16, 16, 16, 1), None, PREPROCESSING)
    keras.utils.set_random_seed(0)
    registry.make_task(config).build_model().save(run / "model.keras")
    whole = (run / "model.keras").stat().st_size
    with open(run / "model.keras", "r+b") as file:
        file.truncate(whole // 2)  # a copy that stopped half way
    (tmp_path / "scans").mkdir()
    sitk.WriteImage(sitk.GetImageFromArray(np.full((8, 8, 8), -950, np.float32)), str(tmp_path / "scans" / "a.nii.gz"))
    result = CliRunner().invoke(cli.app, ["predict", "--model", str(run), "--input", str(tmp_path / "scans"),
                                          "--output", str(tmp_path / "masks")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"fullres: error: {run}/model.keras is damaged (not a complete Keras archive, {whole // 2} bytes); copy "
        "model.keras again from the run that trained it, or retrain with `fullres train`.")
