"""Every command that writes files keeps a user's file that lies where it would write.

One case per command: a user's file sits at a path the command writes (or in
the folder it writes into); the command must exit non-zero with one sentence
naming the folder, the file and the fix, and the file must survive byte for
byte. The commands run through the real `fullres` command line (in process,
on the 8 test devices), on inputs the demo-data generators make.

`fullres image build` writes no file (it builds a Docker image), and `fullres
plan` writes none either; neither is swept.
"""

from __future__ import annotations

import json
import os

import pytest
from tests.files import snapshot

USER_BYTES = b"\x00user's own data, not fullres's\xff" * 64
FOREIGN = ("{option} {output} holds files fullres did not write ({name}); fullres never deletes or overwrites them, "
           "so {fix}.")
MOVE_AWAY = "pass a new or empty directory as {option}, or move those files away"


def _ct_scans(root) -> str:
    """One tiny synthetic CT case as NIfTI: `root/nifti/images/case000.nii.gz` and its label map."""
    from preprocessing.ct import demo_ct

    return demo_ct.write_demo_cases(str(root), 1, (6, 12, 12), seed=3, formats=("nifti",))["nifti"]


def _photos(root) -> dict:
    from preprocessing.images import demo_images

    return demo_images.write_demo_coco(str(root), 1, (32, 32), seed=3)


def demo_data_ct_over_a_slice(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["demo-data", "ct", "--output", str(output), "--cases", "1", "--shape", "4,8,8"], output,
            "dicom/images/case000/IM00001.dcm", MOVE_AWAY)


def demo_data_ct_beside_a_series(tmp_path, demo_data):
    # Not overwritten, but synthetic slices would join the user's series: as bad.
    output = tmp_path / "mine"
    return (["demo-data", "ct", "--output", str(output), "--cases", "1", "--shape", "4,8,8"], output,
            "dicom/images/case000/IM00900.dcm", MOVE_AWAY)


def demo_data_images(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["demo-data", "images", "--output", str(output), "--images", "1", "--size", "32"], output,
            "images/shapes_00000.png", MOVE_AWAY)


def preprocess_ct(tmp_path, demo_data):
    scans, output = _ct_scans(tmp_path / "scans"), tmp_path / "mine"
    return (["preprocess", "ct", "--input", f"{scans}/images", "--labels", f"{scans}/labels", "--output", str(output),
             "--workers", "1"], output, "summary.json", MOVE_AWAY)


def preprocess_images(tmp_path, demo_data):
    photos, output = _photos(tmp_path / "photos"), tmp_path / "mine"
    return (["preprocess", "images", "--annotations", photos["annotations"], "--images", photos["images"],
             "--output", str(output), "--workers", "1"], output, "label_map.json", MOVE_AWAY)


def train(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["train", "--train", demo_data["train"], "--output", str(output), "--preset", "smoke", "--steps", "1",
              "--batch-size", "8"],
            output, "train_config.json",
            "pass a new or empty directory as {option}, or the output of an earlier `fullres train` to resume it")


def predict(tmp_path, demo_data):
    from preprocessing.ct import ct_transforms

    scans, output, model = _ct_scans(tmp_path / "scans"), tmp_path / "mine", tmp_path / "model"
    model.mkdir()  # predict refuses the output before it loads the model: a run's two files are enough here
    (model / "model.keras").write_bytes(b"")
    preprocessing = ct_transforms.preprocessing_record(ct_transforms.CtPreprocessConfig(spacing=(2.0, 2.0, 2.0)))
    (model / "model_info.json").write_text(json.dumps({"task": "segmentation", "image_shape": [8, 8, 8, 1],
                                                       "class_names": ["background", "liver", "kidney"],
                                                       "preprocessing": preprocessing}))
    return (["predict", "--model", str(model), "--input", f"{scans}/images", "--output", str(output)], output,
            "case000.nii.gz", MOVE_AWAY)


def demo_data_video(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["demo-data", "video", "--output", str(output), "--videos", "1", "--frames", "4", "--size", "16,16"],
            output, "videos/motion_000/00003.png", MOVE_AWAY)


def _videos(root) -> str:
    from preprocessing.video import demo_video

    return demo_video.write_demo_videos(str(root), videos=1, frames=4, size=(16, 16), seed=3)["videos"]


