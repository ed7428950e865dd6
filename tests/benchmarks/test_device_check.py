"""benchmarks/device/device_check.py: the GPU check stays runnable, its JSON checks, and a part that fails does not stop the rest.

The CPU run at tiny sizes (the script as the device runs it, every part in its own process) is in the fast tier:
9 s on the 2-core machine when it is quiet (2026-11-27), 32-78 s while six other jobs shared it. The
other tests drive the same orchestration with rows answered by stand-in processes, and the JSON checker.
"""

import datetime
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests import files

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPOSITORY, "benchmarks", "device", "device_check.py")


def load():
    return files.load_script("benchmarks", "device", "device_check.py")


def test_help_lists_the_parts_and_their_time_limits(capsys):
    device_check = load()
    with pytest.raises(SystemExit):
        device_check.main(["--help"])
    shown = capsys.readouterr().out
    for part, seconds in device_check.LIMITS.items():
        assert any(line.split()[:2] == [part, str(seconds)] for line in shown.splitlines()), (part, shown)
    assert "timeout_s" in shown and ".whl" in shown  # how the device machine runs it


PLAN = {"source": "fullres plan --target h100x1 (test)", "rows": [
    {"part": "train", "model": "default", "precision": "float32", "augmentation": "none", "size": 128,
     "total_bytes": 2_000_000_000, "step_seconds": 0.01, "fits": True},
    {"part": "train", "model": "default", "precision": "float32", "augmentation": "none", "size": 448,
     "total_bytes": 60_000_000_000, "step_seconds": 0.4, "fits": True},
    {"part": "train", "model": "default", "precision": "float32", "augmentation": "none", "size": 480,
     "total_bytes": None, "step_seconds": None, "fits": False}]}


def stand_in_row(spec: dict, limit: float) -> dict:
    """What a row's process answers: figures that follow from its size, so every ratio has one right value."""
    size = spec["sizes"][0]
    if spec.get("fit") and size == 448:  # the plan's largest runs out of memory on the device
        return {"status": "out_of_memory", "size": 448, "error": "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory",
                "wall_seconds": 1.0}
    volume = size ** 3
    return {"status": "ok", "size": size, "median_step_seconds": volume * 3e-9, "steps": spec["steps"],
            "examples_per_second": 1 / (volume * 3e-9), "peak_bytes": volume * 1500,
            "peak_bytes_source": "allocator peak_bytes_in_use", "bytes_limit": 80 * 2**30,
            "device_compiler": {"total_bytes": volume * 1400, "flops": 1e12, "bytes_accessed": 1e10},
            "device_roofline": {"step_seconds": volume * 1e-9, "bound": "compute"}, "wall_seconds": 1.0,
            "here": {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": 1,
                     "python": "3.12.3", "versions": {"jax": "0.11.2"}}}


def test_rows_are_set_beside_the_plan_and_the_checker_catches_figures_that_do_not_add_up(tmp_path, monkeypatch):
    device_check = load()
    monkeypatch.setattr(device_check, "run_row", stand_in_row)
    monkeypatch.setattr(device_check, "nvidia_smi", lambda field: {"name": "NVIDIA H100 80GB HBM3"}.get(field))
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # the GPU run adds its autotuning cache
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(PLAN))
    out = tmp_path / "check.json"
    assert device_check.main(["--json", str(out), "--plan", str(plan_file), "--models", "default",
                              "--precisions", "float32", "--augmentations", "none"]) == 0
    result = json.loads(out.read_text())
    assert device_check.check(result) == []
    assert result["device"]["name"] == "NVIDIA H100 80GB HBM3" and result["software"]["jax"] == "0.11.2"
    autotune = result["software"]["xla_flags"].split("--xla_gpu_per_fusion_autotune_cache_dir=")[1].split()[0]
    assert not os.path.exists(autotune)  # shared by the rows, removed at the end
    assert result["date"].startswith(datetime.date.today().isoformat()[:7])
    fixed, largest, predict, feed = result["rows"]
    # 128³ against the plan file's row: measured ÷ planned from the figures in the row.
    assert fixed["planned"]["source"] == PLAN["source"]
    assert fixed["ratios"]["memory"] == fixed["measured"]["peak_bytes"] / 2_000_000_000
    assert fixed["ratios"]["step_time"] == fixed["measured"]["median_step_seconds"] / 0.01
    # The largest cube: the plan's largest that fits (448³) tried first; it ran out of memory on the device, so the
    # next size down (416³) in a fresh process, which the plan file has no row for: the device compiler's figures
    # stand in, and say so.
    assert "448" in largest["size_found_by"] and largest["size"] == 416
    assert [attempt["size"] for attempt in largest["ran_out_of_memory_at"]] == [448]
    assert largest["planned"]["source"].startswith("the device's own compiler")
    assert largest["ratios"]["memory"] == 416 ** 3 * 1500 / (416 ** 3 * 1400)
    assert predict["part"] == "predict" and feed["part"] == "input"

    # A part whose time is spent: its rows are listed as not run, each with what the plan said, and the JSON checks.
    late = tmp_path / "late.json"
    assert device_check.main(["--json", str(late), "--plan", str(plan_file), "--parts", "train", "--limit", "train=0",
                              "--models", "default", "--precisions", "float32", "--augmentations", "none"]) == 0
    rows = json.loads(late.read_text())["rows"]
    assert [(r["status"], r["size"], r["planned"]["total_bytes"]) for r in rows] == [
        ("not_run", 128, 2_000_000_000), ("not_run", 448, 60_000_000_000)]

    for tamper, complaint in [(lambda r: r["rows"][0]["ratios"].update(memory=0.5), "not measured ÷ planned"),
                              (lambda r: r["rows"][0]["measured"].update(peak_bytes=1.5), "whole number of bytes"),
                              (lambda r: r["rows"][0]["measured"].update(median_step_seconds=-1), "number of seconds"),
                              (lambda r: r["rows"][1].pop("status"), "missing status"),
                              (lambda r: r["rows"][0]["measured"].update(steps=5), "5 steps measured of 20"),
                              (lambda r: r.pop("device"), "missing device")]:
        broken = json.loads(out.read_text())
        tamper(broken)
        assert any(complaint in problem for problem in device_check.check(broken)), complaint
    cut = json.loads(out.read_text())  # a long step near its row's limit: fewer steps, said so, still a result
    cut["rows"][0]["measured"].update(steps=5, steps_cut_by_time_limit=True)
    assert device_check.check(cut) == []


