"""benchmarks/peer/peer_bench.py: the same networks under PyTorch and fullres, side by side.

Fast: the JSON's ratios are the rows' own figures divided, candidates by name run their bfloat16 rows first, and the
the demo's and the image's locks hold no PyTorch. Slow (each imports torch, or traces a step): the PyTorch side's loss is fullres's own
(same logits, same labels: the same number), PlainConvUNet and MONAI's UNet are the zoo's ports weight for weight
(every weight's shape, as a multiset), a fullres row compiles with its candidate's XLA options, and the whole
command at tiny sizes on the CPU, every row in its own process, as the device runs it: what each row measured, a
PyTorch row's peak from its process, a measure row's choice per layer kind, and the ratios.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import files

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPOSITORY, "benchmarks")  # peer/ and device/ below it


def load(name: str):
    folder = "device" if name.startswith("device_") else "peer"
    # The scripts import one another as the command runs them.
    return files.load_script("benchmarks", folder, f"{name}.py", with_its_folder=True)


def test_the_test_environment_has_pytorch_and_neither_the_demo_nor_the_image_does():
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` names itself in UV
    assert uv, "uv is not on PATH; run the tests with `python3 -m uv run pytest`"

    def locked(*groups):
        exported = subprocess.run([uv, "export", "--locked", "--no-hashes", "--no-emit-project", "--quiet", *groups],
                                  capture_output=True, text=True, cwd=REPOSITORY, timeout=120)
        assert exported.returncode == 0, exported.stderr
        return set(re.findall(r"^([a-z0-9][a-z0-9._-]*)==", exported.stdout, flags=re.M))

    peer = {"torch", "monai", "dynamic-network-architectures"}
    assert peer <= locked("--group", "peer")  # the README's test command adds the group
    heavy = peer | {"triton"}  # with the nvidia-* wheels: PyTorch's CUDA build, 5.3 GB
    for environment in (locked(), locked("--no-dev")):  # the demo's `uv run --locked` (default groups); the image's
        assert not heavy & environment and not any(name.startswith("nvidia-") for name in environment)


@pytest.mark.slow  # `import torch` in the test's process: 9.8 s on the loaded machine (fast tier: 2026-11-28)
@pytest.mark.parametrize("balance", [0.0, 0.5])
def test_the_pytorch_loss_is_fullres_loss_on_the_same_logits(balance):
    import torch

    from trainer.models import losses

    peer_torch = load("peer_torch")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 6, 5, 4, 3)).astype(np.float32) * 3  # (B, D, H, W, C)
    labels = rng.integers(0, 3, size=(2, 6, 5, 4)).astype(np.int32)
    labels[1] = np.minimum(labels[1], 1)  # a class absent from one example: its Dice and weight cases
    expected = float(losses.dice_cross_entropy(jax.numpy.asarray(logits), labels, class_balance=balance))
    got = float(peer_torch.dice_cross_entropy(torch.from_numpy(np.moveaxis(logits, -1, 1).copy()),
                                              torch.from_numpy(labels), balance))
    assert got == pytest.approx(expected, rel=1e-6)


SHAPES = """
import json, os, sys
sys.path.insert(0, {repository!r}); sys.path.insert(0, {benchmarks!r} + "/peer")
import numpy as np
import trainer
import torch
import peer_torch
from trainer.models import user_model
net = peer_torch.network({network!r}, tiny=True)
net(torch.zeros((1, 1, 16, 16, 16))).sum().backward()  # the weights a step trains (PlainConvUNet holds unused ones)
function = user_model.load_function(os.path.join({repository!r}, peer_torch.ZOO[{network!r}]), "tiny")
print("SHAPES " + json.dumps({{"torch": [list(p.shape) for p in net.parameters() if p.grad is not None],
    "keras": [list(v.shape) for v in function(num_classes=3, in_channels=1).trainable_weights],
    "used": peer_torch.used_parameters(net)}}))
"""


def in_own_process(code: str) -> str:
    """Runs `code` in a fresh Python: torch.compile's machinery (triton, imported by torch.optim and monai) aborted
    a test worker whose process held the fast tier's other libraries."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPOSITORY)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


