"""Target names, the hardware table, the GPU target descriptions and the compiler's out-of-memory message."""

import json
import re

import pytest

from trainer.plan import targets


@pytest.mark.parametrize("name, platform, kind, shape, device_count", [
    ("cpu", "cpu", "cpu", (), None),
    ("v4:2x2x1", "tpu", "v4", (2, 2, 1), 4),
    ("v5e:2x2", "tpu", "v5e", (2, 2), 4),
    ("V5E:4x4", "tpu", "v5e", (4, 4), 16),
    ("v5p:2x2x4", "tpu", "v5p", (2, 2, 4), 16),
    ("v6e:8x8", "tpu", "v6e", (8, 8), 64),
    ("tpu7x:2x2x1", "tpu", "tpu7x", (2, 2, 1), 8),  # two devices (TensorCores) per chip
    ("h100x8", "cuda", "h100", (8, 1), 8),
    ("h200x8", "cuda", "h200", (8, 1), 8),
    ("a100x8", "cuda", "a100", (8, 1), 8),
    ("b200x8", "cuda", "b200", (8, 1), 8),
    ("h100x8x2", "cuda", "h100", (8, 2), 16),
])
def test_names_parse(name, platform, kind, shape, device_count):
    target = targets.parse(name)
    assert (target.platform, target.kind, target.shape, target.device_count) == (platform, kind, shape, device_count)


@pytest.mark.parametrize("name, says", [
    ("v5e:2x2x1", "a v5e topology has 2 dimensions"),
    ("v4:2x2", "a v4 topology has 3 dimensions"),
    ("v5p:0x2x2", "at least 1 chip"),
    ("h100x16", "1 to 8 h100 GPUs"),
    ("h100x0", "1 to 8 h100 GPUs"),
    ("v7:2x2", "is not known; use cpu; a TPU slice"),
    ("rtx4090x2", "is not known"),
    ("tpu", "is not known"),
    ("", "is not known"),
])
def test_bad_names_are_one_sentence(name, says):
    with pytest.raises(ValueError, match=re.escape(says)) as raised:
        targets.parse(name)
    assert "\n" not in str(raised.value) and str(raised.value).endswith(".")


def test_every_target_has_figures_with_a_source_and_every_gpu_a_target_description():
    kinds = [*targets.TPU_GENERATIONS, *targets.GPU_MODELS]
    assert sorted(json.loads((targets.HERE / "hardware.json").read_text())["devices"]) == sorted(kinds)
    for kind in kinds:
        figures = targets.hardware(kind)
        assert figures["memory_bytes"] > 2**30 and figures["peak_bf16_flops"] > 1e14 and figures["hbm_bytes_per_s"] > 1e11
        assert figures["sources"] and all("https://" in source for source in figures["sources"])
        if figures["platform"] == "tpu":  # what the compiler offers is a little below the chip's capacity
            assert 0.95 * figures["memory_bytes"] < figures["tpu_compiler_hbm_bytes"] < 1.02 * figures["memory_bytes"]
    for model in targets.GPU_MODELS:
        text = (targets.GPU_SPECS / f"{model}.txtpb").read_text()
        assert "without cuDNN workspace" in text and 'platform_name: "CUDA"' in text
        size = int(re.search(r"device_memory_size: (\d+)", text)[1])
        assert size == targets.hardware(model)["memory_bytes"]
        assert f'device_description_str: "{targets.hardware(model)["device_kind"]}"' in text


def test_memory_per_device_is_the_compilers_on_tpus_and_the_allocators_share_of_the_datasheets_on_gpus():
    assert targets.memory_per_device(targets.parse("v5e:2x2")) == round(15.75 * 2**30)
    # JAX's allocator may take 95 % of a GPU as fullres runs it (its own default, 75 %, is overridden at start).
    assert targets.memory_per_device(targets.parse("h100x8")) == int(80 * 2**30 * 0.95)
    assert targets.memory_per_device(targets.parse("cpu")) is None


@pytest.mark.parametrize("message, sizes", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (17.25G) exceeds "
     "available HBM (15.75G).", (round(17.25 * 2**30), round(15.75 * 2**30))),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 21.84G of "
     "15.75G hbm. Exceeded hbm capacity by 6.09G.", (round(21.84 * 2**30), round(15.75 * 2**30))),
    ("RESOURCE_EXHAUSTED: ... HLO temporaries (512.5M) exceeds available HBM (95.74G)",
     (round(512.5 * 2**20), round(95.74 * 2**30))),
    ("INVALID_ARGUMENT: Topology layout is not divisible", None),
    ("RESOURCE_EXHAUSTED: too many open files", None),
])
def test_out_of_memory_message(message, sizes):
    assert targets.out_of_memory(message) == sizes
