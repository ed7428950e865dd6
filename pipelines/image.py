"""Builds the fullres container image (the root `Dockerfile`) with Docker's BuildKit, and a base image without Docker Hub.

The build reaches the package index the way this machine's pip and uv do: the
index URL they are configured with goes in as a build argument, and the CA
bundle they trust goes in as a BuildKit secret — mounted for the steps that
download, never copied into a layer. Where Docker Hub cannot be reached,
`make_base` builds a Debian bookworm base (Python 3.11) from the machine's own
apt mirror with debootstrap and imports it into Docker.

Example:
    >>> from pipelines import image
    >>> settings = image.BuildSettings(accelerator="cpu", base=image.LOCAL_BASE)
    >>> tag = image.build(settings, root=".")  # doctest: +SKIP
    >>> image.size_bytes(tag)  # doctest: +SKIP
    3612345678
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import tempfile
import tomllib
import urllib.parse
from collections.abc import Callable

ACCELERATORS = ("cpu", "gpu", "tpu")
DEFAULT_BASE = "python:3.11-slim"
LOCAL_BASE = "fullres-base:bookworm"
DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# The JAX extra each accelerator's image adds, at the locked JAX version (the Dockerfile installs the same).
JAX_PLUGINS = {"gpu": "cuda12", "tpu": "tpu"}
DEBIAN_PACKAGES = ("python3.11", "python3-pip", "python3-venv", "ca-certificates")


class ImageError(RuntimeError):
    """A build or its prerequisites failed; the message says what is missing and how to fix it."""


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """What `build` builds.

    Attributes:
        accelerator: cpu, gpu (CUDA 12 JAX plug-in) or tpu (libtpu).
        base: the base image (Python 3.11 with venv).
        tag: the image's tag; empty means `fullres:<accelerator>`.
        index_url: the package index inside the build; empty means the one this machine's pip/uv use.
        ca_bundle: the CA bundle passed as a secret; empty means the one pip/uv trust here (none if unset).
    """

    accelerator: str = "cpu"
    base: str = DEFAULT_BASE
    tag: str = ""
    index_url: str = ""
    ca_bundle: str = ""

    def __post_init__(self):
        if self.accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator {self.accelerator!r} is not known; use one of {', '.join(ACCELERATORS)}.")

    @property
    def image_tag(self) -> str:
        return self.tag or f"fullres:{self.accelerator}"


def docker_client() -> str:
    """The Docker client to use: Debian's docker.io one (BuildKit built in) before any other on PATH."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ImageError("no Docker client is installed; install Docker (Debian: `apt-get install docker.io`) and start dockerd.")


def check_engine(docker: str | None = None) -> str:
    """The engine's version; raises ImageError naming what is missing when no engine answers."""
    docker = docker or docker_client()
    result = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    version = result.stdout.strip()
    if result.returncode != 0 or not version or version == "<no value>":
        reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ImageError(f"no Docker engine answers ({reason}); start one (as root: `dockerd &`) or add your user to "
                         "the docker group.")
    return version


def _pip_config() -> dict[str, str]:
    """pip's effective settings (`pip config list`: files and PIP_* variables), keyed by name without the scope."""
    try:
        listed = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    settings: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    return settings


