"""`fullres image` and the DockerRunner's set-up, without a Docker engine: mirrors, index, secrets, mounts.

The image itself is built and run in tests/container/ (which need Docker).
"""

import os
import subprocess
import sys

import pytest

from pipelines import image, local_run

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_apt_mirror_reads_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n")
    assert image.apt_mirror(str(tmp_path)) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text("# a comment\ndeb [arch=amd64] http://other.example/debian bookworm main\n")
    assert image.apt_mirror(str(tmp_path)) == "http://other.example/debian"
    assert image.apt_mirror(str(tmp_path / "nothing")) == image.DEFAULT_MIRROR


def test_package_index_follows_the_machines_configuration(monkeypatch):
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://mirror.example/simple")
    assert image.package_index() == "https://mirror.example/simple"
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://user:token@mirror.example/simple")
    with pytest.raises(image.ImageError, match="carries credentials"):
        image.package_index()


def test_the_ca_bundle_goes_in_as_a_secret_and_the_index_as_a_build_argument(tmp_path):
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    settings = image.BuildSettings(accelerator="gpu", base=image.LOCAL_BASE, index_url="https://mirror.example/simple",
                                   ca_bundle=str(bundle))
    command = image.build_command(settings, REPOSITORY, "/usr/bin/docker")
    assert command[command.index("--secret") + 1] == f"id=ca,src={bundle}"
    assert "INDEX_URL=https://mirror.example/simple" in command and "ACCELERATOR=gpu" in command
    assert f"BASE={image.LOCAL_BASE}" in command and command[command.index("--tag") + 1] == "fullres:gpu"
    assert not any("MIIB" in part for part in command)
    with pytest.raises(ValueError, match="use one of cpu, gpu, tpu"):
        image.BuildSettings(accelerator="cuda")


def test_the_dockerfile_mounts_the_secret_and_the_uv_cache_and_never_copies_a_bundle():
    dockerfile = open(os.path.join(REPOSITORY, "Dockerfile")).read()
    assert dockerfile.count("--mount=type=secret,id=ca,target=/run/secrets/ca") == 3  # every step that downloads
    assert dockerfile.count("--mount=type=cache,target=/root/.cache/uv") == 2
    assert "ENV PYTHONUNBUFFERED=1 \\\n    KERAS_BACKEND=jax" in dockerfile and "ARG BASE=python:3.11-slim" in dockerfile
    copied = [line for line in dockerfile.splitlines() if line.startswith(("COPY", "ADD"))]
    assert not any(".crt" in line or ".pem" in line or "secret" in line for line in copied), copied


def test_input_mounts_are_the_input_directories_outside_the_pipeline_root(tmp_path):
    for directory in ("scans/images", "scans/labels", "other", "root/old-run"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "other" / "manifest.csv").write_text("image,label\n")
    arguments = {"train_input_uri": str(tmp_path / "scans"), "train_labels_uri": str(tmp_path / "scans" / "labels"),
                 "eval_labels_uri": str(tmp_path / "other" / "manifest.csv"),
                 "eval_input_uri": str(tmp_path / "root" / "old-run"), "shape": "32,32,32", "steps": 4,
                 "missing": str(tmp_path / "not-there")}
    mounts = local_run.input_mounts(arguments, str(tmp_path / "root"))
    assert mounts == [str(tmp_path / "other"), str(tmp_path / "scans")]


def test_the_docker_runner_needs_an_image_and_image_needs_the_docker_runner():
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "pipeline", "run", "--local", "--image", "fullres:cpu"],
                            capture_output=True, text=True, cwd=REPOSITORY, env=environment, timeout=120)
    assert result.returncode == 2
    assert "--image applies to --runner docker" in result.stderr
    with pytest.raises(ValueError, match="needs --image"):
        local_run.run_local("ct-segmentation", {}, "unused-root", runner="docker")
    with pytest.raises(ValueError, match="runner 'kubernetes' is not known"):
        local_run.run_local("ct-segmentation", {}, "unused-root", runner="kubernetes")


@pytest.mark.parametrize("setting, shared", [("folder", True), ("", False), ("gs://bucket/jax", False)])
def test_docker_steps_share_the_hosts_compilation_cache_only_a_local_one(monkeypatch, tmp_path, setting, shared):
    import trainer
    from pipelines import local_run

    folder = tmp_path / "jax-cache"
    folder.mkdir()
    value = str(folder) if setting == "folder" else setting
    monkeypatch.setitem(trainer.COMPILATION_CACHE, "jax_compilation_cache_dir", value)
    assert local_run.host_compilation_cache() == (str(folder.resolve()) if shared else "")
