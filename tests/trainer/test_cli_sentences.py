"""The last tracebacks of `fullres train` become sentences: `--output` under a regular file,
`--virtual-devices -1` (and 0, which was taken as unset), `--model dir.py:build` where dir.py is a folder. Each in
a process of its own, as users meet them; each refused before anything is written."""

import os
import subprocess
import sys

import pytest

from common import output_guard, output_lock
from trainer.models import user_model

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(*arguments) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "trainer", "train", "--preset", "smoke", *arguments],
                          capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=300)


def _sentence(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0].removeprefix("fullres: error: ")


@pytest.mark.slow  # three train processes (about 5 s each) that refuse before JAX starts or before training
def test_three_tracebacks_are_sentences(demo_data, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    said = _sentence(_train("--train", demo_data["train"], "--output", str(a_file / "run")))
    assert said == (f"--output {a_file / 'run'} lies under {a_file}, which is a file, not a folder; pass an --output "
                    "whose parent folders are folders (or do not exist yet).")
    assert a_file.read_text() == "mine"
    for count in ("-1", "0"):
        said = _sentence(_train("--train", demo_data["train"], "--output", str(tmp_path / "run"),
                                "--virtual-devices", count))
        assert said == (f"--virtual-devices {count} is not a number of devices; pass 1 or more, or leave it out to "
                        "use the devices present.")
    folder = tmp_path / "dir.py"
    folder.mkdir()
    said = _sentence(_train("--train", demo_data["train"], "--output", str(tmp_path / "run"),
                            "--model", f"{folder}:build"))
    assert said == (f"--model {folder}:build: {folder} is a folder, not a Python file; pass the path of the Python "
                    "file that defines build (FILE.py:FUNCTION).")
    assert sorted(os.listdir(tmp_path)) == ["dir.py", "notes.txt"]


def test_every_output_check_refuses_a_path_under_a_file(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for check in (output_guard.check_run_directory, output_guard.check_conversion_output):
        with pytest.raises(output_guard.OutputRefused, match=r"lies under .*notes.txt, which is a file, not a folder"):
            check(str(a_file / "deeper" / "run"), {})


def test_a_folder_named_like_a_python_file_is_one_sentence(tmp_path):
    folder = tmp_path / "net.py"
    folder.mkdir()
    with pytest.raises(user_model.UserModelError, match=r"net.py is a folder, not a Python file; pass the path"):
        user_model.load_function(str(folder), "build")
    with pytest.raises(user_model.UserModelError, match=r"net.py is a folder, not a Python file; pass the path"):
        user_model.measure(user_model.UserModelConfig(str(folder), "build"))


def test_the_pipeline_s_temporary_copy_of_a_network_is_named_as_the_parameter_it_came_from():
    """The train step writes `--param model_code` to /tmp/fullres-network-*/network.py; its sentences named that."""
    from components import runtime

    source = runtime.model_source("def build(num_classes, in_channels):\n    return None\n", "make")
    file, function = source.rsplit(":", 1)
    with pytest.raises(user_model.UserModelError) as refused:
        user_model.load_function(file, function)
    assert str(refused.value) == ("--param model_code:make: --param model_code defines no function make (it defines "
                                  "build); name the function that returns the network, e.g. --param model_code:build.")
    assert user_model.TEMPORARY_PREFIX not in str(refused.value)


def test_the_output_lock_refuses_a_path_under_a_file(tmp_path):
    # fullres predict (and every command) takes OUTPUT.fullres-lock before its output checks run: the lock's folder
    # under a file was a FileExistsError traceback (`predict --output notes.txt/pred`).
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(output_guard.OutputRefused, match=r"--output .*notes.txt/pred lies under .*notes.txt, which is "
                                                          r"a file, not a folder"):
        with output_lock.lock(str(a_file / "pred")):
            pass
    assert a_file.read_text() == "mine" and os.listdir(tmp_path) == ["notes.txt"]
