"""The README's commands are the ones CI runs, and its Python example runs as written."""

import os
import re
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*path):
    with open(os.path.join(REPOSITORY, *path)) as file:
        return file.read()


def test_ci_runs_exactly_the_readme_test_command():
    readme_commands = re.findall(r"```bash\n(.*?)\n```", _read("README.md"), flags=re.S)
    ci_command = _read(".ci", "run").strip().splitlines()[-1]
    assert "pytest" in ci_command
    assert ci_command in readme_commands


def test_readme_main_command_runs_the_demo():
    assert "python3 -m pip install --quiet uv && python3 -m uv run --locked fullres demo" in _read("README.md")


@pytest.mark.slow  # a fresh Python with 8 CPU devices fits and plans the README's network
def test_the_readme_python_example_runs_as_a_program(tmp_path):
    """The ```python block, saved as a file and run as users run it: `model.fit` under `fullres.SpatialParallel`,
    then `fullres.plan` of the same network (which rebuilds it from that file)."""
    blocks = re.findall(r"```python\n(.*?)\n```", _read("README.md"), flags=re.S)
    assert len(blocks) == 1 and "fullres.SpatialParallel" in blocks[0] and "fullres.plan" in blocks[0]
    example = tmp_path / "example.py"
    example.write_text(blocks[0])
    environment = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}  # as users have
    environment.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, cwd=str(tmp_path),
                            env=environment, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "segmentation example.py:network [64, 64, 64], 1 channel, batch 1 per replica" in result.stdout
    # The 4-way row: activations split (a quarter and a bit), halo exchanged, nothing all-gathered (then the halo's
    # ratio to its bound and the all-to-all bytes' columns).
    row = re.search(r"^ +4 1,4,1,1,1 .* (\d+) +([\d.]+) (B|KiB|MiB) +[\d.]+ +[\d.]+ (B|KiB|MiB) *$", result.stdout,
                    re.MULTILINE)
    assert row and row.group(1) == "0" and float(row.group(2)) > 0, result.stdout[-2000:]


def test_the_readme_stays_within_12_kb():
    """The README is the front door (≤ 12 KB); detail belongs in docs/."""
    size = len(_read("README.md").encode("utf-8"))
    assert size <= 12 * 1024, f"README.md is {size} bytes, over 12 KiB: move detail into docs/"
