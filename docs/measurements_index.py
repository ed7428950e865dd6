"""Write docs/measurements.md: one row for every result in benchmarks/results/, read from the result itself.

    python3 -m uv run python docs/measurements_index.py            # write docs/measurements.md
    python3 -m uv run python docs/measurements_index.py --check    # exit 1 if the page differs

Each row says what the file measures, its date, its headline figures (read from the file, so the page cannot
drift from its data), the command that wrote it and the page that explains it. The date is the file's own
`date` (or `when`) field; files shaped with no place for one carry it in their entry of
`measurements_catalogue.CATALOGUE`. A result file without an entry, or an entry without its file, stops the script
with the name of what to add.
`tests/test_measurements_index.py` fails when the committed page differs from a fresh one.
"""

import argparse
import json
import os
import sys

import measurements_catalogue

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")
PAGE = os.path.join(REPOSITORY, "docs", "measurements.md")
NOT_INDEXED = {".log", ".png"}  # a run's log and a plot drawn from a JSON that has its own row


def _load(path):
    with open(path, encoding="utf-8") as file:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in file if line.strip()]
        return json.load(file)


def _date(name, data, entry):
    if entry.date:
        return entry.date
    found = data.get("date") or data.get("when") if isinstance(data, dict) else None
    if not found:
        raise SystemExit(f"benchmarks/results/{name} has no date: add a \"date\" field (YYYY-MM-DD) to it, "
                         f"the day it was measured")
    return found[:10]


def _link(page):
    return f"[{page.split('#')[0].split('/')[-1]}]({page})"


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def render(results=RESULTS):
    """The page: a header and one row per result file, newest first."""
    names = sorted(name for name in os.listdir(results) if os.path.splitext(name)[1] not in NOT_INDEXED)
    missing = [name for name in names if name not in measurements_catalogue.CATALOGUE]
    if missing:
        raise SystemExit(f"benchmarks/results/ holds {', '.join(missing)} without an entry in "
                         f"docs/measurements_catalogue.py's CATALOGUE: add one (what, command, page, headline)")
    gone = [name for name in measurements_catalogue.CATALOGUE if name not in names]
    if gone:
        raise SystemExit(f"docs/measurements_catalogue.py lists {', '.join(gone)}, which benchmarks/results/ "
                         f"does not hold: remove its entry")
    rows = []
    for name in names:
        entry, data = measurements_catalogue.CATALOGUE[name], _load(os.path.join(results, name))
        rows.append((_date(name, data, entry), name, entry.what, entry.headline(data), entry.command, entry.page))
    rows.sort(key=lambda row: (row[0], row[1]), reverse=True)
    lines = [
        "# Measurements",
        "",
        "Every result kept in `benchmarks/results/`, newest first: what it measures, when, its headline figures",
        "(read from the file), the command that wrote it and the page that explains it. \"Here\" is a 2-core CPU",
        "machine without an accelerator unless the page says otherwise. The benchmarks and how long each takes:",
        "[benchmarks/README.md](../benchmarks/README.md). This page is written from the files by",
        "`python3 -m uv run python docs/measurements_index.py`, and a test fails when it differs from them.",
        "",
        "| date | file | what | headline | command | page |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for date, name, what, headline, command, page in rows:
        lines.append(f"| {date} | [{name}](../benchmarks/results/{name}) | {_cell(what)} | {_cell(headline)} "
                     f"| {_cell(command)} | {_link(page)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/measurements.md differs")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        with open(PAGE, encoding="utf-8") as file:
            if file.read() != page:
                print("docs/measurements.md differs from benchmarks/results/: run "
                      "`python3 -m uv run python docs/measurements_index.py` and commit it", file=sys.stderr)
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as file:
        file.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
