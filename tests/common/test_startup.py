"""fullres's entry points rest Python's cyclic garbage collector while a module is imported, and only then."""

import json
import os
import subprocess
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = """
import builtins, gc, json, sys
sys.path.insert(0, sys.argv[1])
from common import startup
import seen_before  # Python's own import: the collector runs
startup.collect_after_imports()
wrapper = builtins.__import__
startup.collect_after_imports()  # a second call wraps nothing again
import seen  # the collector rests while the module runs
after = gc.isenabled()
try:
    import broken
except RuntimeError:
    pass
after_failure = gc.isenabled()
gc.disable()
import seen_while_off  # a caller's choice stands
kept_off = not gc.isenabled()
gc.enable()
print(json.dumps({"states": [m.ENABLED for m in (sys.modules["seen_before"], sys.modules["seen"],
                                                sys.modules["seen_while_off"])],
                  "same_wrapper": builtins.__import__ is wrapper, "after": after, "after_failure": after_failure,
                  "kept_off": kept_off}))
"""


def test_the_collector_rests_during_imports_only(tmp_path):
    for name in ("seen_before", "seen", "seen_while_off"):
        (tmp_path / f"{name}.py").write_text("import gc\nENABLED = gc.isenabled()\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('an import that fails')\n")
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True,
                            cwd=REPOSITORY, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["states"] == [True, False, False]
    assert seen["same_wrapper"] and seen["after"] and seen["after_failure"] and seen["kept_off"]


def test_fullres_python_m_trainer_and_every_pipeline_step_rest_it(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    program = """
import builtins, json, runpy, sys
results = {}
for name, run in (("fullres", lambda: __import__("pipelines.cli").cli.main(["--help"])),
                  ("python -m trainer", lambda: runpy.run_module("trainer", run_name="__main__"))):
    builtins.__import__ = ORIGINAL if "ORIGINAL" in globals() else builtins.__import__
    ORIGINAL = builtins.__import__
    sys.argv = [name, "--help"]
    try:
        run()
    except SystemExit:
        pass
    results[name] = getattr(builtins.__import__, "_fullres_collects_after_imports", False)
    builtins.__import__ = ORIGINAL
print(json.dumps(results))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPOSITORY,
                            env=environment, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"fullres": True, "python -m trainer": True}
    import inspect

    from components import steps

    for step in (steps.preprocess_ct, steps.preprocess_images, steps.train, steps.evaluate, steps.export,
                 steps.predict):  # first thing in the body, which KFP runs in the step's container
        body = inspect.getsource(step).split('"""')[2]
        assert body.lstrip().startswith("from common import startup\n\n    startup.collect_after_imports()"), step
