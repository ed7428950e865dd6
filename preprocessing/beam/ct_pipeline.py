"""CT cases to sharded TFRecords with Beam (`fullres preprocess ct`).

Discovery and label pairing run on the launching machine (they read headers
only); reading, resampling and encoding run in Beam workers, one case each.
Output layout, dead letters and atomic replacement: `preprocessing.beam.conversion`.
Outputs name cases by relative paths or pseudonyms: `common.identifiers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

from common import dead_letters, hidden_files
from common import identifiers, output_guard
from preprocessing.beam import conversion, counting
from preprocessing.ct import ct_io, ct_transforms, intensity, label_pairing, volume_discovery
from preprocessing.records import dataset_files, tfrecord_schema


class PreprocessCaseFn(beam.DoFn):
    """One `CaseSource` in, a serialized record (main output) or a dead letter (tagged) out.

    Args:
        config: how cases are transformed.
        scrubber: applied to dead-letter details, so they hold no absolute path.
        roots: the input (and labels) locations, for relative names.
        pseudonymized: case ids are pseudonyms; names of the case's files are cut from details too.
    """

    def __init__(self, config: ct_transforms.CtPreprocessConfig, scrubber: identifiers.Scrubber = identifiers.Scrubber(),
                 roots: tuple[str, ...] = (), pseudonymized: bool = False):
        self.config, self.scrubber, self.roots, self.pseudonymized = config, scrubber, roots, pseudonymized

    def process(self, case: ct_io.CaseSource):
        source = case.image.name or case.case_id
        try:
            record = ct_transforms.preprocess_case(case, self.config)
        except dead_letters.CaseError as error:
            scrub = identifiers.case_scrubber(self.scrubber, case, self.pseudonymized, self.roots)
            yield counting.reject(dead_letters.dead_letter(source, error.stage, error.reason, scrub(error.detail)))
            return
        except Exception as error:  # one case's surprise must not cost the other cases
            scrub = identifiers.case_scrubber(self.scrubber, case, self.pseudonymized, self.roots)
            yield counting.reject(dead_letters.dead_letter(source, "preprocess", "unexpected_error", scrub(repr(error))))
            return
        Metrics.counter(counting.METRICS_NAMESPACE, f"normalization_{record.normalization}").inc()
        for warning in record.warnings:
            Metrics.counter(counting.METRICS_NAMESPACE, f"warning_{warning}").inc()
        Metrics.counter(counting.METRICS_NAMESPACE, f"{MODALITY_SEEN}{record.modality_seen}").inc()
        if record.intensity_range is not None:
            counting.extreme("intensity_low", record.intensity_range[0])
            counting.extreme("intensity_high", record.intensity_range[1])
        serialized = tfrecord_schema.encode_ct_example(record)
        for value in record.label_values:
            counting.count("label_values", value)  # cases holding each class id
        for label_class, voxels in record.cropped_voxels:
            counting.count("cropped_voxels", label_class, voxels)
            counting.count("cropped_cases", label_class)
        yield counting.accept(serialized)


MODALITY_SEEN = "modality_seen_"  # counters of the scans' modalities, by what each turned out to be


def data_modality(counters: dict) -> dict | None:
    """What the converted scans turned out to be, for summary.json (`data_modality`; training copies it into
    model_info.json and predict checks new scans against it): how many scans of each modality (DICOM Modality, else
    CT or MR from the values, `intensity.scan_modality`) and the range their values mostly lie in (the lowest 1st and
    the highest 99th percentile over the scans, as read: HU for CT). None when no scan was converted."""
    modalities = {name[len(MODALITY_SEEN):]: int(count) for name, count in sorted(counters.items())
                  if name.startswith(MODALITY_SEEN) and count}
    if not modalities:
        return None
    low, high = counters.get(counting.RANGE + "intensity_low"), counters.get(counting.RANGE + "intensity_high")
    return {"modalities": modalities, "intensity_range": [low[0], high[1]] if low and high else None}


def _summary_fields(pairing: label_pairing.Pairing, notes: list[str], config: ct_transforms.CtPreprocessConfig,
                    pseudonymized: bool) -> Callable[[dict], dict]:
    """What summary.json says about this conversion beyond the counts, given the run's counters."""

    def fields(counters: dict) -> dict:
        return {
            "layout": pairing.layout,
            "layout_notes": notes,
            "hidden_files_ignored": pairing.hidden,
            "modality": config.modality,
            "data_modality": data_modality(counters),
            "preprocessing": ct_transforms.preprocessing_record(config),
            "normalization": {name: counters.get(f"normalization_{name}", 0)
                              for name in (intensity.CT_WINDOW, intensity.ZSCORE)},
            "warnings": {name[len("warning_"):]: count for name, count in sorted(counters.items())
                         if name.startswith("warning_")},
            "pseudonymized": pseudonymized,
        }

    return fields


