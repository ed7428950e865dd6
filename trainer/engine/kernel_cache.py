"""Where measured kernel choices are remembered: one JSON file per user, keyed by the device and the software.

A candidate's time depends on the device kind (e.g. "NVIDIA H100 80GB HBM3") and on the compiler and libraries that
build its program: JAX, jaxlib, the accelerator's plug-in (jax-cuda12-plugin, libtpu) and cuDNN. `device_key` holds
all of them; a choice measured under one key is never served under another. Within a key the file holds, per
signature (`kernel_layers.Signature.key` and the run's replicas), each candidate's time, and per step the
whole-step comparison (`kernel_choice`).

The file is `$XDG_CACHE_HOME/fullres/kernels/choices.json` (`~/.cache/...` where unset), or `--set
kernels.cache=PATH`. A file that cannot be read as one fullres wrote, or a folder it cannot be written to, is said
in one log line and the run goes on measuring; fullres never overwrites a file it cannot read as its own.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "choices.json")
    >>> cache = KernelCache.open(path, {"device_kind": "cpu"}, print)
    >>> cache.entries["signatures"]["a"] = {"times": {"xla": 0.5}}
    >>> cache.save(print)
    >>> KernelCache.open(path, {"device_kind": "cpu"}, print).entries["signatures"]
    {'a': {'times': {'xla': 0.5}}}
    >>> KernelCache.open(path, {"device_kind": "other"}, print).entries["signatures"]
    {}
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Callable

FORMAT = "fullres kernel choices"
PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt", "jax-rocm7-plugin",
           "libtpu")


def default_path() -> str:
    """`$XDG_CACHE_HOME/fullres/kernels/choices.json`, `~/.cache/fullres/kernels/choices.json` where unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fullres", "kernels", "choices.json")


def device_key(device) -> dict:
    """What a measured time depends on besides the op: the device kind and the versions of the software that builds
    and runs its program (plug-ins and cuDNN where installed)."""
    import jax
    import jaxlib

    key = {"device_kind": str(device.device_kind), "platform": device.platform, "jax": jax.__version__,
           "jaxlib": jaxlib.__version__}
    for name in PLUGINS:
        try:
            key[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if device.platform in ("gpu", "cuda"):
        try:
            from jax._src.lib import cuda_versions

            key["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
        except Exception:  # noqa: BLE001 (a plug-in without the query: the plug-in's version stands for it)
            key["cudnn"] = None
    return key


@dataclasses.dataclass
class KernelCache:
    """The cache file's entries for one `device_key`: {"signatures": {...}, "steps": {...}}.

    Args:
        path: the file.
        key: `device_key`'s dict.
        content: the whole file as read ({} where there is none yet); None where it is not fullres's to write.
        entries: this key's part of it, which `save` writes back.
    """

    path: str
    key: dict
    content: dict | None
    entries: dict

    @classmethod
    def open(cls, path: str, key: dict, log: Callable[[str], None]) -> KernelCache:
        """The cache at `path` for `key`; a file that is not one fullres wrote is said in `log` and left alone."""
        empty = {"signatures": {}, "steps": {}}
        if not os.path.exists(path):
            return cls(path, key, {}, empty)
        try:
            with open(path, encoding="utf-8") as file:
                content = json.load(file)
            if not isinstance(content, dict) or content.get("format") != FORMAT or not isinstance(
                    content.get("devices"), dict):
                raise ValueError("it is not a file of fullres's kernel choices")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            log(f"kernels: the cache {path} cannot be read ({type(error).__name__}: {error}); measuring without it "
                "and leaving it as it is (move it aside to let fullres write a new one, or --set kernels.cache=PATH)")
            return cls(path, key, None, empty)
        entries = content["devices"].get(_name(key))
        if not isinstance(entries, dict) or entries.get("key") != key:
            return cls(path, key, content, empty)
        return cls(path, key, content, {"signatures": dict(entries.get("signatures") or {}),
                                        "steps": dict(entries.get("steps") or {})})

    def save(self, log: Callable[[str], None]) -> None:
        """Writes this key's entries back (whole file, atomically); a failure is said in `log` and ignored."""
        if self.content is None:
            return
        content = {"format": FORMAT, "devices": {**self.content.get("devices", {}),
                                                 _name(self.key): {"key": self.key, **self.entries}}}
        partial = f"{self.path}.{os.getpid()}.partial"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(partial, "w", encoding="utf-8") as file:
                json.dump(content, file, indent=1, sort_keys=True)
            os.replace(partial, self.path)
        except OSError as error:
            log(f"kernels: the cache {self.path} cannot be written ({type(error).__name__}: {error}); the choice "
                "holds for this run only (--set kernels.cache=PATH names a writable file)")
            with contextlib.suppress(OSError):
                os.remove(partial)


def _name(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))