STAND_IN = textwrap.dedent("""
    import json, sys, time
    spec = json.loads(sys.argv[1])
    if spec["model"] == "hangs":
        time.sleep(60)
    if spec["model"] == "oom":
        print("jaxlib.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 90.00GiB")
        sys.exit(1)
    print("ROW_RESULT " + json.dumps({"status": "ok", "size": spec["sizes"][0], "median_step_seconds": 0.02,
                                      "steps": 20, "examples_per_second": 50.0, "peak_bytes": 3000000000,
                                      "peak_bytes_source": "allocator peak_bytes_in_use"}))
""")


def test_a_row_that_hangs_or_runs_out_of_memory_is_reported_with_the_plan_and_the_next_row_runs(tmp_path,
                                                                                                  monkeypatch):
    device_check = load()
    stand_in = tmp_path / "rows.py"
    stand_in.write_text(STAND_IN)
    monkeypatch.setattr(device_check, "ROWS", str(stand_in))
    monkeypatch.setattr(device_check, "MIN_ROW_SECONDS", 1)
    row = {"part": "train", "model": "default", "precision": "float32", "augmentation": "none"}
    spec = {**row, "sizes": [128]}
    started = time.perf_counter()
    hung = device_check.measure_row({**row, "model": "hangs"}, {**spec, "model": "hangs"}, 1.5, PLAN)
    assert hung["status"] == "timed_out" and time.perf_counter() - started < 10
    oom = device_check.measure_row({**row, "model": "oom"}, {**spec, "model": "oom"}, 30, PLAN)
    assert oom["status"] == "out_of_memory" and "RESOURCE_EXHAUSTED" in oom["error"]
    ran = device_check.measure_row(row, spec, 30, PLAN)
    assert ran["status"] == "ok" and ran["planned"]["total_bytes"] == 2_000_000_000
    assert ran["ratios"] == {"memory": 1.5, "step_time": 2.0}
    late = device_check.measure_row(row, spec, 0.5, PLAN)  # its part's time is spent: not started, plan beside it
    assert late["status"] == "not_run" and late["planned"]["total_bytes"] == 2_000_000_000
    result = {"date": "d", "device": {}, "software": {}, "units": {}, "limits_seconds": {},
              "rows": [hung, oom, ran, late]}
    assert device_check.check(result) == []


