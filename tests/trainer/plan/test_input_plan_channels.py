"""`fullres plan --data` sizes one process's share by the records' own voxel: image type × channels + the label.

Before: 3 bytes a voxel for every record (CT's int16 + uint8 label), so a video clip's share (uint8 × 3 RGB + uint8
label, 4 bytes) was stated 25 % small, and its MiB/s with it. CT's 3 bytes are held by
test_plan_sizes.py::test_a_patch_plan_sizes_the_step_on_the_patch_and_reads_the_data_as_crops.
"""

import json

import pytest
from typer.testing import CliRunner

from preprocessing.records import dataset_files
from preprocessing.video import video_clips
from tests.preprocessing.video import video_makers

CLIP = (8, 16, 16)


def _write_clips(folder) -> None:
    """Two clips of CLIP's size as `fullres preprocess video` leaves them: one shard and its summary.json."""
    video_makers.write_motion_clip_records(str(folder / "data-00000-of-00001.tfrecord"), CLIP)
    settings = video_clips.VideoPreprocessConfig(clip_length=CLIP[0], size=CLIP[1:])
    dataset_files.write_summary(str(folder), {"ok": 2, "failed": 0, "shards": ["data-00000-of-00001.tfrecord"],
                                              "label_values": {"0": 2, "1": 2, "2": 2},
                                              "preprocessing": video_clips.preprocessing_record(settings)})


@pytest.mark.slow  # one compile of the smoke UNet and three 2 s input measurements: 19 s here
def test_a_clip_plans_share_counts_three_uint8_channels_and_the_label(tmp_path, monkeypatch):
    from pipelines import cli
    from preprocessing.records import data_set

    _write_clips(tmp_path)
    resolve, kinds = data_set.resolve, []  # the records' kind is found once, before the compile, and passed on
    monkeypatch.setattr(data_set, "resolve", lambda *a, **k: kinds.append(a[0]) or resolve(*a, **k))
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--in-channels", "3", "--image-size",
                                          ",".join(map(str, CLIP)), "--input-partition-dims", "1,2,1,1,1",
                                          "--data", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)["input"]
    share = planned["share"]
    frames = share["depth"][1] - share["depth"][0]
    assert frames == CLIP[0]  # one host holds both devices of the split: all 8 frames
    assert share["bytes_per_example"] == frames * CLIP[1] * CLIP[2] * (3 + 1)  # RGB uint8 and the uint8 label
    for rate in (planned["records"], planned["cache"]):  # MiB/s is examples/s × the same bytes
        expected = rate["examples_per_second"] * share["bytes_per_example"] / 2**20
        assert abs(rate["mib_per_second"] - expected) <= 0.05 + 0.01 * expected, rate
    assert f"{share['bytes_per_example'] // 1024}.0 KiB an example" in planned["line"]
    assert share["along"] == "frames" and f"frames 0-{CLIP[0] - 1}" in planned["line"]  # a clip's axis: its frames
    assert "depths" not in planned["line"]
    assert kinds == [str(tmp_path)]


def test_clip_records_of_another_size_are_refused_as_clips(tmp_path):
    from trainer.plan import input_plan

    _write_clips(tmp_path)
    with pytest.raises(ValueError) as refused:
        input_plan.check_shape(str(tmp_path), (16, 16, 16))
    assert str(refused.value).startswith(f"--data {tmp_path} holds clips of 8x16x16 but the plan is for 16x16x16; ")


@pytest.mark.slow  # two compiles of the smoke UNet and their input measurements: about 40 s here
def test_a_plan_of_clip_records_sizes_the_three_channel_network_train_builds(tmp_path):
    """`fullres train --train CLIPS` takes its input channels from the records (`config_resolution.resolve`); the
    plan of the same records sized a 1-channel network unless told --in-channels 3. It resolves them the same way."""
    from pipelines import cli

    _write_clips(tmp_path)

    def plan(*arguments):
        result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", ",".join(map(str, CLIP)),
                                              "--input-partition-dims", "1,1,1,1,1", "--json", *arguments])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    from_records, told = plan("--data", str(tmp_path)), plan("--data", str(tmp_path), "--in-channels", "3")
    [row], [told_row] = from_records["rows"], told["rows"]
    for bytes_of in ("argument_bytes", "temp_bytes", "total_bytes"):  # the 3-channel input and first kernel
        assert row[bytes_of] == told_row[bytes_of], bytes_of
    assert ", 3 channels, " in from_records["header"] and ", 3 channels, " in told["header"]
