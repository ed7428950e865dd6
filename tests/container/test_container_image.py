"""The container image: built by `fullres image build`, run as a CLI, and running the whole pipeline.

These tests need a Docker engine (and root, where the base image must be made
here: Docker Hub out of reach). They are marked `container` (leave them out of a
quick run with `-m "not container"`); CI runs them. Where no engine answers they
fail, in one sentence saying what is missing: a test that silently passes without
Docker would prove nothing.

One module, so the image is built once per test session (the module fixture) and
its tests run in order on one xdist worker. The ct-segmentation pipeline runs
through kfp.local's DockerRunner (every step a container of the image) on the
scans of the session's short `fullres demo` (the `demo_run` fixture: the
pipeline through the SubprocessRunner, once per session, shared with
tests/pipelines/test_demo.py), and both must produce the same outputs: the same
records, the same set of artifacts, a report, a SavedModel and masks.
"""

import glob
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest

from pipelines import image

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.e2e]  # builds an image, runs the pipeline

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG = "fullres:cpu"  # what the README's `fullres image build` makes
SIZE_LIMIT = 3.5e9

# The parameters `fullres demo --steps 4` gives the pipeline (pipelines/cli.py), but unpartitioned (the default
# input_partition_dims): the DockerRunner passes no XLA_FLAGS into the containers, so each step sees one CPU device.
DEMO_PARAMETERS = ["preset=demo", "steps=4", "spacing=1.7,1.7,2.25", "window=-200,300", "shape=32,32,32",
                   "class_names=background,liver,kidney"]
CREDENTIAL_FILES = (".netrc", ".pypirc", ".git-credentials", ".docker/config.json", "pip.conf", "uv.toml")


def fullres(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Runs the `fullres` CLI as a user would (one CPU device: no virtual devices forced)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True,
                          cwd=REPOSITORY, env=environment, timeout=timeout)


@pytest.fixture(scope="module")
def docker() -> str:
    """The Docker client, once an engine answers."""
    try:
        client = image.docker_client()
        image.check_engine(client)
    except image.ImageError as error:
        pytest.fail(f"the container tests need a Docker engine (the README's test command installs and starts one "
                    f"as root): {error}", pytrace=False)
    return client


@pytest.fixture(scope="module")
def built_image(docker) -> dict:
    """The CPU image, built by the README's command (`fullres image build`); its tag, size and build output."""
    result = fullres("image", "build", "--tag", TAG)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"tag": TAG, "size": image.size_bytes(TAG, docker), "output": result.stdout}


def test_the_image_builds_under_the_size_target_and_prints_its_size(built_image):
    printed = re.search(r"built image (\S+): ([\d.]+) GB", built_image["output"])
    assert printed, built_image["output"][-2000:]
    assert printed.group(1) == built_image["tag"]
    assert abs(float(printed.group(2)) - built_image["size"] / 1e9) < 0.01
    assert built_image["size"] < SIZE_LIMIT, f"{built_image['size'] / 1e9:.2f} GB"
    print(f"image {built_image['tag']}: {built_image['size'] / 1e9:.2f} GB")


