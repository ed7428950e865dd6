"""Real video files, written by FFmpeg's encoders, decoded to the right frames, size and rate; trouble named."""

import os

import numpy as np
import pytest

from common import dead_letters
from preprocessing.video import frames as frames_lib, mask_frames, video_clips, video_discovery, video_files
from tests.preprocessing.video import video_makers


def _decode(path, size=(32, 32)):
    return video_files.decode(str(path), lambda source: frames_lib.crop_box(source, size, "crop"),
                              lambda frame, box: frames_lib.fit_frame(frame, size, box))


def _reason(path) -> str:
    with pytest.raises(dead_letters.CaseError) as caught:
        _decode(path)
    return caught.value.reason


@pytest.mark.parametrize("name, codec, fps, count, size", [
    ("clip.mp4", "libx264", 25, 37, (72, 96)),
    ("clip.avi", "mpeg4", 10, 23, (48, 64)),
    ("clip.mkv", "libx264", 30, 31, (90, 160)),
    ("clip.mov", "mpeg4", 24, 26, (64, 48)),
])
def test_real_videos_decode_to_the_frames_size_and_rate_a_second_decoder_reports(tmp_path, name, codec, fps, count,
                                                                                 size):
    path = video_makers.encode(str(tmp_path / name), video_makers.frames(count, size), fps, codec)
    decoded = _decode(path)
    probed = video_makers.ffmpeg_probe(path)
    assert probed == {"frames": count, "size": size, "fps": float(fps)}  # the second decoder agrees with the truth
    assert (len(decoded.frames), decoded.source_size, decoded.fps) == (probed["frames"], probed["size"], probed["fps"])
    assert decoded.frames.shape == (count, 32, 32, 3)


def test_frames_keep_their_order_and_picture(tmp_path):
    images = video_makers.frames(12, (32, 32))
    path = video_makers.encode(str(tmp_path / "a.mp4"), images, 25)
    decoded = _decode(path)
    assert np.abs(decoded.frames.astype(int) - images.astype(int)).mean() < 6  # lossy H.264, same picture
    errors = [np.abs(decoded.frames[5].astype(int) - images[t].astype(int)).mean() for t in range(12)]
    assert int(np.argmin(errors)) == 5


