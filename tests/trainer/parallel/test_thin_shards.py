"""XLA's wrong gradient where a window reaches across a whole shard with two axes split: still there, and refused.

The first test proves the bug in the JAX fullres runs on (pure JAX, `benchmarks/partitioning/gspmd_min_voxels.py`): when a
JAX release fixes it, that test fails, and `trainer/parallel/thin_shards.py` (and these tests) can go. The others
check the refusal as a user meets it: `fullres plan` (the CLI and `fullres.plan`) refuses the split in one sentence
naming the layer, the axis, its voxels per device and the fix, and compiles the safe neighbour.
"""

import os

import pytest
from typer.testing import CliRunner

from tests import files
from trainer.parallel import halo, partitioning, thin_shards

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NETWORKS = os.path.join(REPOSITORY, "tests", "trainer", "user_networks.py")
WIDE = f"{NETWORKS}:wide_kernels"


def _mapper():
    return files.load_script("benchmarks", "partitioning", "gspmd_min_voxels.py")


@pytest.mark.parametrize("shape, parts, layers, wrong", [
    ((8, 4, 4), (2, 2, 1), [(3, 2), (3, 1)], True),  # docs/zoo.md's case: 1 voxel a device along height
    ((8, 4, 4), (2, 2, 1), [(5, 1), (5, 1)], True),  # 2 voxels a device, a 5-wide window
    ((8, 4, 4), (1, 2, 1), [(3, 2), (3, 1)], False),  # one split axis, 1 voxel a device: right
    ((8, 8, 4), (2, 2, 1), [(3, 2), (3, 1)], False),  # 2 voxels a device, a 3-wide window: right
], ids=["zoo-case", "kernel-5", "one-axis", "two-voxels"])
def test_xla_still_computes_the_wrong_gradient_that_thin_shards_refuses(shape, parts, layers, wrong):
    """If the wrong cases come out right, JAX fixed the bug: drop `thin_shards` and say so in docs/zoo.md."""
    worst, _ = _mapper().worst_gradient_error(shape, parts, layers)
    assert (worst > 0.5) if wrong else (worst < 1e-5), worst


