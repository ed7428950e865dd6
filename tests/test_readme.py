"""The README's commands are the ones CI runs."""

import os
import re

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
