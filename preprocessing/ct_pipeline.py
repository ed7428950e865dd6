"""CT cases to sharded TFRecords with Beam (`fullres preprocess ct`).

Discovery and label pairing run on the launching machine (they read headers
only); reading, resampling and encoding run in Beam workers, one case each.
Output layout, dead letters and atomic replacement: `preprocessing.conversion`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import apache_beam as beam

from preprocessing import conversion, ct_io, ct_transforms, tfrecord_schema


class PreprocessCaseFn(beam.DoFn):
    """One `CaseSource` in, a serialized record (main output) or a dead letter (tagged) out."""

    def __init__(self, config: ct_transforms.CtPreprocessConfig):
        self.config = config

    def process(self, case: ct_io.CaseSource):
        try:
            record = ct_transforms.preprocess_case(case, self.config)
        except ct_io.CaseError as error:
            yield conversion.reject(conversion.dead_letter(case.image.path, error.stage, error.reason, error.detail))
            return
        except Exception as error:  # one case's surprise must not cost the other cases
            yield conversion.reject(conversion.dead_letter(case.image.path, "preprocess", "unexpected_error", repr(error)))
            return
        yield conversion.accept(tfrecord_schema.encode_ct_example(record))


def run(
    input_path: str,
    output: str,
    labels: str | None = None,
    config: ct_transforms.CtPreprocessConfig = ct_transforms.CtPreprocessConfig(),
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    log: Callable[[str], None] = print,
) -> dict:
    """Preprocesses every case under `input_path` into `output`; returns the summary.

    Raises:
        FileNotFoundError: `input_path` does not exist.
        ValueError: nothing under `input_path` looks like a CT volume.
        conversion.PreprocessingFailed: more than `max_failed_fraction` of the
            cases failed (raised after the output, good records included, is in place).
    """
    images, dead = ct_io.discover(input_path, config.spacing_tolerance)
    cases, pairing_dead = ct_io.pair_with_labels(images, labels)
    dead.extend(pairing_dead)
    if not cases and not dead:
        raise ValueError(f"no CT volumes (DICOM, {', '.join(ct_io.VOLUME_SUFFIXES)}) found under {input_path}.")
    notes = [conversion.dead_letter(source, "discover", reason, detail)
             for case in cases for source, reason, detail in case.image.notes]
    log(f"fullres preprocess ct: {len(cases)} cases to convert, {len(dead)} rejected before reading"
        f"{f', {len(notes)} notes' if notes else ''}; writing {output}")
    # The class names of DICOM SEG/RTSTRUCT labels, recorded beside the data they numbered.
    label_map = {"label_map.json": {"background": 0, **{name: i + 1 for i, name in enumerate(config.classes)}}}
    return conversion.run(
        cases, dead, PreprocessCaseFn(config), output, pipeline_args=pipeline_args, num_shards=num_shards,
        compress=compress, max_failed_fraction=max_failed_fraction, extra_files=label_map if config.classes else None,
        notes=notes, log=log,
    )