# A process importing torch (and monai: 8-29 s, its whole package, TensorFlow's among its optional ones) and fullres:
# 14 s for nnunet_plain on the loaded machine: slow.
@pytest.mark.slow
@pytest.mark.parametrize("network", ["nnunet_plain", "monai_unet"])
def test_the_pytorch_network_and_the_zoo_port_hold_the_same_weights(network):
    output = in_own_process(SHAPES.format(repository=REPOSITORY, benchmarks=BENCHMARKS, network=network))
    found = json.loads(next(line for line in output.splitlines() if line.startswith("SHAPES "))[7:])

    def dimensions(shape):  # torch (O, I, k, k, k) and Keras (k, k, k, I, O) kernels; a PReLU's (1,) and (1, 1, 1, 1)
        return tuple(sorted(int(d) for d in shape if d != 1))

    torch_shapes = sorted(dimensions(shape) for shape in found["torch"])
    keras_shapes = sorted(dimensions(shape) for shape in found["keras"])
    assert torch_shapes == keras_shapes and len(torch_shapes) > 10
    assert found["used"] == sum(int(np.prod(shape)) for shape in keras_shapes)


def test_the_ratios_are_the_rows_own_figures_divided():
    peer_bench = load("peer_bench")
    rows = []
    for name, seconds, peak in (("torch eager float32", 0.104, 10.2e9), ("fullres float32", 0.292, 10.8e9),
                                ("torch eager bfloat16", 0.077, 5.6e9), ("fullres bfloat16", 0.586, 7.8e9),
                                ("torch nnunet float16", 0.050, 5.0e9)):
        side = name.split()[0]
        rows.append({"network": "nnunet_plain", "side": side, "name": name, "sets": [], "status": "ok",
                     "median_step_seconds": seconds, "peak_bytes": peak})
    rows.append({**rows[1], "name": "fullres float32 [kernels.norm=fused]", "sets": ["kernels.norm=fused"],
                 "median_step_seconds": 0.05})
    found = {(tuple(r["candidate"]), r["goal"]): r for r in peer_bench.ratios(rows)}
    assert found[((), "fullres float32 ÷ torch eager float32")]["step_time"] == round(0.292 / 0.104, 4)
    assert found[((), "fullres bfloat16 ÷ fullres float32")]["memory"] == round(7.8 / 10.8, 4)
    best = found[((), "fullres best ÷ torch.compile float16 (nnU-Net's default)")]
    assert best["numerator"] == "fullres float32" and best["met"] is False  # 0.292 / 0.050, bfloat16 slower
    fused = found[(("kernels.norm=fused",), "fullres best ÷ torch.compile float16 (nnU-Net's default)")]
    assert fused["step_time"] == 1.0 and fused["met"] is True
    assert ((("kernels.norm=fused",), "fullres bfloat16 ÷ fullres float32")) not in found  # no bfloat16 row of it