def preprocess_video(tmp_path, demo_data):
    videos, output = _videos(tmp_path / "videos"), tmp_path / "mine"
    return (["preprocess", "video", "--input", videos, "--output", str(output), "--clip-length", "4", "--size",
             "16,16", "--workers", "1"], output, "summary.json", MOVE_AWAY)


def predict_video(tmp_path, demo_data):
    from preprocessing.video import video_clips

    videos, output, model = _videos(tmp_path / "videos"), tmp_path / "mine", tmp_path / "model"
    model.mkdir()  # a video run's two files: predict refuses the output before it loads the model
    (model / "model.keras").write_bytes(b"")
    preprocessing = video_clips.preprocessing_record(video_clips.VideoPreprocessConfig(clip_length=4, size=(16, 16)))
    (model / "model_info.json").write_text(json.dumps({"task": "segmentation", "image_shape": [4, 16, 16, 3],
                                                       "class_names": None, "preprocessing": preprocessing}))
    return (["predict", "--model", str(model), "--input", videos, "--output", str(output)], output,
            "motion_000.overlay.mp4", MOVE_AWAY)


def demo(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["demo", "--output", str(output)], output, "data/train/nifti/images/case000.nii.gz",
            "pass a new or empty directory as {option}")


def pipeline_run(tmp_path, demo_data):
    output = tmp_path / "mine"
    for inputs in ("scans", "eval"):  # they exist: the parameters are checked before the pipeline root
        (tmp_path / inputs).mkdir()
    return (["pipeline", "run", "--local", "--pipeline-root", str(output), "--param",
             f"train_input_uri={tmp_path / 'scans'}", "--param", f"eval_input_uri={tmp_path / 'eval'}"], output,
            "results.csv", "pass a new or empty directory as {option}")


def pipeline_compile(tmp_path, demo_data):
    output = tmp_path / "mine"
    return (["pipeline", "compile", "--output-dir", str(output)], output, "pipeline.yaml", None)


@pytest.mark.parametrize("case", [demo_data_ct_over_a_slice, demo_data_ct_beside_a_series, demo_data_images,
                                  preprocess_ct, preprocess_images, train, predict, demo, pipeline_run,
                                  pipeline_compile, demo_data_video, preprocess_video, predict_video],
                         ids=lambda case: case.__name__)
def test_a_users_file_where_a_command_writes_survives_and_the_command_says_why(tmp_path, demo_data, case):
    from typer.testing import CliRunner

    from pipelines import cli

    arguments, output, name, fix = case(tmp_path, demo_data)
    option = next(a for a in arguments if a in ("--output", "--pipeline-root", "--output-dir"))
    (output / name).parent.mkdir(parents=True, exist_ok=True)
    (output / name).write_bytes(USER_BYTES)
    before = snapshot(output)

    result = CliRunner().invoke(cli.app, arguments)

    assert snapshot(output) == before  # the user's file byte for byte, and nothing added beside it
    assert result.exit_code == 2, result.output
    if fix is None:  # a single file fullres would replace (compile writes two named files into a folder)
        expected = (f"{option} {output} holds {name}, which fullres did not compile; fullres never overwrites it, so "
                    f"pass another {option}, or move {name} away.")
    else:
        expected = FOREIGN.format(option=option, output=output, name=name, fix=fix.format(option=option))
    assert result.stderr.strip() == f"fullres: error: {expected}"


def test_rerunning_a_command_into_its_own_output_still_works(tmp_path):
    """The rule refuses only what fullres did not write: demo-data and compile replace their own files."""
    from typer.testing import CliRunner

    from pipelines import cli

    for arguments in (["demo-data", "ct", "--output", str(tmp_path / "ct"), "--cases", "1", "--shape", "4,8,8"],
                      ["demo-data", "images", "--output", str(tmp_path / "images"), "--images", "1", "--size", "32"],
                      ["pipeline", "compile", "--output-dir", str(tmp_path / "compiled")]):
        for _ in range(2):
            result = CliRunner().invoke(cli.app, arguments)
            assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "compiled")) == ["detection-pipeline.yaml", "pipeline.yaml",
                                                         "video-pipeline.yaml"]