def _uv_config() -> dict:
    """uv's user or system configuration file (uv.toml), if any."""
    for path in (os.path.join(os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config")), "uv", "uv.toml"),
                 "/etc/uv/uv.toml"):
        if os.path.isfile(path):
            with open(path, "rb") as file:
                return tomllib.load(file)
    return {}


def package_index() -> str:
    """The index this machine installs from: uv's setting, then pip's, then PyPI."""
    uv = _uv_config()
    default_indexes = [i.get("url") for i in uv.get("index", []) if i.get("default")]
    candidates = [os.environ.get("UV_DEFAULT_INDEX"), os.environ.get("UV_INDEX_URL"), *default_indexes,
                  uv.get("index-url"), os.environ.get("PIP_INDEX_URL"), _pip_config().get("index-url")]
    index = next((c for c in candidates if c), DEFAULT_INDEX)
    if urllib.parse.urlsplit(index).password or urllib.parse.urlsplit(index).username:
        raise ImageError("the package index URL carries credentials, which a build argument would keep in the image "
                         "history; pass --index-url without them (and give the index a netrc) or use a token-free mirror.")
    return index


def ca_bundle() -> str | None:
    """The CA bundle pip/uv trust here (pip's `cert`, SSL_CERT_FILE, REQUESTS_CA_BUNDLE), or None."""
    candidates = [os.environ.get("PIP_CERT"), _pip_config().get("cert"), os.environ.get("SSL_CERT_FILE"),
                  os.environ.get("REQUESTS_CA_BUNDLE")]
    return next((c for c in candidates if c and os.path.isfile(c)), None)


def apt_mirror(sources: str = "/etc/apt") -> str:
    """The Debian mirror this machine's apt uses (sources.list or deb822 .sources files), or deb.debian.org."""
    uris: list[str] = []
    for path in [os.path.join(sources, "sources.list"), *sorted(glob.glob(os.path.join(sources, "sources.list.d", "*")))]:
        if not os.path.isfile(path) or not path.endswith((".list", ".sources")):
            continue
        with open(path) as file:
            for line in file:
                words = line.split("#", 1)[0].split()
                if words[:1] == ["deb"]:
                    uris.append(next(w for w in words[1:] if not w.startswith("[")))
                elif words[:1] == ["URIs:"]:
                    uris.extend(words[1:])
    debian = [u for u in uris if u.rstrip("/").endswith("/debian")]
    return debian[0] if debian else DEFAULT_MIRROR


def image_exists(name: str, docker: str | None = None) -> bool:
    docker = docker or docker_client()
    return subprocess.run([docker, "image", "inspect", name], capture_output=True).returncode == 0


def pull(name: str, docker: str | None = None, timeout: float = 300) -> bool:
    """True when `name` is here or could be pulled (False where its registry, e.g. Docker Hub, is out of reach)."""
    docker = docker or docker_client()
    if image_exists(name, docker):
        return True
    try:
        return subprocess.run([docker, "pull", name], capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def make_base(name: str = LOCAL_BASE, mirror: str | None = None, log: Callable[[str], None] = print) -> str:
    """Builds a Debian bookworm base image (Python 3.11, venv, CA certificates) with debootstrap; returns its name.

    Needs root (debootstrap) and the `debootstrap` package. apt's downloaded
    packages and lists are left out of the image.
    """
    docker = docker_client()
    check_engine(docker)
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed; install it (`apt-get install debootstrap`) to make the base "
                         "image, or pass --base with an image that has Python 3.11.")
    if os.geteuid() != 0:
        raise ImageError("making the base image runs debootstrap, which needs root; run `fullres image base` as root, "
                         "or pass --base with an image that has Python 3.11.")
    mirror = mirror or apt_mirror()
    log(f"making the base image {name}: Debian bookworm from {mirror} with debootstrap (Docker Hub not needed)")
    with tempfile.TemporaryDirectory(prefix="fullres-base-") as directory:
        root = os.path.join(directory, "rootfs")
        bootstrap = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", "bookworm", root, mirror],
            capture_output=True, text=True)
        if bootstrap.returncode != 0:
            raise ImageError(f"debootstrap from {mirror} failed ({bootstrap.stdout.strip().splitlines()[-1:]}); check "
                             "the mirror (--mirror) and the network.")
        for leftover in glob.glob(os.path.join(root, "var/cache/apt/archives/*.deb")) + glob.glob(
                os.path.join(root, "var/lib/apt/lists/*_*")):
            os.remove(leftover)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([docker, "import", "-", name], stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise ImageError(f"importing the base image into Docker failed ({imported.stderr.strip()}).")
    log(f"base image {name} ready ({size_bytes(name, docker) / 1e6:.0f} MB)")
    return name


def with_reachable_base(settings: BuildSettings, log: Callable[[str], None] = print) -> BuildSettings:
    """`settings`, on the local Debian base where the default base cannot be pulled from Docker Hub.

    The local base (`LOCAL_BASE`) is made with `make_base` if it is not there yet.
    """
    if settings.base != DEFAULT_BASE or pull(settings.base):
        return settings
    log(f"Docker Hub is out of reach ({settings.base} could not be pulled); using the Debian base "
        f"{LOCAL_BASE} made here from apt's mirror instead.")
    if not image_exists(LOCAL_BASE):
        make_base(log=log)
    return dataclasses.replace(settings, base=LOCAL_BASE)


def build_command(settings: BuildSettings, root: str, docker: str) -> list[str]:
    """The `docker build` command line (the CA bundle as a BuildKit secret, the index as a build argument)."""
    command = [docker, "build", "--progress=plain", "--build-arg", f"BASE={settings.base}",
               "--build-arg", f"ACCELERATOR={settings.accelerator}",
               "--build-arg", f"INDEX_URL={settings.index_url or package_index()}", "--tag", settings.image_tag]
    bundle = settings.ca_bundle or ca_bundle()
    if bundle:
        command += ["--secret", f"id=ca,src={bundle}"]
    return [*command, root]


def build(settings: BuildSettings, root: str, log: Callable[[str], None] = print) -> str:
    """Builds the image from the Dockerfile in `root` with BuildKit (output streamed to `log`); returns its tag."""
    docker = docker_client()
    check_engine(docker)
    command = build_command(settings, root, docker)
    log(f"building {settings.image_tag} (accelerator {settings.accelerator}, base {settings.base})")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "DOCKER_BUILDKIT": "1"})
    tail: list[str] = []
    for line in process.stdout:
        log(line.rstrip("\n"))
        tail = [*tail[-20:], line.rstrip("\n")]
    if process.wait() != 0:
        hint = " (is the base image there? `fullres image base` makes one)" if not image_exists(settings.base, docker) else ""
        raise ImageError(f"docker build of {settings.image_tag} failed{hint}; the build log is above.")
    return settings.image_tag


def size_bytes(name: str, docker: str | None = None) -> int:
    """The image's size, as `docker images` shows it."""
    docker = docker or docker_client()
    result = subprocess.run([docker, "image", "inspect", "--format", "{{.Size}}", name], capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageError(f"image {name!r} is not in the local Docker engine; build it with `fullres image build`.")
    return int(result.stdout.strip())


def plugin_requirement(accelerator: str, jax_version: str) -> str | None:
    """The JAX plug-in requirement the `accelerator` image adds (None for cpu), pinned to the locked JAX."""
    extra = JAX_PLUGINS.get(accelerator)
    return f"jax[{extra}]=={jax_version}" if extra else None
