"""`fullres plan --largest`'s search without a compiler: the edge found by bisection over the sizes the network
takes, with a fake compiler whose bytes grow with the voxels, and the sizes themselves."""

import math
import time

import pytest

from trainer.plan import compiled_step, edge_search, largest_volume, plan_row

MEMORY = 16 * 2**30
ARGUMENTS = 300 * 2**20


def _fake_compiler(asked: list):
    """A probe whose per-device bytes are arguments + 12 bytes per voxel over 1000 (1104³ fits 16 GiB, 1120³ not)."""
    def probe(size):
        asked.append(size)
        total = ARGUMENTS + 12 * 1024 * math.prod(size) // 1000
        row = plan_row.PlanRow(8, (1, 2, 2, 2, 1), total - ARGUMENTS, ARGUMENTS, total, None, 0, 0, total <= MEMORY)
        return largest_volume.Point(tuple(size), total <= MEMORY, row, why="" if total <= MEMORY else "needs more")
    return probe


def _fits(side: int) -> bool:
    return ARGUMENTS + 12 * 1024 * side ** 3 // 1000 <= MEMORY


def test_the_bisection_finds_the_known_edge_in_few_compiles_at_sizes_the_network_takes():
    config = compiled_step.plan_config("unet3d", "default", {"model.num_levels": 5, "model.stem": "none"})
    levels = config.model.downsampling_levels
    assert levels == 4
    sizes = largest_volume.sizes_taken(config, (128, 128, 128), (0, 1, 2), 8, 1, limit=2048)
    asked: list = []
    found = largest_volume.search(_fake_compiler(asked), sizes, (0, 1, 2), (128, 128, 128), MEMORY, 900,
                                  time.perf_counter())
    sides = [size[0] for size in sizes]
    edge = max(side for side in sides if _fits(side))
    assert found.best.size == (edge,) * 3 and found.miss.size == (sides[sides.index(edge) + 1],) * 3
    # 1104 fits and halves 4 times, but no split of 8 devices divides it at every level: never asked
    assert _fits(1104) and edge == 1088 and (1104,) * 3 not in sizes
    assert found.unsearched is None and len(asked) <= 8  # the scaled guess, then a few steps: not a walk
    assert all(side % 2 ** levels == 0 for size in asked for side in size)  # only sizes the network takes
    assert set(asked) <= set(sizes)


def test_a_network_that_halves_four_times_is_searched_only_at_multiples_of_sixteen_that_eight_devices_divide():
    config = compiled_step.plan_config("unet3d", "default", {"model.num_levels": 5, "model.stem": "none"})
    grown = largest_volume.sizes_taken(config, (64, 512, 512), (0,), 8, 1, limit=256)
    assert [size[0] for size in grown] == list(range(16, 257, 16))  # 8 devices split H and W: every depth divides
    assert all(size[1:] == (512, 512) for size in grown)  # --largest depth keeps height and width
    assert largest_volume.sizes_taken(config, (16, 16, 16), (0, 1, 2), 4096, 1, limit=32) == []


def test_a_size_the_time_did_not_reach_is_said_as_not_searched_never_as_not_fitting():
    answers = {0: True, 1: True}

    def probe(index):
        return answers.get(index)  # from index 2 on the time has run out: None

    edge = edge_search.find_edge(10, probe, lambda answer: answer, start=0)
    assert edge.last_fit == 1 and edge.first_miss is None
    assert edge.unsearched == tuple(range(2, 10))


@pytest.mark.parametrize("text, axes", [("cube", (0, 1, 2)), ("depth", (0,)), ("width,depth", (0, 2))])
def test_largest_names_the_axes_that_grow(text, axes):
    assert largest_volume.parse_axes(text, 3) == axes


def test_an_axis_a_volume_does_not_have_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"^--largest time: time is no axis of a 3-D input; name the axes that grow "
                                         r"\(depth, height, width\), e.g. --largest depth, or --largest cube\.$"):
        largest_volume.parse_axes("time", 3)