def _window(in_spatial, kernel, stride=1, layer="net/conv"):
    low = [(k - 1) // 2 if s == 1 else 0 for k, s in zip(kernel, stride if isinstance(stride, tuple) else
                                                            (stride,) * len(kernel))]
    strides = (stride,) * len(kernel)
    out = tuple(-(-n // s) for n, s in zip(in_spatial, strides))
    high = tuple(max(0, (o - 1) * s + k - n - lo) for o, s, k, n, lo in zip(out, strides, kernel, in_spatial, low))
    return halo.Window(batch=1, in_spatial=tuple(in_spatial), out_spatial=out, in_channels=2, out_channels=2,
                       window=tuple(kernel), strides=strides, low=tuple(low), itemsize=4, needs_gradient=True,
                       high=high, layer=layer)


@pytest.mark.parametrize("windows, dims, refused", [
    ([_window((8, 4, 4), (3, 3, 3), 2), _window((4, 2, 2), (3, 3, 3))], (1, 2, 2, 1, 1), True),
    ([_window((8, 4, 4), (5, 5, 5)), _window((8, 4, 4), (5, 5, 5))], (1, 2, 2, 1, 1), True),
    ([_window((8, 4, 4), (3, 3, 3), 2), _window((4, 2, 2), (3, 3, 3))], (1, 1, 2, 1, 1), False),  # one axis
    ([_window((8, 4, 4), (3, 3, 3), 2), _window((4, 2, 2), (3, 3, 3))], (1, 4, 1, 1, 1), False),
    ([_window((8, 8, 4), (3, 3, 3), 2), _window((4, 4, 2), (3, 3, 3))], (1, 2, 2, 1, 1), False),  # 2 > 1
    ([_window((8, 4, 4), (3, 3, 3), 2), _window((4, 2, 2), (1, 1, 1))], (1, 2, 2, 1, 1), False),  # 1×1×1 reaches 0
    ([_window((16, 4), (5, 5)), _window((16, 4), (5, 5))], (1, 2, 2, 1), True),  # 2D images too
], ids=["zoo-case", "kernel-5", "height-only", "depth-4-way", "two-voxels", "pointwise", "2d"])
def test_the_rule_refuses_a_window_that_reaches_across_its_shard_with_two_axes_split(windows, dims, refused):
    assert bool(thin_shards.thin(windows, dims)) is refused


def test_the_sentence_names_the_layer_the_axis_the_voxels_and_the_fix():
    windows = [_window((8, 4, 4), (3, 3, 3), 2, "down"), _window((4, 2, 2), (3, 3, 3), 1, "deep")]
    with pytest.raises(partitioning.PartitionError) as raised:
        thin_shards.check(windows, (1, 2, 2, 1, 1), (1, 8, 4, 4, 1))
    assert str(raised.value) == (
        "input_partition_dims [1, 2, 2, 1, 1] leaves layer 'deep' (a 3×3×3 window over 4×2×2 voxels) 1 voxel per "
        "device along height, no more than the 1 its window reaches past them, where XLA (jax 0.10.2) silently "
        "computes wrong gradients once two or more axes are split; give height 8 or more (a larger --patch-size, or "
        "larger volumes), split height in fewer parts, or split one axis only.")


@pytest.mark.slow  # compiles the neighbour's training step (about 6 s alone, more on a loaded host)
def test_fullres_plan_refuses_the_split_from_the_users_network_and_plans_its_neighbour():
    """Through the CLI as a user meets it: two 5×5×5 convolutions, (8, 4, 4) split 2×2 (2 voxels a device along
    height, which the divisibility check lets through) is refused; split along depth alone it is planned."""
    from pipelines import cli

    def plan(dims):
        return CliRunner().invoke(cli.app, ["plan", "--model", WIDE, "--image-size", "8,4,4",
                                            "--input-partition-dims", dims, "--json"])

    refused = plan("1,2,2,1,1")
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.strip().startswith(
        "fullres: error: input_partition_dims [1, 2, 2, 1, 1] leaves layer 'wide_first' (a 5×5×5 window over "
        "8×4×4 voxels) 2 voxels per device along height, no more than the 2 its window reaches past them")
    assert "give height 8 or more" in refused.stderr
    accepted = plan("1,2,1,1,1")
    assert accepted.exit_code == 0, accepted.output


def test_the_api_plan_refuses_it_too():
    import fullres
    from tests.trainer import user_networks

    with pytest.raises(partitioning.PartitionError, match="leaves layer 'wide_first' .* along height"):
        fullres.plan(user_networks.wide_kernels, (8, 4, 4), layouts=(1, 2, 2, 1, 1))


def test_a_plan_of_all_layouts_says_why_each_was_pruned():
    """`fullres plan --layouts all` listed the refused 2×2 splits of (8, 4, 4) under 'they cannot divide at some
    resolution level', which they do: the plan now gives each pruned layout its own reason."""
    from trainer import config_resolution
    from trainer.plan import layout_search

    config = config_resolution.resolve("segmentation", "smoke", model_source=WIDE)
    shape = (8, 4, 4, 1)
    kept, pruned = layout_search.prune(layout_search.layouts(4, 3), config, shape,
                                       layout_search.lazy_builder(config, shape))
    assert kept == [(1, 1, 1, 4, 1), (1, 1, 4, 1, 1), (1, 4, 1, 1, 1)]
    assert layout_search.pruned_line(pruned) == (
        "3 layout(s) pruned, XLA would compute their gradient wrongly (a window reaches across a whole shard with two "
        "or more axes split; docs/your-own-network.md): 1,1,2,2,1 1,2,1,2,1 1,2,2,1,1")
    cannot = [((1, 8, 1, 1, 1), "depth 8 (input_partition_dims[1] = 8) does not fit")]
    assert layout_search.pruned_line(cannot + pruned[:1], "; ") == (
        "1 layout(s) pruned, they cannot divide at some resolution level: 1,8,1,1,1; 1 layout(s) pruned, XLA would "
        "compute their gradient wrongly (a window reaches across a whole shard with two or more axes split; "
        "docs/your-own-network.md): 1,1,2,2,1")
