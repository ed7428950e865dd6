"""`fullres train --local-processes N` prints a refusal once, from process 0: every process refuses the
same data in the same sentence, and each was printed, once a process. A refusal of another process's own is still
printed, and the launcher does not offer to resume a run that was refused."""

import os
import subprocess
import sys

import pytest

from trainer.parallel import local_launcher

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_the_other_processes_refusals_are_said_only_where_process_0_did_not_say_them():
    said = []
    local_launcher._said_once([["fullres: error: no data."], ["fullres: error: no data."],
                               ["fullres: error: no data.", "fullres: error: port taken."]], said.append)
    assert said == ["[p2] fullres: error: port taken."]


@pytest.mark.slow  # two training processes that refuse their data (about 20 s on the shared machine)
def test_a_refusal_of_every_process_is_printed_once_from_process_0(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    missing = tmp_path / "nonexistent"
    result = subprocess.run([sys.executable, "-m", "trainer", "train", "--local-processes", "2", "--train",
                             str(missing), "--output", str(tmp_path / "run")], capture_output=True, text=True,
                            cwd=REPOSITORY, env=environment, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stdout[-3000:]
    refusals = [line for line in result.stdout.splitlines() if "fullres: error: " in line]
    assert refusals == [f"[p0] fullres: error: no TFRecord files match --train '{missing}'; pass a data set folder "
                        "(the --output of fullres preprocess) or a pattern of its records, e.g. 'data/ct/data-*'."]
    assert "resume" not in result.stdout
    assert sorted(os.listdir(tmp_path)) == []
