"""benchmarks/README.md is the door to the benchmarks: every script is in a folder by purpose and listed there."""

import glob
import os
import re

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPOSITORY, "benchmarks")
FOLDERS = {"device", "peer", "learning", "input", "partitioning"}


def _readme() -> str:
    with open(os.path.join(BENCHMARKS, "README.md"), encoding="utf-8") as file:
        return file.read()


def test_every_script_sits_in_a_folder_by_purpose():
    loose = [os.path.basename(path) for path in glob.glob(os.path.join(BENCHMARKS, "*.py"))]
    assert not loose, f"scripts at benchmarks/'s top, put each in one of {sorted(FOLDERS)}: {loose}"
    folders = {os.path.basename(os.path.dirname(path)) for path in glob.glob(os.path.join(BENCHMARKS, "*", "*.py"))}
    assert folders == FOLDERS


def test_the_readme_lists_every_script_and_names_only_scripts_that_exist():
    readme = _readme()
    scripts = {os.path.relpath(path, BENCHMARKS) for path in glob.glob(os.path.join(BENCHMARKS, "*", "*.py"))}
    # A row names its folder once: `device/device_check.py`, then its helpers by file name alone.
    named = set(re.findall(r"`(\w+/\w+\.py)", readme))
    for row in re.findall(r"^\| `(\w+)/([^|]*)\|", readme, flags=re.M):
        named |= {f"{row[0]}/{name}" for name in re.findall(r"(\w+\.py)", row[1])}
    assert scripts - named == set(), f"not in benchmarks/README.md: {sorted(scripts - named)}"
    assert named - scripts == set(), f"benchmarks/README.md names scripts that do not exist: {sorted(named - scripts)}"
    for result in re.findall(r"results/([\w.*-]+\.(?:jsonl|json))\b", readme):
        assert glob.glob(os.path.join(BENCHMARKS, "results", result.replace("...", "*"))), result
