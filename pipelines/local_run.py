"""Runs a pipeline on this machine with `kfp.local`, and finds what it produced.

Two runners: the SubprocessRunner (default) runs every component as its own
process in this Python environment; the DockerRunner runs every component in
the fullres container image, as Vertex AI does. Artifacts land under
`pipeline_root/<pipeline>-<timestamp>/<task>/<output>`; the DockerRunner
mounts the pipeline root into each container at the same path, and every input
path among the arguments read-only, also at the same path.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable

from pipelines import definitions, parameter_checks, step_output


class PipelineRunFailed(RuntimeError):
    """A local pipeline run ended in failure; the message names the run directory to look into."""


RUNNERS = ("subprocess", "docker")


def run_local(name: str, arguments: dict, pipeline_root: str, log: Callable[[str], None] = print,
              runner: str = "subprocess", image: str | None = None, verbose: bool | None = None,
              checked: bool = False) -> dict:
    """Runs pipeline `name` with `arguments` locally; returns `{"run_dir", "outputs": {task: {output: path}}}`.

    Args:
        name: a pipeline of `definitions.PIPELINES`.
        arguments: its parameters.
        pipeline_root: where the run's artifacts go.
        log: progress lines.
        runner: "subprocess" (this environment) or "docker" (every step in `image`).
        image: the container image (docker only); the pipeline is bound to it as `fullres pipeline compile
            --image` binds the compiled YAML.
        verbose: show every line the runner prints (executor inputs, artifact listings, warnings); by default
            (None: unless FULLRES_VERBOSE=1) the terminal shows the steps and their progress lines, and every
            line goes to `pipeline_root/<name>-<time>.log`.
        checked: the caller has passed `arguments` through `parameter_checks.check` already (otherwise it is done
            here, before anything starts).

    Raises:
        PipelineRunFailed: a step failed; the sentence its exception says, and where its traceback is.
        ValueError: an unknown pipeline or runner, a docker run without an image, or a parameter a step would
            refuse (`parameter_checks`).
        pipelines.image.ImageError: no Docker engine, or the image is not there.
    """
    from kfp import local

    if name not in definitions.PIPELINES:
        raise ValueError(f"pipeline {name!r} is not known; use one of {', '.join(definitions.PIPELINES)}.")
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not known; use one of {', '.join(RUNNERS)}.")
    if runner == "docker" and not image:
        raise ValueError("the docker runner needs --image, e.g. fullres:cpu (build it with `fullres image build`).")
    if not checked:
        parameter_checks.check(name, arguments, parameter_checks.Where(log=log))
    pipeline_root = os.path.abspath(pipeline_root)
    os.makedirs(pipeline_root, exist_ok=True)
    before = set(os.listdir(pipeline_root))
    if runner == "docker":
        arguments = _absolute_paths(arguments)
        kfp_runner = _docker_runner(image, arguments, pipeline_root)
        pipeline = definitions.PIPELINES[name](image)
    else:
        kfp_runner = local.SubprocessRunner(use_venv=False)
        pipeline = definitions.PIPELINES[name]()
    local.init(runner=kfp_runner, pipeline_root=pipeline_root, raise_on_error=True)
    where = f"image {image}" if runner == "docker" else "this environment"
    if verbose is None:
        verbose = os.environ.get("FULLRES_VERBOSE") == "1"
    log_path = os.path.join(pipeline_root, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log")
    log(f"running pipeline {name} locally (kfp.local {type(kfp_runner).__name__}, {where}); artifacts under "
        f"{pipeline_root}, every line of its output in {log_path}")
    try:
        with step_output.captured(log_path, verbose) as output:
            pipeline(**arguments)
    except RuntimeError as error:
        if output.failures:  # the sentence the failing step's command would print; its traceback is in the log
            step, sentence = output.failures[-1]
            raise PipelineRunFailed(f"pipeline {name} failed in step {step}: {sentence.rstrip('.')}; its output, the "
                                    f"traceback included, is in {log_path} (and the artifacts in {pipeline_root})."
                                    ) from None
        raise PipelineRunFailed(f"pipeline {name} failed ({error}); the step's output is in {log_path} "
                                f"(and the artifacts in {pipeline_root}).") from None
    runs = sorted(entry for entry in set(os.listdir(pipeline_root)) - before
                  if os.path.isdir(os.path.join(pipeline_root, entry)))
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


def _absolute_paths(arguments: dict) -> dict:
    """The arguments with every local path made absolute (a container does not share this working directory)."""
    return {key: os.path.abspath(value) if isinstance(value, str) and value and "://" not in value
            and os.path.exists(value) else value for key, value in arguments.items()}


def input_mounts(arguments: dict, pipeline_root: str) -> list[str]:
    """The input directories to mount read-only: every existing path among the arguments outside the pipeline root.

    A file is mounted by its directory; a path inside another one mounted (or inside the pipeline root) is left
    out, since its parent's mount already shows it.
    """
    paths = set()
    for value in arguments.values():
        if isinstance(value, str) and os.path.isabs(value) and os.path.exists(value):
            paths.add(os.path.realpath(value if os.path.isdir(value) else os.path.dirname(value)))
    mounted: list[str] = []
    for path in sorted(paths):  # parents sort before their children
        if not any(path == m or path.startswith(m.rstrip(os.sep) + os.sep) for m in [pipeline_root, *mounted]):
            mounted.append(path)
    return mounted


def _docker_runner(image: str, arguments: dict, pipeline_root: str):
    """kfp.local's DockerRunner for `image`: inputs mounted read-only, files written as the calling user."""
    import docker
    from kfp import local

    from pipelines import image as image_lib

    image_lib.check_engine()
    if not image_lib.image_exists(image):
        raise image_lib.ImageError(f"image {image!r} is not in the local Docker engine; build it with "
                                   f"`fullres image build --tag {image}`.")
    mounts = [docker.types.Mount(target=path, source=path, type="bind", read_only=True)
              for path in input_mounts(arguments, pipeline_root)]
    # The pipeline root is mounted by kfp itself. Writing as this user keeps the artifacts this user's;
    # HOME points somewhere writable for such a user (Keras and Matplotlib keep caches there).
    environment = {"HOME": "/tmp"}
    cache = host_compilation_cache()
    if cache:
        mounts.append(docker.types.Mount(target=CONTAINER_CACHE, source=cache, type="bind"))
        environment["JAX_COMPILATION_CACHE_DIR"] = CONTAINER_CACHE
    return local.DockerRunner(mounts=mounts, user=f"{os.getuid()}:{os.getgid()}", environment=environment)


CONTAINER_CACHE = "/fullres-jax-cache"


def host_compilation_cache() -> str:
    """The folder of this machine's JAX compilation cache, for the steps' containers to share ("" for none).

    The image keeps no cache (each step is a new container), so without it every step compiled again what the
    one before compiled: the model's weight initializers alone, 22 s in each step that builds the model. The
    folder is fullres's own (`trainer.COMPILATION_CACHE`: `~/.cache/fullres/jax`, or the user's
    `JAX_COMPILATION_CACHE_DIR`); the containers run as this user and the image holds the same jax and jaxlib,
    so what one compiles the others read. A cache switched off, or not a local folder, is left out.
    """
    from trainer import COMPILATION_CACHE

    directory = COMPILATION_CACHE["jax_compilation_cache_dir"]
    return os.path.realpath(directory) if directory and os.path.isabs(directory) and os.path.isdir(directory) else ""
