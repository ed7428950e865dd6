"""A local pipeline run shows the steps and their progress lines; everything else goes to the run's log file.

The transcript below is kfp 2.17's SubprocessRunner output from a real
`fullres demo` whose train step failed (shortened: fewer JSON lines and
traceback frames), written in the pieces kfp writes it in.
"""

import io
import os
import re
import sys
import warnings

import pytest

from pipelines import step_output

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CYAN, RED, GREEN, RESET = "\x1b[96m", "\x1b[91m", "\x1b[92m", "\x1b[0m"
INDENT = "    "  # kfp indents each step line, an empty one too
TRANSCRIPT = f"""\
18:02:44.482 - INFO - Running pipeline: \x1b[95m'ct-segmentation'{RESET}
--------------------------------------------------------------------------------
18:02:44.515 - INFO - Executing task {CYAN}'preprocess-ct'{RESET}
18:02:44.515 - INFO - Streamed logs:

    [KFP Executor 2026-11-22 18:02:44,650 INFO]: Looking for component `preprocess_ct` in --component_module_path `/tmp/x.py`
    [KFP Executor 2026-11-22 18:02:44,651 INFO]: Got executor_input:
    {{
        "inputs": {{
            "parameterValues": {{
                "spacing": "1.7,1.7,2.25"
            }}
        }}
    }}
    fullres preprocess ct: 2 cases (same_names layout) to convert, 0 rejected before reading; writing /r/preprocess-ct/dataset
    [KFP Executor 2026-11-22 18:02:51,110 WARNING]: Worker: severity: WARN timestamp {{   seconds: 1795370204 }} message: "No semi_persistent_directory found"
      1 records written, 0 dead letters so far (2 inputs)
    wrote 2 records in 2 shards (0.3 MiB), 0 dead letters
    [KFP Executor 2026-11-22 18:02:53,265 INFO]: Wrote executor output file to /r/preprocess-ct/executor_output.json.
{INDENT}

18:02:54.101 - INFO - Task {CYAN}'preprocess-ct'{RESET} finished with status {GREEN}SUCCESS{RESET}
18:02:54.102 - INFO - Task {CYAN}'preprocess-ct'{RESET} outputs:
    dataset: Dataset( name='dataset',
                      uri='/r/preprocess-ct/dataset',
                      metadata={{'records': 2.0, 'failed': 0.0}} )
--------------------------------------------------------------------------------
18:02:54.110 - INFO - Executing task {CYAN}'train'{RESET}
18:02:54.110 - INFO - Streamed logs:

    [KFP Executor 2026-11-22 18:02:54,250 INFO]: Got executor_input:
    {{
        "outputs": {{
            "outputFile": "/r/train/executor_output.json"
        }}
    }}
    Traceback (most recent call last):
      File "/work/main/trainer/train.py", line 172, in _train
        partitioning.validate(
    trainer.parallel.partitioning.PartitionError: input_partition_dims [1, 3, 1, 1, 1] asks for 3 cores per replica
{INDENT}

18:03:45.177 - ERROR - Task {CYAN}'train'{RESET} finished with status {RED}FAILURE{RESET}
--------------------------------------------------------------------------------
18:03:45.180 - ERROR - Pipeline {CYAN}'ct-segmentation'{RESET} finished with status {RED}FAILURE{RESET}
"""

SHOWN = """\
step preprocess-ct
    fullres preprocess ct: 2 cases (same_names layout) to convert, 0 rejected before reading; writing /r/preprocess-ct/dataset
      1 records written, 0 dead letters so far (2 inputs)
    wrote 2 records in 2 shards (0.3 MiB), 0 dead letters
step preprocess-ct: SUCCESS
step train
step train: FAILURE
pipeline ct-segmentation: FAILURE
"""


def _write_in_pieces(stream, text):
    """As kfp writes: indentation and line separately (`print(' ' * 4, end='')`), records whole."""
    for line in text.splitlines(keepends=True):
        if line.startswith("    "):
            stream.write("    ")
            stream.write(line[4:])
        else:
            stream.write(line)


def test_the_terminal_shows_steps_progress_and_errors_and_the_log_keeps_every_line():
    """A failing step's traceback stays in the log; its exception's sentence is kept for the run's one error."""
    terminal, log = io.StringIO(), io.StringIO()
    stream = step_output.StepOutput(terminal, log)
    _write_in_pieces(stream, TRANSCRIPT)
    assert terminal.getvalue() == SHOWN
    assert log.getvalue() == TRANSCRIPT
    assert stream.failures == [("train", "input_partition_dims [1, 3, 1, 1, 1] asks for 3 cores per replica")]


