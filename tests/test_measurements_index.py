"""docs/measurements_index.py: docs/measurements.md is the results' index, written from the results themselves.

The committed page equals a fresh generation (so a figure in it cannot drift from its JSON); every result file has a
row; a file without an entry, an entry without its file, or a result without a date stops the generator with one
sentence naming what to add; a changed figure in a JSON changes the page.
"""

import json
import os
import shutil

import pytest

from tests import files

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPOSITORY, "docs")
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")


def load(name: str):
    return files.load_script("docs", f"{name}.py", with_its_folder=True)  # the index imports its catalogue


@pytest.fixture(scope="module")
def index():
    return load("measurements_index")


@pytest.fixture
def results(tmp_path):
    folder = tmp_path / "results"
    shutil.copytree(RESULTS, folder)
    return folder


def test_the_committed_page_is_a_fresh_generation(index):
    with open(os.path.join(REPOSITORY, "docs", "measurements.md"), encoding="utf-8") as file:
        committed = file.read()
    assert committed == index.render(), (
        "docs/measurements.md differs from benchmarks/results/: run "
        "`python3 -m uv run python docs/measurements_index.py` and commit it")


def test_every_result_file_has_a_row_with_its_date_command_and_page(index):
    page = index.render()
    for name in os.listdir(RESULTS):
        if os.path.splitext(name)[1] in index.NOT_INDEXED:
            continue
        row = next(line for line in page.splitlines() if f"[{name}](../benchmarks/results/{name})" in line)
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 6 and cells[0][:4] == "2026" and cells[4] and cells[5].startswith("["), row


def test_every_figure_measured_by_hand_has_its_date_command_and_page():
    with open(os.path.join(RESULTS, "by_hand.json"), encoding="utf-8") as file:
        by_hand = json.load(file)["measurements"]
    for entry in by_hand:
        assert entry["date"][:4] == "2026" and entry["command"] and entry["figures"], entry
        assert os.path.exists(os.path.join(REPOSITORY, entry["page"])), entry["page"]


def test_a_changed_figure_changes_the_page(index, results):
    path = results / "input_rate.json"
    data = json.loads(path.read_text())
    before = index.render(str(results))
    assert "records 164.9" in before
    data["results"]["256"]["whole, records, 2 cores"]["examples_per_second"] = 99.5
    path.write_text(json.dumps(data))
    assert "records 99.5" in index.render(str(results))


def test_a_result_without_an_entry_is_named(index, results):
    (results / "new_benchmark.json").write_text('{"date": "2026-12-07"}')
    with pytest.raises(SystemExit) as stopped:
        index.render(str(results))
    assert "new_benchmark.json" in str(stopped.value) and "measurements_catalogue.py" in str(stopped.value)


def test_an_entry_without_its_file_is_named(index, results):
    (results / "zoo.json").unlink()
    with pytest.raises(SystemExit) as stopped:
        index.render(str(results))
    assert "zoo.json" in str(stopped.value) and "remove its entry" in str(stopped.value)


def test_a_result_without_a_date_says_to_add_one(index, results):
    path = results / "int16_records.json"
    data = json.loads(path.read_text())
    del data["date"]
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as stopped:
        index.render(str(results))
    assert "int16_records.json has no date" in str(stopped.value)


def test_check_exits_1_when_the_page_differs(index, tmp_path, monkeypatch, capsys):
    page = tmp_path / "measurements.md"
    page.write_text(index.render() + "an edit by hand\n")
    monkeypatch.setattr(index, "PAGE", str(page))
    assert index.main(["--check"]) == 1
    assert "differs" in capsys.readouterr().err
    assert index.main([]) == 0 and index.main(["--check"]) == 0
