"""What docs/measurements.md says of each file in benchmarks/results/: `CATALOGUE`, read by measurements_index.py.

An entry names what the file measures, the command that wrote it, the page that explains it, and a function that
reads the file's headline figures from its parsed contents, so the index cannot say what the file does not.
"""

import dataclasses
from typing import Any, Callable, Optional

GB = 1e9
GIB = 2 ** 30
MIB = 2 ** 20


@dataclasses.dataclass(frozen=True)
class Entry:
    """What the index says of one result file.

    Attributes:
        what: what the file measures, in a few words.
        command: the command that wrote it.
        page: the docs page that explains it (a file name under docs/, with an anchor if one fits).
        headline: the file's figures in one cell, computed from its parsed contents.
        date: only for files that cannot hold a `date` field (a JSON list, JSON lines, a file keyed by network).
    """

    what: str
    command: str
    page: str
    headline: Callable[[Any], str]
    date: Optional[str] = None


def _by(rows, **match):
    return next(row for row in rows if all(row.get(key) == value for key, value in match.items()))


def _context(data):
    summary = data["summary"]
    return (f"look-alike Dice, whole 32³ {summary['context/whole']['look_alike_dice_mean']:.3f}, 24³ patches "
            f"{summary['context/patch24']['look_alike_dice_mean']:.3f}, 16³ patches "
            f"{summary['context/patch16']['look_alike_dice_mean']:.3f}; the demo's data, foreground Dice: whole "
            f"{summary['demo/whole']['dice_mean']:.3f}, 24³ patches {summary['demo/patch24']['dice_mean']:.3f} "
            f"({len(summary['context/whole']['seeds'])} seeds, {data['steps']} steps)")


def _device_plan(data):
    fitting = {}
    for row in data["rows"]:
        fits = row.get("target_fits", row.get("fits"))  # the target compiler's verdict where the plan skipped it
        if row["part"] == "train" and fits and row.get("augmentation") == "none" and row.get("model") == "default":
            fitting[row["precision"]] = max(fitting.get(row["precision"], 0), row["size"])
    train = _by(data["rows"], part="train", model="default", precision="float32", size=128)
    largest = ", ".join(f"{precision} {size}³" for precision, size in sorted(fitting.items()))
    return (f"default UNet 128³ float32 {train['total_bytes'] / GB:.2f} GB; the largest cube that fits one "
            f"device, no augmentation: {largest}")


def _hlo_kernels(data):
    compiled = [row for row in data["rows"] if not row.get("error")]
    failed = sorted({row["network"] for row in data["rows"] if row.get("error")})
    return (f"{len(compiled)} of {len(data['rows'])} network × precision steps compiled for {data['target']} "
            f"without a GPU; not compiled: {', '.join(failed) or 'none'}")


def _input_rate(data):
    cells = data["results"]["256"]
    rate = {name: cell["examples_per_second"] for name, cell in cells.items()}
    return (f"256³, examples/s on {data['machine']['cores']} cores: records {rate['whole, records, 2 cores']:.1f}, "
            f"cache {rate['whole, cache, 2 cores']:.1f}, one host's ¼ share {rate['share, records, 2 cores']:.1f}, "
            f"GZIP {rate['whole, GZIP records, 2 cores']:.1f}, tf.data {rate['whole, tf.data on the records, 2 cores']:.1f}")


def _int16(data):
    error, model = data["largest_error"], data["model"]
    return (f"largest error {error['demo window (-200, 300), HU']:.4f} HU (demo window), "
            f"{error['wide window (-1000, 1000), HU']:.3f} HU (wide); {model['voxels_changed']} of "
            f"{model['voxels']:,} predicted voxels changed")


def _kernel_hlo(data):
    base = _by(data["rows"], precision="bfloat16", candidate="xla")["bytes_per_device"]
    cells = [f"{row['candidate']} {row['bytes_per_device'] / base - 1:+.1%}"
             for row in data["rows"] if row["precision"] == "bfloat16" and row["candidate"] != "xla"]
    return f"bfloat16 bytes a device against XLA's ops ({base / MIB:.1f} MiB): " + ", ".join(cells)


def _kernel_candidates(data):
    cells = []
    for row in data["rows"]:
        if row["target"] == "h100x1" and row["sets"]:
            base = _by(data["rows"], target="h100x1", precision=row["precision"], sets=[])["temp_bytes"]
            cells.append(f"{row['precision']} {'+'.join(row['sets'])} {row['temp_bytes'] / base - 1:+.1%}")
    return "h100x1 temp bytes against XLA's ops: " + ", ".join(cells)


def _rent_grid(data):
    cells = []
    for row in data["rows"]:
        found = row["result"]
        if row["kind"] == "plan" and found.get("row"):
            cells.append(f"{'×'.join(map(str, row['size']))} {row['precision']} on {row['target']}: "
                         f"{'fits' if found['fits'] else 'does not fit'}, {found['row']['total_bytes'] / GIB:.1f} GiB")
    return "; ".join(cells) + f" ({len(data['rows'])} rows of the grid computed; compiler figures)"


