"""The what-to-rent grid in docs/what-to-rent.md and the README's table are the ones `rent_grid.py` renders from
benchmarks/results/rent_grid.json: a row computed again, or a figure edited by hand, cannot leave them apart."""

import copy
import json
import os

from tests import files

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rent_grid():
    return files.load_script("benchmarks", "partitioning", "rent_grid.py")


def _read(*path):
    with open(os.path.join(REPOSITORY, *path), encoding="utf-8") as file:
        return file.read()


def test_the_docs_grid_and_the_readme_table_are_rendered_from_the_json():
    grid = _rent_grid()
    result = json.loads(_read("benchmarks", "results", "rent_grid.json"))
    rendered = "\n".join(grid.grid(result))
    assert rendered in _read("docs", "what-to-rent.md"), (
        "docs/what-to-rent.md's grid differs from the JSON: run `python3 benchmarks/partitioning/rent_grid.py "
        "--write-docs`")
    assert "\n".join(grid.readme_table(result)) in _read("README.md")
    # Every row of the grid has its cell, computed or said not computed, and a row over the bound says so.
    assert rendered.count("| ") >= len(grid.ROWS)
    names = {row["name"] for row in result["rows"]}
    assert rendered.count("not computed") == len([row for row in grid.ROWS if row["name"] not in names])


def test_a_row_over_the_bound_or_not_finished_says_so_beside_it():
    grid = _rent_grid()
    result = json.loads(_read("benchmarks", "results", "rent_grid.json"))
    row = copy.deepcopy(next(r for r in result["rows"] if r["kind"] == "plan"))
    late = {**row, "seconds": grid.ROW_SECONDS + 60.0}
    assert grid._cell(late).endswith(f"({late['seconds'] / 60:.1f} min, over the 15-minute bound)")
    unfinished = {**row, "result": {"not_finished": "did not finish within 15 minutes on this machine"}}
    assert grid._cell(unfinished) == "not finished in 15 min here"
    assert "not computed" in "\n".join(grid.grid({"rows": []}))
    assert grid.grid({"rows": []})[-1] == "Nothing computed yet."


def test_write_docs_replaces_the_grid_and_the_table_and_nothing_else(tmp_path, monkeypatch):
    grid = _rent_grid()
    (tmp_path / "docs").mkdir()
    for name in ("docs/what-to-rent.md", "README.md"):
        (tmp_path / name).write_text(_read(name), encoding="utf-8")
    monkeypatch.setattr(grid, "ROOT", str(tmp_path))
    result = json.loads(_read("benchmarks", "results", "rent_grid.json"))
    assert grid.write_docs(result) == []  # already written
    fewer = {**result, "rows": [row for row in result["rows"] if row["kind"] != "smallest"]}
    assert grid.write_docs(fewer) == ["docs/what-to-rent.md", "README.md"]
    page, readme = (tmp_path / "docs/what-to-rent.md").read_text(), (tmp_path / "README.md").read_text()
    assert "\n".join(grid.grid(fewer)) in page and "\n".join(grid.readme_table(fewer)) in readme
    assert "v5p:2x2x2" not in page and "v5p:2x2x2" not in readme
    before = _read("docs/what-to-rent.md")
    assert page.split("| goal | answer |")[0] == before.split("| goal | answer |")[0]
    assert page.split("not device measurements.\n", 1)[1] == before.split("not device measurements.\n", 1)[1]


def test_a_row_cut_at_the_bound_keeps_the_largest_size_its_log_found_to_fit():
    grid = _rent_grid()
    log = ("searching 31 sizes (128 to 4096 voxels along depth, height, width)\n"
           "[v5e:4x4 1/6] compiling 1,1,4,4,1 ...\n"
           "[v5e:4x4] 256x256x256: fits (753 s)\n"
           "[v5e:4x4] 128x128x128: fits (from the plan cache)\n"
           "[v5e:4x4] 512x512x512: does not fit, needs 30.1 GiB of 15.75 GiB (40 s)\n").encode()
    assert grid.reached(log) == {"fitted": [256, 256, 256], "not_fitted": [512, 512, 512]}
    assert grid.reached(None) == {"fitted": None, "not_fitted": None}
    result = json.loads(_read("benchmarks", "results", "rent_grid.json"))
    row = copy.deepcopy(next(r for r in result["rows"] if r["kind"] == "largest"))
    cut = {**row, "result": {"not_finished": "did not finish within 15 minutes on this machine", **grid.reached(log)}}
    assert grid._cell(cut) == "≥256³ fits; not finished in 15 min here"
    nothing = {**row, "result": {"not_finished": "did not finish within 15 minutes on this machine",
                                 **grid.reached(b"searching 31 sizes\n")}}
    assert grid._cell(nothing) == "not finished in 15 min here"