def run(
    input_path: str,
    output: str,
    labels: str | None = None,
    config: ct_transforms.CtPreprocessConfig = ct_transforms.CtPreprocessConfig(),
    pipeline_args: Sequence[str] | None = None,
    num_shards: int = 0,
    compress: bool = False,
    max_failed_fraction: float = 0.1,
    pseudonymize: bool = False,
    pseudonym_key_file: str | None = None,
    follow_links: bool = False,
    log: Callable[[str], None] = print,
) -> dict:
    """Preprocesses every case under `input_path` into `output`; returns the summary.

    Args:
        pseudonymize: replace case ids by keyed hashes; the mapping goes to
            `identifiers.mapping_path(output)`, beside the output, never inside it.
        pseudonym_key_file: the key; default `identifiers.key_path(output)`, created if missing.
        follow_links: read what links that lead outside `input_path` (or `labels`) point to; by default they
            are left alone and named in the summary's `layout_notes` (`volume_discovery`).

    Raises:
        FileNotFoundError: `input_path` does not exist.
        ValueError: nothing under `input_path` looks like a CT volume, or the
            labels cannot be told from the images.
        output_guard.OutputRefused: `output` overlaps the inputs, or holds files fullres did not write.
        conversion.PreprocessingFailed: more than `max_failed_fraction` of the
            cases failed (raised after the output, good records included, is in place).
    """
    dead_letters.check_failed_fraction(max_failed_fraction)
    output_guard.check_conversion_output(output, {"input": input_path, "labels": labels})
    pairing = label_pairing.pair(input_path, labels, config.spacing_tolerance, follow_links)
    if not pairing.cases and not pairing.dead:
        noted = "".join(f"; {note}" for note in pairing.notes)  # e.g. links left alone
        raise ValueError(f"no CT volumes (DICOM, {', '.join(volume_discovery.VOLUME_SUFFIXES)}) found under "
                         f"{input_path}{noted}.")
    key = None
    if pseudonymize:
        if "://" in output and pseudonym_key_file is None:
            raise ValueError(f"--pseudonymize with the remote output {output} needs --pseudonymize-key-file on this "
                             "machine: the key and the pseudonym mapping never go where the output goes.")
        key = identifiers.load_or_create_key(pseudonym_key_file or identifiers.key_path(output))
    # Files discovery set aside or slices it will resample: notes.json, named like dead letters.
    file_notes = [dead_letters.dead_letter(source, "discover", reason, detail)
                  for case in pairing.cases for source, reason, detail in case.image.notes]
    named = identifiers.name_outputs(pairing.cases, pairing.dead + file_notes, pairing.roots, key)
    dead, file_notes = named.dead[:len(pairing.dead)], named.dead[len(pairing.dead):]
    layout_notes = [named.scrubber(note) for note in pairing.notes]
    if pseudonymize:
        mapping = identifiers.mapping_path(output if "://" not in output else pseudonym_key_file)
        identifiers.write_mapping(mapping, {"input": pairing.roots[0], "labels": labels, **named.mapping})
        log(f"pseudonymized {len(named.cases)} case ids; the mapping back is in {mapping} (keep it off shared storage)")
    log(f"fullres preprocess ct: {len(named.cases)} cases ({pairing.layout} layout) to convert, {len(dead)} "
        f"rejected before reading{f', {len(file_notes)} notes' if file_notes else ''}{hidden_files.said(pairing.hidden)}; "
        f"writing {output}")
    for note in layout_notes:
        log(f"  {note}")
    # The class names of DICOM SEG/RTSTRUCT labels, recorded beside the data they numbered.
    label_map = {dataset_files.LABEL_MAP: dataset_files.ct_label_map(config.classes)} if config.classes else None
    convert = PreprocessCaseFn(config, named.scrubber, pairing.roots, pseudonymize)
    summary = conversion.run(
        named.cases, dead, convert, output, pipeline_args=pipeline_args, num_shards=num_shards,
        compress=compress, max_failed_fraction=max_failed_fraction, extra_files=label_map,
        notes=file_notes, summary_fields=_summary_fields(pairing, layout_notes, config, pseudonymize), log=log,
    )
    for warning, count in summary["warnings"].items():
        log(f"warning: {count} case(s) {warning.replace('_', ' ')} (the workers' log names them; see summary.json)")
    if summary.get("label_values"):
        log(f"label values in the data: {', '.join(summary['label_values'])}")
    if summary.get("cropped_voxels"):
        log(crop_warning(summary, config))
    return summary


def crop_warning(summary: dict, config: ct_transforms.CtPreprocessConfig) -> str:
    """The line that says the crop to --shape cut labelled voxels, suggesting only what was not tried already."""
    cut = ", ".join(f"class {c}: {n:,} voxels in {summary['cropped_cases'][c]} cases"
                    for c, n in summary["cropped_voxels"].items())
    remedy = "a larger --shape" if config.crop == "foreground" else "--crop foreground or a larger --shape"
    return (f"the crop to --shape {','.join(map(str, config.shape))} ({config.crop}) cut labelled voxels ({cut}); "
            f"see label/cropped_voxels in each record, and try {remedy}")