def _layout_search(data):
    cells = []
    for search in data:
        best = search["best"]
        cells.append(f"{search['model']} {'×'.join(map(str, search['image_size']))} on {search['partitions']}: "
                     f"{','.join(map(str, best['input_partition_dims']))} ({best['total_bytes'] / GIB:.2f} GiB)")
    return "; ".join(cells)


def _memory_scaling(data):
    search = _by(data, model="unet3d", precision="float32", remat=False)
    first, last = search["rows"][0], search["rows"][-1]
    return (f"UNet 256³ float32 {first['total_bytes'] / GIB:.2f} GiB a device on 1, {last['total_bytes'] / GIB:.2f} "
            f"GiB on {last['partitions']} (E {last['efficiency']:.3f}); "
            f"{sum(row['activation_all_gathers'] for entry in data for row in entry['rows'])} activation all-gathers")


def _peer_bench(data):
    ok = sum(row["status"] == "ok" for row in data["rows"])
    return (f"{ok} of {len(data['rows'])} rows ran at {data['settings']['size']}³ on a CPU (shows the rows run, "
            f"not speed); networks: {', '.join(sorted(set(data['networks'])))}")


def _predict_whole(data):
    return (f"whole volume {data['speedup']:.1f}× faster than a sliding window; Dice {data['whole_dice']:.3f} "
            f"against {data['sliding_dice']:.3f} ({data['cases']} scans, {data['devices']})")


def _preprocess(data):
    best = max(data["results"], key=lambda row: row["speed_vs_plain_loop"])
    return (f"{best['mode']}: {best['cases_per_second']:.2f} cases/s, {best['speed_vs_plain_loop']:.2f}× a plain "
            f"loop ({data['cases']} cases of {'×'.join(map(str, data['shape']))})")


def _recipe_shift(data):
    rows = {(row["recipe"], row["deep_supervision"]): row["shifted"] for row in data["rows"]}
    return (f"shifted-scan Dice, {len(data['seeds'])} seeds: none {rows[('none', False)]:.3f}, flips "
            f"{rows[('flips', False)]:.3f}, nnunet {rows[('nnunet', False)]:.3f}, nnunet with deep supervision "
            f"{rows[('nnunet', True)]:.3f}")


def _seed_configs(rows):
    cells = [f"{row.get('unet', '')} {row['model']} {row['size'][0]}{'³' if len(row['size']) == 3 else '²'} "
             f"{row['dims']} on {row['target']}: {row['total_bytes'] / GIB:.2f} GiB".strip() for row in rows]
    return "; ".join(cells)


def _seed_sweep(data):
    cells = [f"{name.split('/')[0]}: median {entry['median']:.3f}, minimum {entry['minimum']:.3f}, "
             f"{entry['converged']} converged" for name, entry in sorted(data["summary"].items())]
    return "; ".join(cells)


def _target_memory(data):
    cells = []
    for target in ("cpu", "h100x8x2", "v5e:4x4"):
        row = next((row for row in data["rows"] if row["target"] == target and row["size"] == 256
                    and row["partitions"] == 16), None)
        if row:
            cells.append(f"{target} {row['total_bytes'] / GIB:.2f} GiB")
    return "plain UNet 256³ split 16 ways, a device: " + ", ".join(cells)


def _target_plans(data):
    unet = data["default_unet_128"]
    return (f"plain UNet 128³ 4-way on v5e:2x2: {unet['v5e']['total']} (compiled in {unet['compile_seconds']:.0f} s); "
            f"smoke UNet 256³ on v5e:2x2: {data['tiny_unet_256_refused']['row']}")


def _video_motion(data):
    mean = data["look_alike_dice_mean"]
    return f"look-alike Dice, whole clips {mean['whole_clip']:.3f} against per frame {mean['per_frame']:.3f}"


def _zoo(data):
    worst = max(split["gradient"] for network in data.values() for split in network["parity-float64"]["splits"]
                .values())
    gathers = sum(split["gathers"] for network in data.values() for split in network["parity"]["splits"].values())
    ratios = [network["memory"]["ratio"] for network in data.values()]
    return (f"{len(data)} networks split 2, 4 and 2×2: {gathers} activation all-gathers, float64 gradients within "
            f"{worst:.1e} of one device; memory at 4-way 128³ {min(ratios):.2f}–{max(ratios):.2f}× a quarter")


def _by_hand(data):
    pages = sorted({entry["page"].split("/")[-1] for entry in data["measurements"]})
    return f"{len(data['measurements'])} figures no script writes, each with its date and command; cited by " + \
        ", ".join(pages)


