"""`fullres plan --largest` and `fullres plan --target GENERATION` as a user types them: what is refused (one
sentence, before anything is compiled), and the CPU answer of --largest without a --target."""

import json

import pytest
from typer.testing import CliRunner

from pipelines import cli
from trainer.plan import smallest_slice


@pytest.mark.parametrize("arguments, sentence", [
    (["--target", "v9z", "--image-size", "512,512,1024"],
     "--target 'v9z' is not a generation fullres knows; name one (v4, v5e, v5p, v6e, tpu7x, a100, h100, h200, b200) "
     "to find its smallest slice, or a whole target: "),
    (["--largest", "--image-size", "16,16,16"],
     "--largest without a --target sizes on this machine's CPU and needs the memory of one device to search "
     "against, e.g. --device-memory 16GiB (or give --target v5e:2x2)."),
    (["--largest", "--target", "v5e", "--image-size", "16,16,16"],
     "--largest needs a whole target, e.g. --target v5e:16x16; --target v5e alone finds the smallest v5e slice for "
     "--image-size."),
    (["--target", "h100"], "--target h100 finds the smallest h100 slice that trains a volume whole; give the volume, "
                           "e.g. --image-size 512,512,1024."),
    (["--largest", "--target", "h100x1", "--max-seconds", "0"], "--max-seconds 0 must be more than 0"),
])
def test_what_to_rent_refuses_bad_requests_in_one_sentence(arguments, sentence):
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", *arguments])
    assert result.exit_code == 2, result.output
    assert f"fullres: error: {sentence}" in result.output
    assert "Traceback" not in result.output and result.output.count("fullres: error:") == 1


def test_a_generation_is_told_from_a_whole_target():
    assert [smallest_slice.generation(name) for name in ("v5p", "h200", "v5p:4x4x4", "h100x8x2", "cpu")] == \
        ["v5p", "h200", None, None, None]
    assert [t.device_count for t in smallest_slice.slices("v5e")] == [1, 4, 8, 16, 32, 64, 128, 256]


@pytest.mark.slow
def test_largest_without_a_target_answers_on_the_cpu_against_the_memory_given():
    result = CliRunner().invoke(cli.app, ["plan", "--preset", "smoke", "--image-size", "16,16,16", "--largest",
                                          "depth", "--device-memory", "4MiB", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout[result.stdout.index("{"):])
    assert found["target"] == "cpu" and found["axes"] == ["depth"] and found["not_searched"] is None
    best, miss = found["largest"], found["next_searched"]
    assert best["size"][1:] == [16, 16] and best["row"]["total_bytes"] <= 4 * 2**20 < miss["row"]["total_bytes"]
    assert miss["size"][0] == best["size"][0] + found["multiple"]  # the edge, one multiple apart


def test_a_step_time_the_tpu_compiler_gives_as_negative_gives_way_to_the_roofline():
    """libtpu 0.0.42.1's optimal_seconds for 1024³ over v5e:16x16 was -83.8 s: not a time to show a user."""
    import types

    from trainer.plan import rent

    estimate = {"seconds": 0.52, "bound": "memory"}
    negative = types.SimpleNamespace(compiler_seconds=-83.8, estimate=estimate)
    assert rent.step_time(negative) == {
        "seconds": 0.52, "source": "roofline (memory-bound); the TPU compiler's optimal_seconds, -83.8 s, is no time"}
    assert rent.step_time(types.SimpleNamespace(compiler_seconds=0.4, estimate=estimate))["seconds"] == 0.4
    assert rent.step_time(types.SimpleNamespace(compiler_seconds=None, estimate=estimate))["source"] == \
        "roofline (memory-bound)"
