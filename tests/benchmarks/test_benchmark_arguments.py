"""peer_bench.py's and device_check.py's command lines, checked before any row runs: each refusal is one sentence
(exit 2, no traceback), no row starts, and the folders are as they were. On a lent GPU, a bad argument found after
the first rows costs minutes of its time, and a result written nowhere costs all of them."""

import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER_BENCH = os.path.join(REPOSITORY, "benchmarks", "peer", "peer_bench.py")
DEVICE_CHECK = os.path.join(REPOSITORY, "benchmarks", "device", "device_check.py")


def _refused(script: str, arguments: list[str], tmp_path, environment=None) -> str:
    """The one sentence `script ARGUMENTS` is refused with; asserts nothing ran and nothing changed in tmp_path."""
    before = {path: open(path, "rb").read() for path in _files(tmp_path)}
    done = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True, timeout=600,
                          cwd=REPOSITORY, env=environment)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout == ""  # no row, not even the table's header
    assert {path: open(path, "rb").read() for path in _files(tmp_path)} == before
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in before if os.path.dirname(p) == str(
        tmp_path)) + (["results"] if (tmp_path / "results").is_dir() else [])
    return done.stderr.strip().splitlines()[-1].partition(": error: ")[2]


def _files(folder) -> list[str]:
    return sorted(os.path.join(top, name) for top, _, names in os.walk(folder) for name in names)


@pytest.fixture
def places(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    return tmp_path / "results", tmp_path / "notes.txt"


@pytest.mark.parametrize("arguments, said", [
    (["--limit", "nan"], "--limit nan is not a number of seconds above 0; give the seconds for every row together, "
                         "e.g. 600"),
    (["--limit", "0"], "--limit 0 is not a number of seconds above 0; give the seconds for every row together, "
                       "e.g. 600"),
    (["--json", "{folder}"], "--json {folder} is a folder; name a file in it, e.g. {folder}/peer_bench.json"),
    (["--json", "{notes}/peer_bench.json"], "--json {notes}/peer_bench.json lies under {notes}, which is a file, not "
                                            "a folder; name a file in a folder"),
    (["--json", "/sys/peer_bench.json"], "--json /sys/peer_bench.json cannot be written (Permission denied); name a "
                                         "file in a folder you can write to"),
])
def test_peer_bench_refuses_a_limit_or_a_json_it_cannot_use_before_any_row(tmp_path, places, arguments, said):
    """`--limit nan` was a traceback and `--limit 0` silently 30 minutes; `--json` a folder a traceback, and one
    under a file a traceback after the first row."""
    folder, notes = places
    arguments = [a.format(folder=folder, notes=notes) for a in arguments]
    shown = _refused(PEER_BENCH, ["--tiny", "--networks", "nnunet_plain", "--json", str(folder / "peer.json"),
                                  *arguments], tmp_path)
    assert shown == said.format(folder=folder, notes=notes)


@pytest.mark.slow  # the check's process imports fullres and resolves the candidates' settings (5-20 s here)
def test_peer_bench_refuses_a_candidate_fullres_refuses_before_any_row(tmp_path, places):
    """A bad `--candidate` was found after the baseline rows, listed as rows that did not run, and the command
    exited 0."""
    folder, _ = places
    shown = _refused(PEER_BENCH, ["--tiny", "--networks", "nnunet_plain", "--json", str(folder / "peer.json"),
                                  "--candidate", "kernels.conv_transpose=subpixel", "--candidate",
                                  "kernels.norm=bogus"], tmp_path)
    assert shown == ("--candidate 'kernels.norm=bogus': kernels.norm 'bogus' is not known; use one of xla, fused "
                     "(--set kernels.norm=...).")


@pytest.mark.parametrize("arguments, said", [
    (["--tiny", "--plan", "{notes}"], "--plan {notes} is not JSON (line 1: Expecting value); name the JSON "
                                      "`benchmarks/device/device_plan.py --json` wrote for the target"),
    (["--tiny", "--plan", "{folder}/none.json"], "--plan {folder}/none.json cannot be read (No such file or "
                                                 "directory); name the JSON `benchmarks/device/device_plan.py --json` "
                                                 "wrote for the target"),
    (["--target", "h100x1"], "this machine has no GPU (nvidia-smi names none), and device_check measures one; run it "
                             "on the device machine, or pass --tiny for the same parts on this CPU at tiny sizes"),
])
def test_device_check_refuses_a_plan_it_cannot_read_or_a_gpu_that_is_not_there(tmp_path, places, arguments, said):
    """`--plan` naming a text file was a JSONDecodeError; `--target h100x1` on a machine without a GPU ran the H100's
    rows on the CPU (an 83.5 GB allocation) without a word."""
    folder, notes = places
    environment = dict(os.environ, PATH=os.path.dirname(sys.executable))  # no nvidia-smi: a machine without a GPU
    shown = _refused(DEVICE_CHECK, ["--json", str(folder / "check.json"),
                                    *(a.format(folder=folder, notes=notes) for a in arguments)], tmp_path, environment)
    assert shown == said.format(folder=folder, notes=notes)