def test_each_kind_of_trouble_is_named(tmp_path):
    images = video_makers.frames(30, (48, 64))
    (tmp_path / "empty.mp4").write_bytes(b"")
    assert _reason(tmp_path / "empty.mp4") == "empty_file"
    (tmp_path / "text.mp4").write_bytes(b"not a video at all" * 10)
    assert _reason(tmp_path / "text.mp4") == "undecodable"
    indexed_first = video_makers.encode(str(tmp_path / "fast.mp4"), images, 25, faststart=True)
    data = open(indexed_first, "rb").read()
    (tmp_path / "cut.mp4").write_bytes(data[:len(data) // 2])
    assert _reason(tmp_path / "cut.mp4") == "cut_short"
    index_last = open(video_makers.encode(str(tmp_path / "plain.mp4"), images, 25), "rb").read()
    (tmp_path / "cut_index.mp4").write_bytes(index_last[:len(index_last) // 2])
    assert _reason(tmp_path / "cut_index.mp4") == "undecodable"
    assert _reason(video_makers.encode(str(tmp_path / "vfr.mp4"), images, 25, durations_ms=[40, 100])) == \
        "variable_frame_rate"
    assert _reason(video_makers.encode(str(tmp_path / "phone.mp4"), images, 25, rotation=90)) == "rotation_metadata"
    assert _reason(video_makers.encode_audio_only(str(tmp_path / "song.mp4"))) == "audio_only"


def test_mask_trouble_is_named(tmp_path):
    masks = np.zeros((3, 8, 8), np.uint8)
    masks[:, 2:4, 2:4] = 1
    video_makers.write_masks(tmp_path / "good", masks)
    files = mask_frames.mask_files(str(tmp_path / "good"))
    assert mask_frames.read_masks(files, (8, 8), lambda m: m, 1).sum() == 12
    with pytest.raises(dead_letters.CaseError, match="classes run 0..0"):
        mask_frames.read_masks(files, (8, 8), lambda m: m, 0)
    with pytest.raises(dead_letters.CaseError, match="frame is 9×8"):
        mask_frames.read_masks(files, (8, 9), lambda m: m, 1)
    video_makers.write_masks(tmp_path / "good", masks[:1], palette=[0, 0, 0, 0, 255, 0], start=3)  # another palette
    with pytest.raises(dead_letters.CaseError) as caught:
        mask_frames.read_masks(mask_frames.mask_files(str(tmp_path / "good")), (8, 8), lambda m: m, 1)
    assert caught.value.reason == "palette_differs"
    frames = [f"{t:05d}.jpg" for t in range(4)]
    with pytest.raises(dead_letters.CaseError) as caught:
        mask_frames.pair_names(frames, [f"{t:05d}.png" for t in range(3)])
    assert caught.value.reason == "label_frames_missing" and "00003.png" in caught.value.detail
    with pytest.raises(dead_letters.CaseError) as caught:
        mask_frames.count_masks(4, [f"{t:05d}.png" for t in range(5)])
    assert caught.value.reason == "label_frames_extra"


def test_clips_record_their_source_frames_and_rate(tmp_path):
    count = 20
    video_makers.encode(str(tmp_path / "walk.mp4"), video_makers.frames(count, (48, 64)), 12)
    masks = np.zeros((count, 48, 64), np.uint8)
    masks[:, 10:20, 30:40] = 2
    video_makers.write_masks(tmp_path / "walk", masks)
    sources, layout = video_discovery.discover(str(tmp_path))
    assert layout == "video files" and [s.video_id for s in sources] == ["walk"] and len(sources[0].masks) == count
    config = video_clips.VideoPreprocessConfig(clip_length=8, clip_stride=6, size=(24, 24))
    clips = video_clips.video_to_clips(sources[0], config)
    assert [c.source_frames[0] for c in clips] == [0, 6, 12]  # 18 + 8 > 20: no fourth clip
    assert all(c.fps == 12.0 and c.frame_count == count and c.image.shape == (8, 24, 24, 3) for c in clips)
    assert clips[1].source_frames == tuple(range(6, 14)) and clips[0].label_values == (0, 2)
    # crop: 48x64 scaled to cover 24x24 is 24x32; the middle 24 columns kept, so the square (x 30..40) stays in
    assert (clips[0].label == 2).sum() == 8 * 5 * 5
    with pytest.raises(dead_letters.CaseError, match="--clip-length 20 or less"):
        video_clips.video_to_clips(sources[0], video_clips.VideoPreprocessConfig(clip_length=21, size=(24, 24)))


def test_davis_frame_folders_pair_frames_and_masks(tmp_path):
    root = tmp_path / "DAVIS"
    for video in ("bear", "car"):
        folder = root / "JPEGImages" / "480p" / video
        folder.mkdir(parents=True)
        for t, image in enumerate(video_makers.frames(5, (24, 32))):
            from PIL import Image
            Image.fromarray(image).save(folder / f"{t:05d}.jpg")
        video_makers.write_masks(root / "Annotations" / "480p" / video, np.ones((5 if video == "bear" else 4, 24, 32),
                                                                                np.uint8))
    sources, layout = video_discovery.discover(str(root))
    assert layout.startswith("frame folders") and [s.video_id for s in sources] == [os.path.join("480p", "bear"),
                                                                                     os.path.join("480p", "car")]
    config = video_clips.VideoPreprocessConfig(clip_length=5, size=(16, 16), folder_fps=24)
    clip = video_clips.video_to_clips(sources[0], config)[0]
    assert clip.fps == 24 and clip.label.shape == (5, 16, 16) and clip.label.min() == 1
    with pytest.raises(dead_letters.CaseError) as caught:
        video_clips.video_to_clips(sources[1], config)
    assert caught.value.reason == "label_frames_missing"


def test_a_video_without_an_index_stops_decoding_at_the_bound(tmp_path):
    path = video_makers.encode(str(tmp_path / "long.mkv"), video_makers.frames(12, (24, 32)), 25)  # MKV: no count
    config = video_clips.VideoPreprocessConfig(clip_length=2, size=(16, 16), max_decoded_bytes=5 * 1024)
    decoded = []
    with pytest.raises(dead_letters.CaseError) as caught:
        video_files.decode(path, lambda source: frames_lib.crop_box(source, (16, 16), "crop"),
                           lambda frame, box: decoded.append(frame) or frames_lib.fit_frame(frame, (16, 16), box),
                           config.check_length)
    assert caught.value.reason == "too_large" and caught.value.detail.startswith("it has more than 5 frames")
    assert len(decoded) == 5  # the sixth frame was never fitted: decoding stopped at the bound
