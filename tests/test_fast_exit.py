"""A process that imports the trainer or preprocessing freezes its heap as its last exit handler (trainer/__init__.py,
"Exit"): Python's final collections skip the millions of objects TensorFlow, JAX and Keras hold."""

import os
import subprocess
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An exit handler registered before fullres is imported runs after fullres's (last registered, first run): it sees
# the heap frozen only if importing the package registered the freeze.
PROGRAM = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
import {package}
print("frozen while running:", gc.get_freeze_count() > 0)
"""


def _run(package: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROGRAM.format(package=package)], capture_output=True, text=True,
                            cwd=REPOSITORY, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_importing_the_trainer_or_preprocessing_freezes_the_heap_only_at_exit():
    for package in ("preprocessing", "trainer"):
        assert _run(package) == ["frozen while running: False", "frozen at exit: True"], package


def test_a_process_that_imports_neither_is_left_alone():
    assert _run("common.console") == ["frozen while running: False", "frozen at exit: False"]
