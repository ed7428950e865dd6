"""`benchmarks/device/device_plan.py` finds each row's largest cube with `fullres plan --largest`'s search: with a
fake plan whose bytes grow with the voxels, the points it saves hold the edge (the largest cube 32 apart that fits
and the next that does not), in fewer plans than a walk 32 at a time."""

from tests import files

LIMIT = 20 * 2**30


def _load():
    return files.load_script("benchmarks", "device", "device_plan.py")


def test_the_largest_cube_is_found_by_the_products_search_and_every_point_saved(monkeypatch):
    device_plan = _load()
    planned = []

    def plan_point(row, size, target):
        planned.append(size)
        total = 2**30 + 40 * size**3
        return {**row, "size": size, "total_bytes": total, "fits": total <= LIMIT, "target_fits": total <= LIMIT,
                "step_seconds": 0.1}

    monkeypatch.setattr(device_plan, "plan_point", plan_point)
    saved = []
    first = {"size": 128, "argument_bytes": 2**30, "temp_bytes": 40 * 128**3}
    device_plan.largest({"part": "train"}, first, [], "h100x1", saved.append, start=256)
    edge = max(side for side in range(32, 1025, 32) if 2**30 + 40 * side**3 <= LIMIT)
    by_size = {p["size"]: p for p in saved}
    assert by_size[edge]["target_fits"] and not by_size[edge + 32]["target_fits"]
    assert len(planned) < (edge - 256) // 32 + 2 and len(planned) == len(set(planned))  # bisected, none twice
