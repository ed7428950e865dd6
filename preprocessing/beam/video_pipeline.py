"""Videos to sharded clip TFRecords with Beam (`fullres preprocess video`).

Discovery runs on the launching machine (it lists files only); decoding,
fitting and cutting into clips run in Beam workers, one video each, which
yields all of that video's clips or one dead letter. Output layout, dead
letters and atomic replacement: `preprocessing.beam.conversion`; the record
layout: `preprocessing.records.video_clips`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

from common import dead_letters, hidden_files, identifiers, output_guard
from preprocessing.beam import conversion, counting
from preprocessing.records import video_clips as clip_records
from preprocessing.video import video_clips, video_discovery


class VideoToClipsFn(beam.DoFn):
    """One `VideoSource` in, its serialized clips (main output) or a dead letter (tagged) out."""

    def __init__(self, config: video_clips.VideoPreprocessConfig, scrubber: identifiers.Scrubber = identifiers.Scrubber()):
        self.config, self.scrubber = config, scrubber

    def process(self, source: video_discovery.VideoSource):
        try:
            clips = video_clips.video_to_clips(source, self.config)
        except dead_letters.CaseError as error:
            yield counting.reject(dead_letters.dead_letter(source.relative, error.stage, error.reason,
                                                           self.scrubber(error.detail)))
            return
        except Exception as error:  # one video's surprise must not cost the others
            yield counting.reject(dead_letters.dead_letter(source.relative, "preprocess", "unexpected_error",
                                                           self.scrubber(repr(error))))
            return
        Metrics.counter(counting.METRICS_NAMESPACE, "videos").inc()
        Metrics.counter(counting.METRICS_NAMESPACE, "frames").inc(clips[0].frame_count)
        for clip in clips:
            for value in clip.label_values:
                counting.count("label_values", value)
            yield counting.accept(clip_records.encode_video_clip(clip))


def run(
    input_path: str,
    output: str,
    labels: str | None = None,
    config: video_clips.VideoPreprocessConfig = video_clips.VideoPreprocessConfig(),
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> dict:
    """Cuts every video under `input_path` into clips in `output`; returns the summary.

    Raises:
        FileNotFoundError: `input_path` does not exist.
        ValueError: nothing under `input_path` is a video or a frame folder.
        output_guard.OutputRefused: `output` overlaps the inputs, or holds files fullres did not write.
        conversion.PreprocessingFailed: more than `max_failed_fraction` of the videos failed (raised after the
            output, good clips included, is in place).
    """
    dead_letters.check_failed_fraction(max_failed_fraction)
    output_guard.check_conversion_output(output, {"input": input_path, "labels": labels})
    sources, layout = video_discovery.discover(input_path, labels)
    if not sources:
        raise ValueError(f"no {video_discovery.WHAT_IS_TAKEN} found under {input_path}.")
    video_discovery.check_masks_found(sources, labels)
    roots = [os.path.abspath(p) for p in (input_path, labels) if p]
    scrubber = identifiers.Scrubber(tuple((root, os.path.basename(root)) for root in roots))
    labelled = sum(1 for source in sources if source.masks)
    hidden = sum(source.hidden for source in sources)
    log(f"fullres preprocess video: {len(sources)} videos ({layout}, {labelled} with masks"
        f"{hidden_files.said(hidden)}) to cut into clips of {config.clip_length} frames every {config.clip_stride} "
        f"at {config.size[0]}x{config.size[1]}; writing {output}")

    def fields(counters: dict) -> dict:
        return {"layout": layout, "videos": int(counters.get("videos", 0)), "frames": int(counters.get("frames", 0)),
                "hidden_files_ignored": hidden, "preprocessing": video_clips.preprocessing_record(config)}

    return conversion.run(sources, [], VideoToClipsFn(config, scrubber), output, pipeline_args=pipeline_args,
                          num_shards=num_shards, compress=compress, max_failed_fraction=max_failed_fraction,
                          summary_fields=fields, log=log)
