"""The preprocessing layer's commands (`fullres preprocess ct|images|video`, `fullres demo-data ct|images|video`).

`pipelines/cli.py` adds them to the `fullres` command line. Beam, TensorFlow
and the medical-format libraries are imported only when a command runs, so
`--help` is instant.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from common import console

preprocess_app = typer.Typer(
    rich_markup_mode=None, help="Convert CT scans, annotated images or videos into sharded TFRecords with Apache Beam.",
                             no_args_is_help=True)
demo_data_app = typer.Typer(
    rich_markup_mode=None, help="Write synthetic demo data (no downloads).", no_args_is_help=True)

BEAM_HELP = (
    "Beam runner: DirectRunner (this machine: Beam's local FnApi runner, one worker per core) or DataflowRunner (add --project, --region, "
    "--temp_location and any other Beam option after the known ones)."
)


# Options every conversion command shares.
ConversionOutput = Annotated[str, typer.Option(help="Output directory (replaced whole, atomically).")]
NumShards = Annotated[int, typer.Option(help="TFRecord shards; 0 lets the runner decide.")]
Compress = Annotated[bool, typer.Option(help="Write .tfrecord.gz shards.")]
MaxFailedFraction = Annotated[float, typer.Option(help="Exit non-zero when more than this fraction of inputs fails.")]
Runner = Annotated[str, typer.Option(help=BEAM_HELP)]
Workers = Annotated[int | None, typer.Option(help="DirectRunner worker processes (default: one per core).")]
FollowLinks = Annotated[bool, typer.Option("--follow-links", help="Also read what symbolic links under --input lead to outside it (by default such links are left alone and named in a note; links inside --input are always followed).")]


def _check_counts(num_shards: int, workers: int | None, max_pixels: int | None = None) -> None:
    """Refuses a negative shard count, fewer than one worker, or a pixel budget below one, in one sentence."""
    if num_shards < 0:
        console.fail(f"--num-shards {num_shards} must be 0 (the runner decides) or more, e.g. --num-shards 16.")
    if workers is not None and workers < 1:
        console.fail(f"--workers {workers} must be 1 or more (leave it out for one per core), e.g. --workers 2.")
    if max_pixels is not None and max_pixels < 1:
        console.fail(f"--max-pixels {max_pixels} must be 1 or more, e.g. --max-pixels 100000000.")


def _beam_args(runner: str, workers: int | None, extra: list[str]) -> list[str]:
    """Beam pipeline options: the runner, local worker count, and whatever else the user passed."""
    from preprocessing.beam import local_workers

    if runner == "DirectRunner":
        args = local_workers.default_pipeline_args()
        if workers:
            args = [a for a in args if not a.startswith("--direct_num_workers")] + [f"--direct_num_workers={workers}"]
        return args + extra
    args = [f"--runner={runner}", *extra]
    if runner == "DataflowRunner" and not any(
        a.startswith(("--setup_file", "--extra_package", "--sdk_container_image")) for a in extra
    ):
        args.append(f"--extra_package={_worker_wheel()}")
    return args


def _worker_wheel() -> str:
    """Builds a wheel of this fullres checkout for Dataflow workers to install (Beam's --extra_package)."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").exists():
        console.fail("Dataflow workers need fullres: pass --sdk_container_image with the fullres image, or --extra_package.")
    import shutil

    directory = tempfile.mkdtemp(prefix="fullres-wheel-")
    uv = os.environ.get("UV") or shutil.which("uv")
    command = (
        [uv, "build", "--quiet", "--wheel", "--out-dir", directory, str(root)]
        if uv
        else [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", directory, str(root)]
    )
    built = subprocess.run(command, capture_output=True, text=True)
    wheels = list(Path(directory).glob("fullres-*.whl"))
    if built.returncode != 0 or not wheels:
        console.fail(f"could not build the fullres wheel for Dataflow workers ({built.stderr.strip()[-300:]}); pass "
              "--sdk_container_image or --extra_package instead.")
    return str(wheels[0])


def _run_conversion(function, **kwargs):
    from common import file_writes
    from preprocessing.beam import conversion

    try:
        function(**kwargs, log=console.say)
    except (conversion.PreprocessingFailed, file_writes.OutputWriteFailed) as error:
        console.fail(str(error))
    except (ValueError, FileNotFoundError) as error:  # OutputRefused is a ValueError
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, kwargs["output"])


_BEAM_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@preprocess_app.command("ct", context_settings=_BEAM_CONTEXT)
def preprocess_ct(
    context: typer.Context,
    input_path: Annotated[str, typer.Option("--input", help="A CT file, or a directory of DICOM series / NIfTI / NRRD / MetaImage files.")],
    output: ConversionOutput,
    labels: Annotated[str | None, typer.Option(help="Label maps: a directory with a file named like each image, or a CSV with image,label rows. Omit for layouts whose names pair them (nnU-Net/MSD imagesTr+labelsTr, KiTS case folders, CASE_image+CASE_label).")] = None,
    spacing: Annotated[str | None, typer.Option(help="Target spacing X,Y,Z in mm; omit to keep each case's own.")] = None,
    window: Annotated[str, typer.Option(help="HU window LOW,HIGH mapped onto [0, 1] (CT only; MR is z-scored).")] = "-1000,1000",
    modality: Annotated[str, typer.Option(help="ct (HU window), mr (z-score per case), or auto (DICOM's Modality tag; for volume files, CT if the values look like HU).")] = "auto",
    pseudonymize: Annotated[bool, typer.Option(help="Replace case ids by keyed hashes; the mapping back goes to OUTPUT.pseudonyms.json beside the output, never inside it.")] = False,
    pseudonymize_key_file: Annotated[str | None, typer.Option(help="Key for --pseudonymize (share it between splits); default OUTPUT.pseudonym-key, generated once.")] = None,
    shape: Annotated[str | None, typer.Option(help="Crop or pad every case to D,H,W (choose sizes your partitioning accepts).")] = None,
    spacing_tolerance: Annotated[float, typer.Option(help="DICOM slice gaps may vary by this fraction of their median; beyond it slices are interpolated onto a uniform grid (noted in summary.json).")] = 0.05,
    classes: Annotated[str | None, typer.Option(help="Class names of DICOM SEG segments / RTSTRUCT ROIs, NAME1,NAME2,... (NAME1 is class 1), or a label_map.json of a previous run.")] = None,
    crop: Annotated[str, typer.Option(help="Where --shape crops: center of the volume, or foreground (centred on the labelled voxels).")] = "center",
    num_classes: Annotated[int | None, typer.Option(help="Classes including background: label values must be 0..N-1 (default: 0..255).")] = None,
    max_voxels: Annotated[int | None, typer.Option(help="Cases with more voxels (read from the header, and after resampling) are dead letters (default 2^29).")] = None,
    max_decoded_bytes: Annotated[str | None, typer.Option(help="Volumes that take more memory once decoded (stored type + float32 copy, read from the header) are dead letters, e.g. 8GiB (default 3GiB).")] = None,
    follow_links: FollowLinks = False,
    num_shards: NumShards = 0,
    compress: Compress = False,
    max_failed_fraction: MaxFailedFraction = 0.1,
    runner: Runner = "DirectRunner",
    workers: Workers = None,
) -> None:
    """Convert CT volumes (+ label maps) into resampled, windowed TFRecords; bad cases go to dead_letter.jsonl."""
    # Cheap checks first: a typo should not wait for Beam and TensorFlow to load.
    from common import dead_letters
    from preprocessing.ct import ct_settings

    try:
        grid = ct_settings.grid_from_text(spacing, window, shape)
        dead_letters.check_failed_fraction(max_failed_fraction)
    except ValueError as error:
        console.fail(str(error))
    _check_counts(num_shards, workers)
    for name, path in (("--input", input_path), ("--labels", labels)):
        if path is not None and "://" not in path and not os.path.exists(path):
            console.fail(f"{name} {path!r} does not exist.")
    from common import sizes
    from preprocessing.beam import ct_pipeline
    from preprocessing.ct import ct_transforms, label_maps

    try:
        decoded_bytes = {} if max_decoded_bytes is None else {
            "max_decoded_bytes": sizes.parse_bytes(max_decoded_bytes, "--max-decoded-bytes")}
        config = ct_transforms.CtPreprocessConfig(**grid, spacing_tolerance=spacing_tolerance,
                                                  classes=label_maps.class_names(classes) if classes else (),
                                                  modality=modality, crop=crop,
                                                  max_label=255 if num_classes is None else num_classes - 1,
                                                  **({"max_voxels": max_voxels} if max_voxels is not None else {}),
                                                  **decoded_bytes)
    except ValueError as error:
        console.fail(str(error))
    _run_conversion(
        ct_pipeline.run, input_path=input_path, output=output, labels=labels, config=config,
        pipeline_args=_beam_args(runner, workers, context.args), num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction, pseudonymize=pseudonymize, pseudonym_key_file=pseudonymize_key_file,
        follow_links=follow_links,
    )


@preprocess_app.command("images", context_settings=_BEAM_CONTEXT)
def preprocess_images(
    context: typer.Context,
    annotations: Annotated[str, typer.Option(help="A COCO JSON file, or a directory of Pascal VOC XML files.")],
    images: Annotated[str, typer.Option(help="The directory the annotations' file names are relative to.")],
    output: ConversionOutput,
    label_map: Annotated[str | None, typer.Option(help="label_map.json of a previous conversion (e.g. the training split): class ids are taken from it, so every split agrees.")] = None,
    extend_label_map: Annotated[bool, typer.Option(help="Give a class the --label-map lacks the next free id (default: refuse it).")] = False,
    max_pixels: Annotated[int, typer.Option(help="Images over this many pixels (read from the header) are dead letters: decompression bombs.")] = 100_000_000,
    num_shards: NumShards = 0,
    compress: Compress = False,
    max_failed_fraction: MaxFailedFraction = 0.1,
    runner: Runner = "DirectRunner",
    workers: Workers = None,
) -> None:
    """Convert images with boxes into TF Object Detection API TFRecords; bad boxes and images go to dead_letter.jsonl."""
    from common import dead_letters

    try:
        dead_letters.check_failed_fraction(max_failed_fraction)
    except ValueError as error:
        console.fail(str(error))
    _check_counts(num_shards, workers, max_pixels)
    for name, path in (("--annotations", annotations), ("--images", images), ("--label-map", label_map)):
        if path is not None and "://" not in path and not os.path.exists(path):
            console.fail(f"{name} {path!r} does not exist.")
    if extend_label_map and label_map is None:
        console.fail("--extend-label-map extends the map given with --label-map; pass --label-map too, or drop the flag.")
    from preprocessing.beam import images_pipeline

    _run_conversion(
        images_pipeline.run, annotations=annotations, images=images, output=output,
        pipeline_args=_beam_args(runner, workers, context.args), num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction, label_map=label_map, extend_label_map=extend_label_map,
        max_pixels=max_pixels,
    )


@preprocess_app.command("video", context_settings=_BEAM_CONTEXT)
def preprocess_video(
    context: typer.Context,
    input_path: Annotated[str, typer.Option("--input", help="A video file (MP4, MOV, AVI, MKV), a folder of them (masks: a PNG folder named like each video, beside it), or a DAVIS / YouTube-VOS folder (JPEGImages/<video>/00000.jpg, Annotations/<video>/00000.png).")],
    output: ConversionOutput,
    labels: Annotated[str | None, typer.Option(help="Where the masks are, if not beside the videos (or in Annotations/): LABELS/<video>/00000.png, palette PNGs whose indices are the classes.")] = None,
    clip_length: Annotated[int, typer.Option(help="Frames per clip (T).")] = 16,
    clip_stride: Annotated[int | None, typer.Option(help="Frames from one clip's start to the next (default: --clip-length, clips side by side).")] = None,
    size: Annotated[str, typer.Option(help="H,W of every clip frame.")] = "128,128",
    fit: Annotated[str, typer.Option(help="crop (scale to cover H,W and cut the middle: aspect kept) or resize (stretch).")] = "crop",
    folder_fps: Annotated[float, typer.Option(help="Frame rate recorded for frame folders, which state none (DAVIS: 24).")] = 24.0,
    num_classes: Annotated[int | None, typer.Option(help="Classes including background: mask values must be 0..N-1 (default: 0..255).")] = None,
    max_decoded_bytes: Annotated[str, typer.Option(help="The most memory one whole video may take decoded at --size (4 bytes a pixel: RGB and mask): a --size whose one clip exceeds it is refused, a longer video is a dead letter.")] = "3GiB",
    num_shards: NumShards = 0,
    compress: Compress = False,
    max_failed_fraction: MaxFailedFraction = 0.1,
    runner: Runner = "DirectRunner",
    workers: Workers = None,
) -> None:
    """Cut videos (+ per-frame masks) into fixed-size uint8 RGB clips; bad videos go to dead_letter.jsonl."""
    from common import dead_letters, parsing, sizes
    from preprocessing.video import video_clips

    try:
        dead_letters.check_failed_fraction(max_failed_fraction)
        config = video_clips.VideoPreprocessConfig(
            clip_length, clip_stride, tuple(parsing.parse_list(size, int, "--size", "128,128") or ()), fit, folder_fps,
            255 if num_classes is None else num_classes - 1, sizes.parse_bytes(max_decoded_bytes, "--max-decoded-bytes"))
    except ValueError as error:
        console.fail(str(error))
    _check_counts(num_shards, workers)
    for name, path in (("--input", input_path), ("--labels", labels)):
        if path is not None and not os.path.exists(path):
            console.fail(f"{name} {path!r} does not exist.")
    from preprocessing.beam import video_pipeline

    _run_conversion(
        video_pipeline.run, input_path=input_path, output=output, labels=labels, config=config,
        pipeline_args=_beam_args(runner, workers, context.args), num_shards=num_shards, compress=compress,
        max_failed_fraction=max_failed_fraction,
    )


def _write_demo_data(output: Path, kind: str, planned: list[str], write):
    """Runs `write` (which writes `planned`, paths relative to `output`) under the output rules every command follows.

    `output` must be new, empty, or demo data of the same `kind` (its marker
    lists every file below it); anything else is refused, naming the file in
    the way. Files of an earlier run that this one does not rewrite are
    removed, so a smaller rerun does not leave old cases behind.
    """
    from common import output_guard, output_lock

    try:
        output_guard.demo_data_files(str(output), kind, planned)  # before the lock: a refusal leaves nothing behind
        with output_lock.lock(str(output)):
            old = output_guard.demo_data_files(str(output), kind, planned)  # again: another run may have written
            output.mkdir(parents=True, exist_ok=True)
            # Claimed before writing: a run cut short leaves a folder the next run still recognises as its own.
            output_guard.write_marker(str(output), kind, sorted({*old, *planned}))
            for name in sorted(set(old) - set(planned)):
                os.remove(output / name)
                for folder in Path(name).parents[:-1]:  # the folders it leaves empty (never `output` itself)
                    if any((output / folder).iterdir()):
                        break
                    (output / folder).rmdir()
            written = write()
            output_guard.write_marker(str(output), kind, output_guard.demo_data_files(str(output), kind))
    except output_guard.OutputRefused as error:
        console.fail(str(error))
    except OSError as error:
        console.fail_if_write_error(error, output)
    return written


@demo_data_app.command("ct")
def demo_data_ct(
    output: Annotated[Path, typer.Option(help="Directory to write dicom/ and nifti/ into.")] = Path("fullres-demo-ct"),
    cases: Annotated[int, typer.Option(help="Number of synthetic cases.")] = 8,
    shape: Annotated[str, typer.Option(help="Voxels D,H,W of each case before preprocessing.")] = "48,64,64",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Synthetic CT cases with label maps, as DICOM series and as NIfTI (the same cases in both)."""
    from preprocessing.ct import demo_ct

    from preprocessing.ct import ct_settings

    try:
        size = ct_settings.read("shape", shape)
    except ValueError as error:
        console.fail(str(error))
    if size is None:  # "" or "none": the demo needs a size
        console.fail(f"--shape {shape!r} is not valid; write it like {ct_settings.EXAMPLES['shape']}.")
    written = _write_demo_data(output, "demo-data-ct", demo_ct.demo_case_files(cases, size),
                               lambda: demo_ct.write_demo_cases(str(output), cases, size, seed))
    console.say(f"wrote {cases} cases: DICOM series in {written['dicom']}, NIfTI in {written['nifti']} "
           f"(labels beside each, in labels/)")


@demo_data_app.command("images")
def demo_data_images(
    output: Annotated[Path, typer.Option(help="Directory to write images/ and annotations.json into.")] = Path("fullres-demo-images"),
    images: Annotated[int, typer.Option(help="Number of images.")] = 64,
    size: Annotated[int, typer.Option(help="Image height and width in pixels.")] = 256,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Synthetic detection images (shapes on textured backgrounds) with COCO JSON boxes."""
    from preprocessing.images import demo_images

    written = _write_demo_data(output, "demo-data-images", demo_images.demo_coco_files(images),
                               lambda: demo_images.write_demo_coco(str(output), images, (size, size), seed))
    console.say(f"wrote {images} images to {written['images']} and boxes to {written['annotations']}")


@demo_data_app.command("video")
def demo_data_video(
    output: Annotated[Path, typer.Option(help="Directory to write videos/ into.")] = Path("fullres-demo-video"),
    videos: Annotated[int, typer.Option(help="Number of videos.")] = 8,
    frames: Annotated[int, typer.Option(help="Frames of each video.")] = 24,
    size: Annotated[str, typer.Option(help="H,W of the frames: even numbers (H.264), 16 or more.")] = "64,64",
    fps: Annotated[int, typer.Option(help="Frame rate.")] = 24,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Synthetic MP4 videos where only motion tells the classes apart (two identical squares, class = direction),
    with per-frame palette PNG masks beside each."""
    from common import parsing
    from preprocessing.video import demo_video

    try:
        shape = tuple(parsing.parse_list(size, int, "--size", "64,64") or ())
        demo_video.check_settings(shape, videos, frames, fps, size)
    except ValueError as error:
        console.fail(str(error))
    written = _write_demo_data(output, "demo-data-video", demo_video.demo_video_files(videos, frames),
                               lambda: demo_video.write_demo_videos(str(output), videos, frames, shape, fps, seed))
    console.say(f"wrote {videos} videos of {frames} frames to {written['videos']} (masks beside each; classes "
                f"{', '.join(demo_video.CLASSES)})")