def test_the_image_is_the_fullres_cli(docker, built_image):
    result = subprocess.run([docker, "run", "--rm", built_image["tag"], "fullres", "--help"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for command in ("train", "pipeline", "preprocess", "image"):
        assert command in result.stdout


def test_keras_before_the_trainer_works_in_the_image(docker, built_image):
    result = subprocess.run(
        [docker, "run", "--rm", built_image["tag"], "python", "-c",
         "import keras, trainer; print('backend', keras.backend.backend())"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "backend jax" in result.stdout


def _bundle_needles(bundle: str, image_store: str) -> list[bytes]:
    """Base64 lines of the certificates in `bundle` that the image's own CA store does not hold."""
    pattern = r"-----BEGIN CERTIFICATE-----\n(.*?)\n-----END CERTIFICATE-----"
    own = set(re.findall(pattern, image_store, flags=re.S))
    needles = []
    for body in set(re.findall(pattern, open(bundle).read(), flags=re.S)) - own:
        lines = body.splitlines()
        needles.append(lines[len(lines) // 2].encode())  # a middle line: unique to that certificate
    return needles


def _saved_image(docker: str, tag: str):
    """The image as `docker save` writes it: ("config", name, bytes) for its config and history (build arguments,
    environment), (layer, path, bytes or None where not a regular file) for every entry of every layer."""
    saved = subprocess.Popen([docker, "save", tag], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=saved.stdout, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            content = archive.extractfile(member).read()
            if not member.name.endswith("layer.tar"):
                yield "config", member.name, content
                continue
            with tarfile.open(fileobj=io.BytesIO(content), mode="r:") as layer:
                for entry in layer:
                    yield member.name, entry.name, layer.extractfile(entry).read() if entry.isfile() else None
    assert saved.wait() == 0


def _stored_image(docker: str, tag: str):
    """The same as `_saved_image`, read where an overlay2 engine keeps the image: each layer's folder, the config
    from `docker image inspect` and the history (each step's command) from `docker history`. `docker save` spent
    56 s of this test's 67 s writing the 3.4 GB image out; reading the folders takes a fraction. None where the
    engine stores images otherwise (the containerd image store) or the folders cannot be read (not root)."""
    found = json.loads(subprocess.run([docker, "image", "inspect", tag], capture_output=True, text=True,
                                      check=True, timeout=120).stdout)[0]
    driver = found.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    folders = [data.get("UpperDir", "")] + data.get("LowerDir", "").split(":")
    folders = [folder for folder in folders if folder]
    if driver.get("Name") != "overlay2" or not folders or not all(os.access(f, os.R_OK | os.X_OK) for f in folders):
        return None
    history = subprocess.run([docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag],
                             capture_output=True, check=True, timeout=120).stdout

    def entries():
        yield "config", "docker image inspect", json.dumps(found).encode()
        yield "config", "docker history", history
        for folder in folders:
            for root, directories, files in os.walk(folder):
                for name in directories + files:
                    path = os.path.join(root, name)
                    data = None
                    if os.path.isfile(path) and not os.path.islink(path):
                        with open(path, "rb") as file:
                            data = file.read()
                    yield folder, os.path.relpath(path, folder), data

    return entries()


def test_no_ca_bundle_or_credential_in_any_layer(docker, built_image):
    bundle = image.ca_bundle()
    assert bundle, "this machine names no CA bundle (pip's cert, SSL_CERT_FILE); the build passed none to check"
    store = subprocess.run([docker, "run", "--rm", built_image["tag"], "cat", "/etc/ssl/certs/ca-certificates.crt"],
                           capture_output=True, text=True, timeout=300).stdout
    needles = _bundle_needles(bundle, store)
    with open(bundle, "rb") as file:
        bundle_bytes = file.read()
    bundle_digest = hashlib.sha256(bundle_bytes).hexdigest()
    found, files, layers = [], 0, set()
    entries = _stored_image(docker, built_image["tag"]) or _saved_image(docker, built_image["tag"])
    for layer, name, data in entries:
        if layer == "config":  # the image config and history: build args, environment
            found += [f"{name}: {n.decode()[:20]}" for n in needles if n in data]
            found += [name] if bundle_bytes in data else []
            continue
        layers.add(layer)
        if any(name.endswith(f) for f in CREDENTIAL_FILES) and "site-packages" not in name:
            found.append(f"credential file {name}")
        if data is None:
            continue
        files += 1
        if needles and any(n in data for n in needles):
            found.append(f"{layer}:{name}")
        elif (len(data) == len(bundle_bytes) and hashlib.sha256(data).hexdigest() == bundle_digest
              and name != "etc/ssl/certs/ca-certificates.crt"):
            found.append(f"copy of the bundle {layer}:{name}")
    assert not found, found
    assert len(layers) >= 3 and files > 10000, (len(layers), files)  # the search saw the image's files


def _demo_parameters(demo_output) -> list[str]:
    """The demo's scans (4 training, 2 held-out stored turned and flipped, NIfTI) and the demo's parameters."""
    parameters = list(DEMO_PARAMETERS)
    for split in ("train", "eval"):
        cases = demo_output / "data" / split / "nifti"
        parameters += [f"{split}_input_uri={cases}/images", f"{split}_labels_uri={cases}/labels"]
    return parameters + [f"predict_input_uri={demo_output / 'data' / 'eval' / 'nifti' / 'images'}"]


def _run_pipeline(parameters: list[str], runner_args: list[str], root: str) -> tuple[dict, float]:
    start = time.monotonic()
    result = fullres("pipeline", "run", "--local", *runner_args, "--pipeline-root", root,
                     *[a for p in parameters for a in ("--param", p)])
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    run_dir = re.search(r"run directory (\S+)", result.stdout).group(1)
    return {"run_dir": run_dir, "output": result.stdout + result.stderr}, elapsed


def _records(dataset: str) -> list[str]:
    """Every record's features and values, in a canonical text form, sorted.

    Compared as parsed examples, not bytes: protobuf does not fix the order in
    which a map (`Features.feature`) is serialized, and the same scans
    preprocessed in the image and here give records whose bytes differ while
    every feature's value is equal (measured on 2 demo scans).
    """
    import tensorflow as tf

    canonical = []
    for record in tf.data.TFRecordDataset(sorted(glob.glob(os.path.join(dataset, "data-*")))):
        features = tf.train.Example.FromString(record.numpy()).features.feature
        canonical.append(repr(sorted((key, str(features[key])) for key in features)))
    return sorted(canonical)


def _outputs(run_dir: str) -> set[str]:
    return {os.path.relpath(p, run_dir) for p in glob.glob(os.path.join(run_dir, "*", "*"))}


def test_ct_segmentation_runs_in_containers_with_the_subprocess_runners_outputs(tmp_path, built_image, demo_run):
    tag = built_image["tag"]
    compiled = fullres("pipeline", "compile", "--image", tag, "--output-dir", str(tmp_path / "compiled"))
    assert compiled.returncode == 0, compiled.stderr
    named = set(re.findall(r"^\s+image: (\S+)$", (tmp_path / "compiled" / "pipeline.yaml").read_text(), flags=re.M))
    # Every fullres step names the image; the only other is the Vertex custom-job launcher of GCPC.
    assert tag in named and all("google-cloud-pipeline-components" in n for n in named - {tag}), named

    _, summary, demo_output = demo_run  # the SubprocessRunner's run, made once per session
    parameters = _demo_parameters(demo_output)  # the same scans for both runners: records name their files
    docker_run, docker_seconds = _run_pipeline(parameters, ["--runner", "docker", "--image", tag],
                                               str(tmp_path / "docker-root"))
    # kfp.local's DockerRunner names the image it starts, once per step: all six steps ran in it.
    assert docker_run["output"].count(f"Found image {tag!r}") == 6, docker_run["output"][-3000:]
    local_run = {"run_dir": summary["run_dir"]}
    print(f"ct-segmentation, 4 steps: DockerRunner {docker_seconds:.0f} s")

    assert _outputs(docker_run["run_dir"]) == _outputs(local_run["run_dir"])
    for split in ("preprocess-ct", "preprocess-ct-2"):
        summaries = [json.loads(open(os.path.join(r["run_dir"], split, "dataset", "summary.json")).read())
                     for r in (docker_run, local_run)]
        assert summaries[0]["ok"] == summaries[1]["ok"] > 0 and summaries[0]["failed"] == summaries[1]["failed"] == 0
        # The same scans give the same records, value for value, in the container and here.
        assert _records(os.path.join(docker_run["run_dir"], split, "dataset")) == _records(
            os.path.join(local_run["run_dir"], split, "dataset"))
    for run in (docker_run, local_run):
        scores = json.loads(open(os.path.join(run["run_dir"], "evaluate", "metrics")).read())
        assert scores["cases"] == 2 and scores["class_names"] == ["background", "liver", "kidney"]
        assert 0.0 <= scores["dice_mean"] <= 1.0
        assert open(os.path.join(run["run_dir"], "evaluate", "report")).read().startswith("<!DOCTYPE html>")
        assert os.path.isfile(os.path.join(run["run_dir"], "export", "exported", "saved_model", "saved_model.pb"))
        assert json.loads(open(os.path.join(run["run_dir"], "train", "model", "train_config.json")).read())["steps"] == 4
    # The containers wrote as this user, not as root.
    assert os.stat(os.path.join(docker_run["run_dir"], "train", "model", "model.keras")).st_uid == os.getuid()
