"""Whole-volume prediction (`fullres predict`) against patch-based sliding window, side by side in one run.

Same trained model, same held-out scans, same preprocessing; the only
difference is how the volume meets the network:
- whole: `inference.VolumePredictor`, one partitioned forward pass per scan;
- sliding: nnU-Net's sliding window (`trainer.engine.sliding_window`, the product's: patch = the
  training shape, 0.5 overlap, Gaussian weighting), the patches run through
  the same jitted model on one device, `--patch-batch` at a time.
Both probability maps go back onto the scan's own grid the same way
(`scan_grid.to_original_grid`) and are scored there against the original label
maps: mean foreground Dice, and Dice in a band of `--band` voxels around the
patch seams (where sliding windows stitch). Timing excludes reading and
compilation (one warm-up scan first; the whole pass compiles once per new
padded shape, timed apart as `whole_first_seconds`), and runs each method on every scan in
alternation, so load on a shared machine hits both alike.

    uv run python benchmarks/learning/predict_whole_vs_sliding.py --model RUN_DIR --images DIR --labels DIR \\
        --virtual-devices 2 --input-partition-dims 1,2,1,1,1 --json benchmarks/results/predict_whole_vs_sliding.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the output directory of fullres train")
    parser.add_argument("--images", required=True, help="held-out scans in their original geometry")
    parser.add_argument("--labels", required=True, help="their label maps, named like the scans")
    parser.add_argument("--virtual-devices", type=int, default=2)
    parser.add_argument("--input-partition-dims", default=None, help="the whole-volume split (default: training's)")
    parser.add_argument("--overlap", type=float, default=0.5)
    parser.add_argument("--patch-batch", type=int, default=4)
    parser.add_argument("--band", type=int, default=2, help="voxels either side of a seam (model grid)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.virtual_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.virtual_devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    sys.path.insert(0, HERE)

    import jax
    import numpy as np
    import SimpleITK as sitk

    from preprocessing.ct import volume_discovery
    from trainer import trained_run
    from trainer.engine import inference, sliding_window
    from trainer.parallel import partitioning
    from trainer.predict import predict, scan_grid

    info = predict.checked_model_info(args.model)
    devices = jax.devices()
    loaded = trained_run.load(args.model, devices, partitioning.parse_dims(args.input_partition_dims))
    config, model, state = loaded.config, loaded.model, loaded.state
    whole = inference.VolumePredictor(model, state, config.partition, devices, config.model.downsampling_levels)
    one = partitioning.PartitionConfig((1, 1, 1, 1, 1))
    single = inference.VolumePredictor(model, state, one, devices[:1], config.model.downsampling_levels)
    patch = tuple(config.patch_size or info["preprocessing"]["shape"] or info["image_shape"][:3])
    patch_forward = jax.jit(lambda s, x: jax.nn.softmax(model.stateless_call(s.trainable, s.non_trainable, x,
                                                                                training=False)[0], axis=-1))

    def sliding(volume):
        return sliding_window.predict(
            volume, patch, lambda batch: np.asarray(patch_forward(single.state, batch)), overlap=args.overlap,
            batch_size=args.patch_batch)

    def dice(a, b, mask=None):
        scores = []
        for k in range(1, config.model.num_classes):
            x, y = a == k, b == k
            if mask is not None:
                x, y = x & mask, y & mask
            total = x.sum() + y.sum()
            scores.append(float(2 * (x & y).sum() / total) if total else None)
        return scores

    scans = sorted(volume_discovery.find_volumes(args.images).images.items())
    rows = []
    warmed = False
    for case_id, source in scans:
        prepared = scan_grid.prepare(source, info["preprocessing"])
        label_path = os.path.join(args.labels, os.path.basename(source.path))
        truth = sitk.GetArrayFromImage(sitk.ReadImage(label_path))
        if not warmed:  # compile the patch model once, outside the timing
            sliding(prepared.volume)
            warmed = True
        started = time.perf_counter()
        whole.probabilities(prepared.volume, prepared.fill)  # a new shape compiles: timed apart
        whole_first_seconds = time.perf_counter() - started
        started = time.perf_counter()
        whole_probabilities = whole.probabilities(prepared.volume, prepared.fill)
        whole_seconds = time.perf_counter() - started
        started = time.perf_counter()
        sliding_probabilities, patches = sliding(prepared.volume)
        sliding_seconds = time.perf_counter() - started
        # Seams: voxels within `band` of a patch border that another patch covers (model grid), mapped back.
        seams = np.zeros(prepared.volume.shape[:3], bool)
        for axis, size in enumerate(prepared.volume.shape[:3]):
            starts = sliding_window.window_starts(max(size, patch[axis]), patch[axis], args.overlap)
            for start in starts[1:]:
                index = [slice(None)] * 3
                index[axis] = slice(max(start - args.band, 0), start + args.band)
                seams[tuple(index)] = True
            for start in starts[:-1]:
                index = [slice(None)] * 3
                index[axis] = slice(max(start + patch[axis] - args.band, 0), start + patch[axis] + args.band)
                seams[tuple(index)] = True
        seam_image = sitk.GetImageFromArray(seams.astype(np.uint8))
        seam_image.CopyInformation(prepared.grid)
        seam_on_original = sitk.GetArrayFromImage(sitk.Resample(seam_image, prepared.original, sitk.Transform(),
                                                                sitk.sitkNearestNeighbor, 0)).astype(bool)
        whole_mask, _ = scan_grid.to_original_grid(whole_probabilities, prepared.grid, prepared.original)
        sliding_mask, _ = scan_grid.to_original_grid(sliding_probabilities, prepared.grid, prepared.original)
        whole_ids, sliding_ids = sitk.GetArrayFromImage(whole_mask), sitk.GetArrayFromImage(sliding_mask)
        row = {"case_id": case_id, "shape": list(truth.shape), "model_grid": list(prepared.volume.shape[:3]),
               "patches": patches, "whole_first_seconds": whole_first_seconds, "whole_seconds": whole_seconds, "sliding_seconds": sliding_seconds,
               "whole_dice": dice(whole_ids, truth), "sliding_dice": dice(sliding_ids, truth),
               "whole_seam_dice": dice(whole_ids, truth, seam_on_original),
               "sliding_seam_dice": dice(sliding_ids, truth, seam_on_original),
               "voxels_differing": int((whole_ids != sliding_ids).sum())}
        rows.append(row)
        print(f"{case_id}: grid {row['model_grid']}, {patches} patches; whole {whole_seconds:.3f} s, sliding "
              f"{sliding_seconds:.3f} s; Dice whole {np.round(row['whole_dice'], 3).tolist()} sliding "
              f"{np.round(row['sliding_dice'], 3).tolist()}", flush=True)

    def mean(key):
        values = [v for r in rows for v in r[key] if v is not None]
        return float(np.mean(values)) if values else None

    summary = {"model": args.model, "devices": f"{config.partition.num_cores_per_replica} {devices[0].platform}",
               "input_partition_dims": list(config.partition.input_partition_dims), "patch": list(patch),
               "overlap": args.overlap, "cases": len(rows),
               "whole_seconds_per_scan": float(np.mean([r["whole_seconds"] for r in rows])),
               "whole_first_call_seconds_per_scan": float(np.mean([r["whole_first_seconds"] for r in rows])),
               "sliding_seconds_per_scan": float(np.mean([r["sliding_seconds"] for r in rows])),
               "whole_dice": mean("whole_dice"), "sliding_dice": mean("sliding_dice"),
               "whole_seam_dice": mean("whole_seam_dice"), "sliding_seam_dice": mean("sliding_seam_dice"),
               "rows": rows}
    summary["speedup"] = summary["sliding_seconds_per_scan"] / summary["whole_seconds_per_scan"]
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)


if __name__ == "__main__":
    main()