@pytest.mark.slow  # four row processes, each importing JAX and compiling: 9 s quiet, 12 s beside other work
def test_the_cpu_run_at_tiny_sizes_measures_every_part_and_its_json_checks(tmp_path):
    """The script as the device runs it, on this CPU (four row processes)."""
    out = tmp_path / "tiny.json"
    done = subprocess.run([sys.executable, SCRIPT, "--tiny", "--json", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=REPOSITORY)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    device_check = load()
    assert device_check.check(result) == []
    assert [(r["part"], r["status"]) for r in result["rows"]] == [
        ("train", "ok"), ("train", "ok"), ("predict", "ok"), ("input", "ok")]
    import jax

    assert result["device"]["platform"] == "cpu" and result["software"]["jax"] == jax.__version__
    fixed, largest, predict, feed = result["rows"]
    for row in (fixed, largest):
        assert row["measured"]["steps"] == device_check.TINY["steps"]
        assert row["measured"]["peak_bytes_source"].startswith("process peak RSS")  # marked: no allocator on a CPU
        assert row["planned"]["source"].startswith("the device's own compiler")
        assert row["ratios"]["memory"] == row["measured"]["peak_bytes"] / row["planned"]["total_bytes"]
    # The largest cube: 32³ compiled first needs more than the 4 MiB stand-in device, 24³ fits and ran.
    first, chosen = largest["measured"]["tried"][0], largest["measured"]["tried"][-1]
    limit = largest["measured"]["fit_limit_bytes"]
    assert (first["size"], chosen["size"], largest["size"]) == (32, 24, 24)
    assert first["compiler_bytes"] > limit >= chosen["compiler_bytes"]
    assert predict["measured"]["output_shape"] == [16, 16, 16, 3]
    assert 0 <= feed["measured"]["input_wait_fraction"] <= 1
    assert feed["measured"]["steps"] == device_check.TINY["steps"]
    assert "input wait" in done.stdout  # the table


def test_the_largest_cube_follows_the_target_compiler_past_the_plans_cpu_pre_filter():
    """bfloat16 steps take more memory on the CPU than on the GPU: `fullres plan` left such sizes uncompiled for the
    target (before its GPU pre-filter was loosened, when results/device_plan_h100x1.json was written) and
    `device_plan.py` asked the target's compiler all the same; the device starts from that verdict."""
    device_check = load()
    row = {"part": "train", "model": "default", "precision": "bfloat16", "augmentation": "none"}
    plan = {"source": "fullres plan --target h100x1 (test)", "rows": [
        {**row, "size": 448, "total_bytes": 30_000_000_000, "fits": True, "step_seconds": 0.2},
        {**row, "size": 480, "total_bytes": None, "fits": False, "step_seconds": None,
         "target_total_bytes": 70_000_000_000, "target_fits": True, "note": "not compiled for the target"},
        {**row, "size": 512, "total_bytes": None, "fits": False, "step_seconds": None,
         "target_total_bytes": 90_000_000_000, "target_fits": False}]}
    sizes, how = device_check.largest_candidates(plan, row, None, device_check.GPU)
    assert sizes == [480, 448, 416] and "480" in how
    planned = device_check.planned_for(plan, row, 480)
    assert planned["total_bytes"] == 70_000_000_000 and planned["fits"] is False and planned["note"]


@pytest.mark.parametrize("where, said", [
    ("folder", "--json {folder} is a folder; name a file in it, e.g. {folder}/device_check.json"),
    ("under a file", "--json {notes}/device_check.json lies under {notes}, which is a file, not a folder; name a file "
                     "in a folder"),
    ("read-only", "--json /sys/device_check.json cannot be written (Permission denied); name a file in a folder you "
                  "can write to"),
    ("no folder", "--json {folder}/missing/device_check.json: its folder {folder}/missing does not exist; create it, "
                  "or name a file in a folder that exists"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_row_runs(tmp_path, capsys, where, said):
    """A read-only place or a path under a file failed only after every row had run: a whole GPU
    measurement lost. A folder was a traceback."""
    device_check = load()
    folder, notes = tmp_path / "results", tmp_path / "notes.txt"
    folder.mkdir()
    notes.write_text("mine")
    path = {"folder": folder, "under a file": notes / "device_check.json", "read-only": "/sys/device_check.json",
            "no folder": folder / "missing" / "device_check.json"}[where]
    with pytest.raises(SystemExit) as refused:
        device_check.main(["--tiny", "--json", str(path)])
    shown = capsys.readouterr()
    assert refused.value.code == 2 and "Traceback" not in shown.err
    assert shown.err.strip().splitlines()[-1].partition(": error: ")[2] == said.format(folder=folder, notes=notes)
    assert device_check.HEADER not in shown.out  # no row started
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "results"] and not os.listdir(folder)
    assert notes.read_text() == "mine"


def _plan_helpers():
    return files.load_script("benchmarks", "device", "device_check_plan.py")


def test_the_device_check_sets_the_devices_compiler_beside_the_one_the_plan_modelled():
    helpers = _plan_helpers()
    old = {"source": "fullres plan --target h100x1 (its compiler's figures; jax 0.10.2, jax-cuda12-plugin 0.10.2)"}
    assert helpers.plan_versions(old) == {"jax": "0.10.2", "jax-cuda12-plugin": "0.10.2"}
    new = {"compiler_versions": {"jax": "0.10.2", "jaxlib": "0.10.2", "jax-cuda12-plugin": "0.10.2"}}
    device = {"jax": "0.11.2", "jaxlib": "0.11.2", "jax-cuda13-plugin": "0.11.2", "keras": "3.15.1"}
    assert helpers.version_drift(helpers.plan_versions(new), device) == [
        "jax: plan 0.10.2, device 0.11.2", "jaxlib: plan 0.10.2, device 0.11.2",
        "CUDA plug-in: plan jax-cuda12-plugin 0.10.2, device jax-cuda13-plugin 0.11.2"]
    assert helpers.version_drift(new["compiler_versions"], dict(new["compiler_versions"])) == []


def test_a_row_is_planned_with_the_devices_terms_for_the_program_it_ran():
    """A plan file's row holds the compiler's figure (written before the terms: as its total); the check adds what
    the device holds for the row's own program, and a row run without autotuning is planned without workspace."""
    helpers = _plan_helpers()
    row = {"part": "train", "model": "default", "precision": "float32", "augmentation": "none"}
    plan = {"source": "test", "rows": [{**row, "size": 128, "total_bytes": 2138885880, "step_seconds": 0.0091,
                                        "fits": True}]}
    planned = helpers.planned_for(plan, row, 128)
    measured = {"state_bytes": 260383012, "largest_convolution_bytes": 268435456,
                "autotuning_convolution_bytes": 671088640, "placed_before_compile_bytes": 0, "autotune": True}
    tuned = helpers.with_device_terms(planned, measured, "h200")
    assert tuned["plan_file_total_bytes"] == 2138885880
    assert 2.72e9 / tuned["total_bytes"] == pytest.approx(0.971, abs=0.001)  # the H200's peak for this row
    untuned = helpers.with_device_terms(planned, {**measured, "autotune": False}, "h200")
    assert untuned["device_terms"]["workspace_bytes"] == 0 < tuned["device_terms"]["workspace_bytes"]
    assert helpers.with_device_terms(planned, {"peak_bytes": 1}, "h200") == planned  # a stand-in measured no terms


def test_the_largest_cube_compiles_without_autotuning_where_autotuning_alone_would_pass_its_limit():
    helpers = _plan_helpers()
    autotune, why = helpers.autotune_choice({"step_seconds": 0.584}, None, 120)  # 512³ float32
    assert autotune is False and "--xla_gpu_autotune_level=0" in why
    assert helpers.autotune_choice({"step_seconds": 0.0091}, None, 120)[0] is True  # 128³
    assert helpers.autotune_choice({"expected_compile_seconds": 60.0, "step_seconds": 0.584}, None, 120)[0] is True


def test_the_rows_read_the_workspace_the_devices_autotuner_gave_each_convolution():
    rows = files.load_script("benchmarks", "device", "device_readings.py")

    class Compiled:
        def __init__(self, text):
            self.text = text

        def as_text(self):
            return self.text

    hlo = ('%a = (f32[1,4,32,32,32]{4,3,2,1,0}, u8[0]{0}) custom-call(f32[1,1,32,32,32]{4,3,2,1,0} %p), '
           'window={size=3x3x3}, custom_call_target="__cudnn$convForward"\n'
           '%b = (f32[4,4,3,3,3]{4,3,2,1,0}, u8[134217728]{0}) custom-call(f32[1,4,32,32,32]{4,3,2,1,0} %x), '
           'custom_call_target="__cudnn$convBackwardFilter"\n')
    assert rows.workspace_bytes(Compiled(hlo)) == 134217728
    assert rows.workspace_bytes(Compiled("%c = f32[3]{0} add(%x, %y)")) is None


def test_an_h200_is_checked_against_its_own_plan_file(monkeypatch, tmp_path):
    device_check = load()
    monkeypatch.setattr(device_check, "nvidia_smi", lambda field: "NVIDIA H200" if field == "name" else None)
    assert device_check.target_here() == "h200x1"
    # Without --plan, the run is set beside benchmarks/results/'s plan (it looked in benchmarks/device/results/, which
    # is not there, and ran with no plan without a word).
    monkeypatch.setattr(device_check, "run_row", stand_in_row)
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    out = tmp_path / "check.json"
    assert device_check.main(["--json", str(out), "--parts", "predict"]) == 0
    written = json.loads(out.read_text())
    assert os.path.abspath(written["plan_file"]) == os.path.join(REPOSITORY, "benchmarks", "results",
                                                                 "device_plan_h200x1.json")
    plan = json.loads(open(os.path.join(REPOSITORY, "benchmarks", "results", "device_plan_h200x1.json")).read())
    assert plan["target"] == "h200x1" and plan["compiler_versions"]["jax"]
    rows = [r for r in plan["rows"] if r["part"] == "train"]
    assert rows and all(r["device_terms"]["margin"] == 1.05 for r in rows if r.get("device_terms"))
