"""Runs a pipeline on this machine with `kfp.local`'s SubprocessRunner, and finds what it produced.

Every component runs as its own process in this Python environment (the
fullres environment stands in for the container image); artifacts land under
`pipeline_root/<pipeline>-<timestamp>/<task>/<output>`.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

from pipelines import definitions


class PipelineRunFailed(RuntimeError):
    """A local pipeline run ended in failure; the message names the run directory to look into."""


def run_local(name: str, arguments: dict, pipeline_root: str, log: Callable[[str], None] = print) -> dict:
    """Runs pipeline `name` with `arguments` locally; returns `{"run_dir", "outputs": {task: {output: path}}}`.

    Raises:
        PipelineRunFailed: a step failed (its log is above, in the runner's output).
    """
    from kfp import local

    if name not in definitions.PIPELINES:
        raise ValueError(f"pipeline {name!r} is not known; use one of {', '.join(definitions.PIPELINES)}.")
    pipeline_root = os.path.abspath(pipeline_root)
    os.makedirs(pipeline_root, exist_ok=True)
    before = set(os.listdir(pipeline_root))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root, raise_on_error=True)
    log(f"running pipeline {name} locally (kfp.local SubprocessRunner); artifacts under {pipeline_root}")
    try:
        definitions.PIPELINES[name]()(**arguments)
    except RuntimeError as error:
        raise PipelineRunFailed(f"pipeline {name} failed ({error}); see the step logs above and {pipeline_root}.") from None
    runs = sorted(set(os.listdir(pipeline_root)) - before)
    if not runs:
        raise PipelineRunFailed(f"pipeline {name} ran but left no run directory under {pipeline_root}.")
    run_dir = os.path.join(pipeline_root, runs[-1])
    return {"run_dir": run_dir, "outputs": task_outputs(run_dir)}


def task_outputs(run_dir: str) -> dict[str, dict[str, str]]:
    """`{task: {output name: path}}` of a local run (every file or directory a task wrote beside its executor output)."""
    outputs: dict[str, dict[str, str]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*", "*"))):
        task, output = path.split(os.sep)[-2:]
        if output != "executor_output.json":
            outputs.setdefault(task, {})[output] = path
    return outputs


def find_output(outputs: dict, task_prefix: str, output: str) -> str | None:
    """The path of `output` from the task whose name starts with `task_prefix` (branches add suffixes)."""
    for task in sorted(outputs):
        if task.startswith(task_prefix) and output in outputs[task]:
            return outputs[task][output]
    return None