def test_a_chained_traceback_gives_the_last_exceptions_sentence():
    """`raise ... from error` and an error while handling one: the sentence is the last exception's, whose message
    may go on over several lines (those stay in the log)."""
    lines = ["18:03:44.110 - INFO - Executing task 'preprocess-ct'", "18:03:44.110 - INFO - Streamed logs:",
             "    Traceback (most recent call last):", '      File "a.py", line 1, in f', "        g()",
             "        ^^^", "    KeyError: 'x'", "    ", "    During handling of the above exception, another "
             "exception occurred:", "    ", "    Traceback (most recent call last):", '      File "b.py", line 2',
             "    preprocessing.beam.conversion.PreprocessingFailed: 3 of 3 inputs failed (100%).",
             "    see dead_letter.jsonl", "18:03:45.177 - ERROR - Task 'preprocess-ct' finished with status FAILURE"]
    terminal, log = io.StringIO(), io.StringIO()
    stream = step_output.StepOutput(terminal, log)
    stream.write("\n".join(lines) + "\n")
    assert terminal.getvalue() == "step preprocess-ct\nstep preprocess-ct: FAILURE\n"
    assert stream.failures == [("preprocess-ct", "3 of 3 inputs failed (100%).")]


def test_verbose_shows_every_line():
    terminal, log = io.StringIO(), io.StringIO()
    stream = step_output.StepOutput(terminal, log, verbose=True)
    _write_in_pieces(stream, TRANSCRIPT)
    assert terminal.getvalue() == log.getvalue() == TRANSCRIPT  # the traceback too
    assert stream.failures == [("train", "input_partition_dims [1, 3, 1, 1, 1] asks for 3 cores per replica")]


def test_captured_routes_stdout_and_warnings_into_the_log(tmp_path, capsys):
    log_path = tmp_path / "run.log"
    with step_output.captured(str(log_path)):
        print("18:02:44.515 - INFO - Executing task 'train'")
        print("18:02:44.515 - INFO - Streamed logs:")
        print("    step 10/10  loss 2.0614")
        warnings.warn("settings ['display_name'] have no effect in the current local runner", UserWarning, stacklevel=1)
    shown = capsys.readouterr()
    assert shown.out == "step train\n    step 10/10  loss 2.0614\n" and shown.err == ""
    logged = log_path.read_text()
    assert "Executing task 'train'" in logged and "have no effect in the current local runner" in logged
    assert sys.stdout is not None and not isinstance(sys.stdout, step_output.StepOutput)


@pytest.mark.slow  # one real pipeline run whose first step fails (about 30 s)
def test_a_failing_step_ends_the_run_with_its_commands_sentence_and_no_traceback(tmp_path):
    """Every scan of both splits is unreadable: the first preprocess step fails as `fullres preprocess ct` would,
    and the run says that sentence, naming the step and the log that keeps the traceback."""
    import subprocess

    scans = tmp_path / "scans"
    scans.mkdir()
    (scans / "case0.nii.gz").write_bytes(b"not a volume")
    root = tmp_path / "root"
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "FULLRES_VERBOSE")}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--pipeline-root",
                             str(root), "--param", f"train_input_uri={scans}", "--param", f"eval_input_uri={scans}"],
                            capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=600)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    (run_dir,) = [path for path in root.iterdir() if path.is_dir()]
    (log,) = root.glob("ct-segmentation-*.log")
    # Both splits read the same scans, and kfp.local may run either preprocess step first: the run stops at the first
    # (once, with both step folders there, the sentence named preprocess-ct-2).
    step = re.search(r"failed in step (\S+):", error).group(1)
    assert step in ("preprocess-ct", "preprocess-ct-2"), error
    dead_letters = run_dir / step / "dataset" / "dead_letter.jsonl"
    assert dead_letters.is_file(), error
    assert error == (f"fullres: error: pipeline ct-segmentation failed in step {step}: 1 of "
                     f"1 inputs failed (100%), more than --max-failed-fraction 0.1; see {dead_letters}; its output, "
                     f"the traceback included, is in {log} (and the artifacts in {root}).")
    assert "Traceback (most recent call last):" in log.read_text()