@pytest.mark.slow
def test_the_cpu_run_at_tiny_sizes_writes_every_row_with_why_where_one_cannot_run(tmp_path):
    output = tmp_path / "peer.json"
    user_cache = tmp_path / "user-cache"  # the user's own kernel choices would be written below it
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "peer", "peer_bench.py"), "--tiny", "--json",
                             str(output), "--networks", "nnunet_plain", "--limit", "1800"],
                            capture_output=True, text=True, timeout=1900, cwd=REPOSITORY,
                            env={**os.environ, "XDG_CACHE_HOME": str(user_cache),
                                 # The rows' compiles from the suite's compilation cache (the command's own default,
                                 # no cache, is for a device's compile seconds): 4 fullres rows, 2 programs.
                                 "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads(output.read_text())
    rows = {r["name"]: r for r in written["rows"]}
    for name in ("torch eager float32", "fullres float32", "torch eager bfloat16", "fullres bfloat16"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["median_step_seconds"] > 0 and np.isfinite(rows[name]["loss"]) and rows[name]["peak_bytes"]
    assert rows["fullres float32"]["compile_seconds"] > 0 and rows["fullres float32"]["device_compiler"]["total_bytes"]
    assert rows["torch nnunet float16"]["status"] == "not_run" and "CUDA" in rows["torch nnunet float16"]["error"]
    torch_row = rows["torch eager float32"]  # PyTorch's side: its peak from the process's RSS, its settings
    assert torch_row["steps"] == 3 and "RSS" in torch_row["peak_bytes_source"] and torch_row["class_balance"] == 0.5
    assert torch_row["versions"]["torch"]
    peer_bench = load("peer_bench")
    for precision in ("float32", "bfloat16"):
        # A measure row goes through the choice `fullres train` makes, here with no time to time candidates: every
        # layer keeps the fixed kernels, and no second compile of the step (tests/trainer/parallel/test_kernel_choice.py
        # and test_kernel_choice_run.py time them).
        measured = rows[f"fullres {precision} [{' '.join(peer_bench_sets())}]"]
        assert measured["status"] == "ok" and measured["median_step_seconds"] > 0, measured
        chosen = measured["kernel_choice"]
        assert chosen["seconds"] > 0 and chosen["measurements"] == 0 and chosen["step"]["kept"] == "fixed"
        assert set(chosen["by_kind"]) == {"convolution", "transposed convolution", "normalization"}
        assert all(set(counts) == {"fixed"} for counts in chosen["by_kind"].values())
        assert chosen["not_reached"] == sum(sum(counts.values()) for counts in chosen["by_kind"].values())
        assert len(chosen["log"]) == 1 and chosen["log"][0].startswith("kernels: ") and "not reached" in chosen["log"][0]
        status = peer_bench.table({"rows": [measured], "ratios": []}).splitlines()[2]
        assert f"measured in {chosen['seconds']:.0f} s: convolution " in status
    assert not (user_cache / "fullres" / "kernels" / "choices.json").exists()  # the command's own cache, not the user's
    # A candidate fullres refuses is refused before any row (test_benchmark_arguments.py), not listed as not run.
    assert rows["torch eager float32"]["parameters"] == rows["fullres float32"]["parameters"]
    # One ratio per goal and candidate set: today's rows (no set), then the measure rows' own.
    goals = {(r["goal"], tuple(r["candidate"])): r for r in written["ratios"]}
    measure = f"fullres float32 [{' '.join(peer_bench_sets())}]"
    for sets, row in (((), "fullres float32"), (tuple(rows[measure]["sets"]), measure)):
        assert goals[("fullres float32 ÷ torch eager float32", sets)]["step_time"] == round(
            rows[row]["median_step_seconds"] / rows["torch eager float32"]["median_step_seconds"], 4)


def peer_bench_sets():
    peer_bench = load("peer_bench")
    return peer_bench.measure_sets(peer_bench.TINY["measure_seconds"])


def test_candidates_by_name_run_every_bfloat16_row_before_the_float32_ones(tmp_path):
    peer_bench = load("peer_bench")
    zoo_kernels = load("zoo_kernels")
    sets = [s for _, s in zoo_kernels.candidate_sets("taps,all")]
    assert sets[1] == ["kernels.conv_weight_grad=taps", "kernels.conv_transpose=subpixel", "kernels.norm=fused",
                       "kernels.xla_flags=conv_nhwc"]
    rows = peer_bench.planned_rows(["nnunet_plain"], sets)
    measure = " ".join(peer_bench.MEASURE)  # right after the baseline rows: the choice measured on the device
    assert [r["name"] for r in rows[5:7]] == [f"fullres bfloat16 [{measure}]", f"fullres float32 [{measure}]"]
    assert rows[5]["sets"][0] == "kernels.choose=measure"
    assert [r["name"] for r in rows[7:]] == [
        "fullres bfloat16 [kernels.conv_weight_grad=taps]", f"fullres bfloat16 [{' '.join(sets[1])}]",
        "fullres float32 [kernels.conv_weight_grad=taps]", f"fullres float32 [{' '.join(sets[1])}]"]
    output = tmp_path / "peer.json"
    with pytest.raises(SystemExit):  # an unknown name: refused before any row runs, nothing written
        peer_bench.main(["--json", str(output), "--candidates", "taps,no_such"])
    assert not output.exists()


@pytest.mark.slow  # a tiny PlainConvUNet's step traced and lowered: 5.7 s on the loaded machine
def test_a_fullres_row_compiles_with_the_candidates_xla_flags(monkeypatch):
    """peer_rows' fullres step compiles through `jit_step`'s `compiler_options`: a flag set naming an option XLA does
    not have is refused by the row's compile (the same set under its real options compiles)."""
    from trainer.parallel import kernels

    peer_rows = load("peer_rows")
    device_check_rows = load("device_check_rows")
    row = {"network": "nnunet_plain", "tiny": True, "precision": "float32", "batch_size": 1,
           "sets": ["kernels.xla_flags=conv_nhwc"]}
    monkeypatch.chdir(REPOSITORY)
    monkeypatch.setitem(kernels.FLAG_SETS, "conv_nhwc", {"xla_no_such_option_of_fullres": True})
    step = device_check_rows.Step(row, peer_rows.fullres_config(row))
    with pytest.raises(Exception, match="xla_no_such_option_of_fullres"):
        step.compile(16)


def test_a_command_stopped_between_rows_keeps_what_it_measured(tmp_path, monkeypatch):
    peer_bench = load("peer_bench")
    ran = []

    def run_row(spec, limit):
        if len(ran) == 2:
            raise KeyboardInterrupt  # the device call's own limit, from outside
        ran.append(spec["name"])
        return {"status": "ok", "median_step_seconds": 0.1 * len(ran), "peak_bytes": 1}

    monkeypatch.setattr(peer_bench, "run_row", run_row)
    monkeypatch.setattr(peer_bench.peer_checks, "candidate_problem", lambda rows: None)  # its own process: slow
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    output = tmp_path / "peer.json"
    with pytest.raises(KeyboardInterrupt):
        peer_bench.main(["--json", str(output), "--networks", "nnunet_plain", "--candidates", "fused"])
    written = json.loads(output.read_text())
    assert [r["status"] for r in written["rows"]] == ["ok", "ok"] + ["not_run"] * 7
    assert "stopped before this row" in written["rows"][-1]["error"]
    assert written["rows"][-1]["name"] == "fullres float32 [kernels.norm=fused]"
    assert written["ratios"][0]["step_time"] == 2.0  # fullres float32 ÷ torch eager float32, the two that ran
    # The GPU rows shared one autotuning folder, named in the JSON, removed after; the caller's XLA_FLAGS are back.
    folder = written["xla_flags"].split("--xla_gpu_per_fusion_autotune_cache_dir=")[1]
    assert written["xla_flags"].startswith("--xla_dump_to=/nowhere ") and not os.path.exists(folder)
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/nowhere"


def test_the_one_gpu_call_in_the_docs_runs_the_measured_choice_and_the_candidates_in_both_precisions(tmp_path,
                                                                                                   monkeypatch):
    """docs/device-check.md's one call: its peer_bench arguments parse and plan PlainConvUNet's and MONAI's five
    rows, the two measured ones right after them, and the candidate `all` (taps, subpixel, fused, conv_nhwc
    together), each in bfloat16 and float32."""
    import shlex

    peer_bench = load("peer_bench")
    with open(os.path.join(REPOSITORY, "docs", "device-check.md"), encoding="utf-8") as file:
        line = next(text for text in file if "python3 benchmarks/peer/peer_bench.py --json $OUT/peer_bench.json" in text)
    arguments = shlex.split(line.split("benchmarks/peer/peer_bench.py", 1)[1].split("2>&1")[0].replace("$OUT", str(tmp_path)))
    monkeypatch.setattr(peer_bench, "run_row", lambda spec, limit: {"status": "not_run", "error": "not here"})
    checked = []  # the candidates' settings are checked in a process of their own (test_benchmark_arguments.py)
    monkeypatch.setattr(peer_bench.peer_checks, "candidate_problem", lambda rows: checked.extend(rows))
    assert peer_bench.main(arguments) == 0
    assert len(checked) == 2 * 2 and all(len(row["sets"]) == 4 for row in checked)  # the candidate's rows, first
    written = json.loads((tmp_path / "peer_bench.json").read_text())
    assert written["candidates"] == [[
        "kernels.conv_weight_grad=taps", "kernels.conv_transpose=subpixel", "kernels.norm=fused",
        "kernels.xla_flags=conv_nhwc"]]
    assert len(written["rows"]) == 2 * (5 + 2 + 2) and written["limit_seconds"] <= 400
    assert [r["sets"][0] for r in written["rows"][5:7]] == ["kernels.choose=measure"] * 2