CATALOGUE = {
    "by_hand.json": Entry(
        "figures measured by hand (the demo, the suite's time, the H200 check, ...)", "each entry's `command`",
        "testing.md#how-long-it-takes-measured", _by_hand),
    "context_matters.json": Entry(
        "whole volumes against patches, where context decides", "`benchmarks/learning/context_matters.py`",
        "context.md", _context),
    "device_plan_h100x1.json": Entry(
        "the plan of every device-check row for one H100, without a GPU",
        "`benchmarks/device/device_plan.py --target h100x1`", "device-check.md", _device_plan),
    "device_plan_h200x1.json": Entry(
        "the plan of the device-check rows for one H200 (the device's bytes), without a GPU",
        "`benchmarks/device/device_plan.py --target h200x1 --models default --augmentations none`",
        "device-check.md", _device_plan),
    "hlo_kernels_h100x1.json": Entry(
        "how the GPU compiler runs each convolution of the zoo's networks",
        "`benchmarks/peer/zoo_kernels.py --target h100x1`", "speed.md", _hlo_kernels),
    "input_rate.json": Entry(
        "the rate of the training input path, whole examples and one host's share",
        "`benchmarks/input/input_rate.py --json benchmarks/results/input_rate.json`", "input.md", _input_rate),
    "int16_records.json": Entry(
        "what storing CT as int16 loses", "`benchmarks/input/int16_records.py --model RUN`",
        "preprocessing.md#data-format", _int16),
    "kernel_hlo.json": Entry(
        "the kernel candidates in the GPU compiler's program (PlainConvUNet 32³)",
        "`benchmarks/peer/zoo_kernels.py --candidates ...` (written by its predecessor)", "kernels.md", _kernel_hlo),
    "kernel_candidates.json": Entry(
        "the newer kernel candidates (float32 weight gradient, padded transpose) in the GPU compiler's program",
        "`benchmarks/peer/zoo_kernels.py --candidates xla,float32_grad,padded`", "kernels.md", _kernel_candidates),
    "rent_grid.json": Entry(
        "what to rent: the largest volume a slice trains whole, the smallest slice for a volume",
        "`benchmarks/partitioning/rent_grid.py`", "what-to-rent.md", _rent_grid),
    "layout_search.json": Entry(
        "the best-ranked split of each N against the 1-D split",
        "`benchmarks/partitioning/memory_scaling.py --layout-search ...`", "planning.md#how-to-split-measured",
        _layout_search, date="2026-11-22"),
    "memory_scaling.json": Entry(
        "per-device memory of the UNet at 256³ and RetinaNet at 2560², N = 1–16",
        "`benchmarks/partitioning/memory_scaling.py`", "planning.md#how-much-to-split-measured", _memory_scaling,
        date="2026-11-21"),
    "peer_bench_cpu_tiny.json": Entry(
        "PyTorch beside fullres, both networks, tiny sizes on the CPU", "`benchmarks/peer/peer_bench.py --tiny`",
        "speed.md", _peer_bench),
    "peer_bench_cpu_tiny_monai.json": Entry(
        "PyTorch beside fullres, MONAI's UNet, tiny sizes on the CPU",
        "`benchmarks/peer/peer_bench.py --tiny --networks monai_unet`", "speed.md", _peer_bench),
    "predict_whole_vs_sliding.json": Entry(
        "whole-volume prediction against a sliding window, an early demo model",
        "`benchmarks/learning/predict_whole_vs_sliding.py`", "predict.md#whole-volume-against-a-sliding-window",
        _predict_whole),
    "predict_whole_vs_sliding_demo.json": Entry(
        "whole-volume prediction against a sliding window, the demo's model",
        "`benchmarks/learning/predict_whole_vs_sliding.py`", "predict.md#whole-volume-against-a-sliding-window",
        _predict_whole),
    "preprocess_ct.json": Entry(
        "CT preprocessing throughput, Beam against a plain loop", "`benchmarks/input/preprocess_ct.py`",
        "preprocessing.md#throughput", _preprocess),
    "recipe_shift.json": Entry(
        "every augmentation recipe, with and without deep supervision, on shifted scans",
        "`benchmarks/learning/recipe_shift.py`", "recipe.md#measured-under-a-shift", _recipe_shift),
    "seed_configs.jsonl": Entry(
        "the seed configurations compiled by the TPU compiler", "`benchmarks/partitioning/seed_configs.py`",
        "plan-targets.md#where-the-tpus-memory-goes", _seed_configs, date="2026-11-25"),
    "seed_sweep.json": Entry(
        "whole-volume training over 5 seeds with the class-balanced loss",
        "`benchmarks/learning/seed_sweep.py --data demo,context --arms whole`",
        "recipe.md#every-seed-a-small-organ-in-a-whole-volume", _seed_sweep),
    "target_memory.json": Entry(
        "per-device memory by compiler: CPU, H100, TPU", "`benchmarks/partitioning/target_memory.py`",
        "plan-targets.md#where-the-tpus-memory-goes", _target_memory),
    "target_plans.json": Entry(
        "`fullres plan --target` on TPU and GPU compilers without the hardware", "`fullres plan --target ...`",
        "plan-targets.md", _target_plans),
    "video_motion.json": Entry(
        "clips where only motion tells the classes apart", "`benchmarks/learning/video_motion.py`",
        "video.md#measured", _video_motion),
    "zoo.json": Entry(
        "public segmentation networks split in space: parity, gathers, memory", "`benchmarks/partitioning/zoo.py`",
        "zoo.md#measured", _zoo, date="2026-11-27"),
}
