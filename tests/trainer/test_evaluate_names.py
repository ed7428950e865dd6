"""The evaluation report names held-out cases by their case ids; with `pseudonymize`, by pseudonyms only.

Data preprocessed without `--pseudonymize` carry folder and file names as case ids (often patient names, from PACS
exports); an evaluation asked to pseudonymize shows such an id as "held-out case N" instead.
"""

import pytest

from common import identifiers


@pytest.mark.slow  # evaluates the session's segmentation run twice
def test_a_pseudonymized_report_shows_no_case_id_that_is_not_a_pseudonym(segmentation_run, demo_data, tmp_path):
    from trainer import evaluate

    config, _, _ = segmentation_run
    pages = {}
    for pseudonymize in (False, True):
        path = str(tmp_path / f"report-{pseudonymize}.html")
        evaluate.evaluate_trained(config.output_dir, demo_data["eval"], report_path=path, report_examples=2,
                                  pseudonymize=pseudonymize, log=lambda line: None)
        with open(path) as file:
            pages[pseudonymize] = file.read()
    assert "<h3>demo-eval-0000</h3>" in pages[False]  # the records' ids, as preprocessed
    assert "demo-eval-" not in pages[True]
    assert "<h3>held-out case 1</h3>" in pages[True] and "<h3>held-out case 2</h3>" in pages[True]


def test_pseudonyms_are_told_from_names():
    assert identifiers.is_pseudonym(identifiers.pseudonym(b"k" * 32, "DOE^JANE"))
    assert identifiers.is_pseudonym(identifiers.pseudonym(b"k" * 32, "scans/readme.dcm", "file"))
    assert not identifiers.is_pseudonym("DOE_JANE_PID-7731") and not identifiers.is_pseudonym("case-DOE")
