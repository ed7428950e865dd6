"""What `--input` names for video (`fullres preprocess video`, `fullres predict`): one function tells the layout.

`discover(input, labels)` is that function. Layouts, tried in this order:

- **DAVIS / YouTube-VOS**: a folder holding `JPEGImages/` (DAVIS 2017 adds a
  resolution level, `JPEGImages/480p/`): `JPEGImages/<video>/00000.jpg, ...`
  with masks `Annotations/<video>/00000.png, ...` (or `--labels DIR`:
  `DIR/<video>/00000.png`).
- **video files** (`video_files.VIDEO_SUFFIXES`): a file, or every one under a
  folder; a video's masks are the PNG folder named like it, beside it
  (`cat.mp4` + `cat/00000.png`), or under `--labels` at the same relative place
  (`LABELS/cat/00000.png`).
- **a frame folder**: a folder that holds the frames themselves, as
  `ffmpeg -i clip.mp4 frames/%05d.jpg` writes them (`frames/00001.jpg, ...`):
  one video, named after the folder; masks `--labels DIR`: `DIR/00001.png`.
- **a folder of frame folders**: every folder below it that holds frames is
  one video (`clips/cat/00001.jpg` is video `cat`); masks
  `--labels DIR`: `DIR/cat/00001.png`.

Frames are ordered by the number in their names and hidden files are left out
(`frame_order`, `common.hidden_files`); a linked folder is read as the folder it
links to. A video whose frames cannot be used (an empty frame folder,
names that cannot be ordered, a missing frame) is still listed, with its
`problem`, so that it becomes a dead letter naming the folder, not a silent gap.

A data set is labelled when `--labels` is given or any video has masks (or a
DAVIS folder has `Annotations/`); then every video must have masks, and one
without is a dead letter (`masks_missing`), never a clip of all background.
"""

from __future__ import annotations

import dataclasses
import os

from common import dead_letters, hidden_files
from preprocessing.video import frame_order, mask_frames, video_files

FRAME_SUFFIXES = (".jpg", ".jpeg", ".png")
FRAMES_FOLDER, MASKS_FOLDER = "JPEGImages", "Annotations"
LAYOUTS = ("frame folders (DAVIS / YouTube-VOS)", "video files", "a frame folder", "frame folders")
WHAT_IS_TAKEN = (f"videos ({', '.join(video_files.VIDEO_SUFFIXES)}), a folder of frames (frames/00001.jpg, ...), "
                 f"folders of frames (clips/<video>/00001.jpg) or a DAVIS folder ({FRAMES_FOLDER}/<video>/00000.jpg)")


@dataclasses.dataclass(frozen=True)
class VideoSource:
    """One video to convert: a file, or a folder of frames; and its masks, if any."""

    video_id: str  # the path relative to the input, without suffix: `cat`, `480p/bear`
    path: str  # the video file, or the frame folder
    frames: tuple[str, ...] = ()  # a frame folder's images, in time order; () for a video file
    masks: tuple[str, ...] = ()  # the PNG masks, in frame order; () unlabelled
    mask_folder: str | None = None  # where its masks are, or would be (named in messages)
    frame_folder: bool = False
    frame_names: tuple[str, ...] = ()  # a frame folder's frames' own names (`00005`, `frame_2`), in order
    problem: tuple[str, str, str] | None = None  # (stage, reason, detail): its frames cannot be used
    mask_problem: tuple[str, str, str] | None = None  # (stage, reason, detail): its masks cannot be used
    labelled: bool = False  # its data set is labelled: it must have masks
    hidden: int = 0  # hidden files (`._00000.jpg`, `.DS_Store`) left out of its folders

    @property
    def relative(self) -> str:
        """The source as outputs name it: relative to the input, never an absolute path."""
        return self.video_id + ("/" if self.frame_folder else os.path.splitext(self.path)[1])

    def check_frames(self) -> None:
        """Raises the `dead_letters.CaseError` that makes this video unusable (its frames), if any."""
        if self.problem:
            raise dead_letters.CaseError(*self.problem)

    def check_masks(self) -> None:
        """Raises the `dead_letters.CaseError` of its masks: unusable ones, or none in a labelled data set."""
        if self.mask_problem:
            raise dead_letters.CaseError(*self.mask_problem)
        if self.labelled and not self.masks:
            raise dead_letters.CaseError("labels", "masks_missing", (
                f"it has no masks (expected {os.path.join(self.mask_folder or '', self.names(1)[0])}.png, ...) while "
                "other videos of this data set have them, so its clips would train as all background; add its "
                "masks, or convert it apart as unlabelled data"))

    def names(self, count: int) -> tuple[str, ...]:
        """The own names of its `count` frames: a folder's file stems; a video file's frame numbers, 00000, ..."""
        return self.frame_names[:count] if self.frame_folder else tuple(f"{t:05d}" for t in range(count))


def _error(error: dead_letters.CaseError) -> tuple[str, str, str]:
    return error.stage, error.reason, error.detail


def _has_frames(names: list[str]) -> bool:
    return any(n.lower().endswith(FRAME_SUFFIXES) and not hidden_files.is_hidden(n) for n in names)


def _frame_source(video_id: str, folder: str, mask_folder: str | None) -> VideoSource:
    """One frame folder as a video: its frames in order (or its problem), and its masks in the same order."""
    names, hidden = hidden_files.list_folder(folder)
    try:
        frames = frame_order.ordered(names, FRAME_SUFFIXES)
        if not frames.files:
            raise dead_letters.CaseError("read", "no_frames", (
                f"the frame folder holds no frames ({', '.join(FRAME_SUFFIXES)}); add its frames, or remove the folder"))
    except dead_letters.CaseError as error:
        return VideoSource(video_id, folder, mask_folder=mask_folder, frame_folder=True, problem=_error(error),
                           hidden=hidden)
    masks, mask_problem = (), None
    if mask_folder and os.path.isdir(mask_folder):
        mask_names, mask_hidden = hidden_files.list_folder(mask_folder)
        hidden += mask_hidden
        by_name = {os.path.splitext(n)[0]: n for n in mask_names if n.lower().endswith(mask_frames.MASK_SUFFIX)}
        if set(by_name) == set(frames.names):  # masks in the frames' order; else `pair_names` names the odd one
            masks = tuple(os.path.join(mask_folder, by_name[name]) for name in frames.names)
        elif by_name:
            masks = tuple(os.path.join(mask_folder, n) for n in sorted(by_name.values()))
            try:
                mask_frames.pair_names(list(frames.files), list(masks))
            except dead_letters.CaseError as error:
                mask_problem = _error(error)
    return VideoSource(video_id, folder, tuple(os.path.join(folder, f) for f in frames.files), masks, mask_folder,
                       True, frames.names, mask_problem=mask_problem, hidden=hidden)


def _walk(root: str) -> list[tuple[str, list[str], list[str], int]]:
    """(folder, visible subfolders, visible files, hidden entries) under `root`, hidden folders not entered.

    A linked folder is a folder (`JPEGImages/dog -> /data/dog`), as a linked frame or video file is a file; one
    reached twice (a link back up the tree) is read once.
    """
    found, visited = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in visited:
            subfolders[:] = []
            continue
        visited.add(real)
        hidden = sum(hidden_files.is_hidden(n) for n in (*subfolders, *files))
        subfolders[:] = sorted(n for n in subfolders if not hidden_files.is_hidden(n))
        found.append((folder, list(subfolders), sorted(n for n in files if not hidden_files.is_hidden(n)), hidden))
    return found


def _frame_folders(frames_root: str, masks_root: str | None) -> list[VideoSource]:
    """Every folder under `frames_root` holding frames (or holding nothing: an empty video) is one video."""
    sources, above = [], 0
    for folder, subfolders, files, hidden in _walk(frames_root):
        if folder == frames_root or (subfolders and not _has_frames(files)):
            above += hidden  # a level above the videos (the input itself, DAVIS's 480p/)
            continue
        video_id = os.path.relpath(folder, frames_root)
        inner = [n for n in subfolders if _has_frames(os.listdir(os.path.join(folder, n)))]
        if _has_frames(files) and inner:
            raise ValueError(f"{folder} holds frames and also a folder of frames ({inner[0]}/), so which video a "
                             "frame belongs to is ambiguous; keep each video's frames in a folder of their own, and "
                             "masks outside them (--labels).")
        sources.append(_frame_source(video_id, folder, masks_root and os.path.join(masks_root, video_id)))
    return _tell_hidden(sources, above)


def _tell_hidden(sources: list[VideoSource], hidden: int) -> list[VideoSource]:
    """Counts `hidden` files of folders no video owns on the first video, so that the total is right."""
    if sources and hidden:
        sources[0] = dataclasses.replace(sources[0], hidden=sources[0].hidden + hidden)
    return sources


def _video_files(input_path: str, labels: str | None) -> list[VideoSource]:
    if os.path.isfile(input_path):
        root, files, hidden = os.path.dirname(input_path), [input_path], 0
    else:
        root, files, hidden, with_frames = input_path, [], 0, []
        for folder, _, names, hidden_here in _walk(input_path):
            hidden += hidden_here
            files += [os.path.join(folder, n) for n in names if n.lower().endswith(video_files.VIDEO_SUFFIXES)]
            with_frames += [folder] if _has_frames(names) else []
        ids = {os.path.splitext(os.path.relpath(path, root))[0] for path in files}
        strays = [f for f in with_frames if os.path.relpath(f, root) not in ids]
        if strays:  # neither a video's masks (named like it) nor left out silently: a frame folder is a video too
            raise ValueError(f"--input {input_path} holds video files and also a folder of images that no video is "
                             f"named like ({os.path.relpath(strays[0], root)}/), so it is neither a video's masks nor "
                             "taken as a video; convert the frame folders apart, or name the folder like its video.")
    sources = []
    for path in sorted(files):
        video_id = os.path.splitext(os.path.relpath(path, root))[0]
        folder = os.path.join(labels or root, video_id)
        masks, mask_problem = (), None
        if os.path.isdir(folder):
            hidden += hidden_files.list_folder(folder)[1]
            try:
                masks = tuple(mask_frames.mask_files(folder))
            except dead_letters.CaseError as error:
                mask_problem = _error(error)
        sources.append(VideoSource(video_id, path, masks=masks, mask_folder=folder, mask_problem=mask_problem))
    return _tell_hidden(sources, hidden)


def _check_labels(labels: str) -> None:
    """Refuses a `--labels` that is a file, or a DAVIS root instead of its `Annotations/`."""
    if os.path.isfile(labels):
        raise ValueError(f"--labels {labels} is a file; name the folder that holds the masks, "
                         f"<folder>/<video>/00000.png, ... (of a DAVIS folder: its {MASKS_FOLDER}/).")
    if os.path.isdir(os.path.join(labels, MASKS_FOLDER)):
        raise ValueError(f"--labels {labels} is a DAVIS / YouTube-VOS folder, not its masks; name the masks "
                         f"folder: --labels {os.path.join(labels, MASKS_FOLDER)}.")


def _single_folder(input_path: str, labels: str | None) -> VideoSource:
    """`--input` holding the frames themselves: one video named after the folder, masks in `--labels` itself."""
    names, _ = hidden_files.list_folder(input_path)
    inner = [n for n in sorted(names) if os.path.isdir(os.path.join(input_path, n))
             and _has_frames(os.listdir(os.path.join(input_path, n)))]
    if inner:
        raise ValueError(f"--input {input_path} holds frames and also folders of frames ({inner[0]}/); pass one "
                         "frame folder (one video), or a folder of frame folders (one video each).")
    return _frame_source(os.path.basename(os.path.abspath(input_path)), input_path, labels)


def discover(input_path: str, labels: str | None = None) -> tuple[list[VideoSource], str]:
    """The videos under `input_path` and the layout's name (one of `LAYOUTS`); see the module docstring.

    `fullres preprocess video` and `fullres predict` both call it. Each source lists its frames in time order
    and their own names (`VideoSource.names`); one that cannot be used carries its `problem`.

    Raises:
        FileNotFoundError: `input_path` does not exist.
        ValueError: `labels` is a file or a DAVIS root; or which video a frame belongs to is ambiguous (a frame
            folder inside a frame folder, images beside video files that no video is named like).
    """
    if not os.path.exists(input_path):
        raise FileNotFoundError(f"--input {input_path!r} does not exist.")
    if labels is not None:
        _check_labels(labels)
    if os.path.isdir(os.path.join(input_path, FRAMES_FOLDER)):
        masks_root = labels or os.path.join(input_path, MASKS_FOLDER)
        sources, layout = _frame_folders(os.path.join(input_path, FRAMES_FOLDER), masks_root), LAYOUTS[0]
        labelled = os.path.isdir(masks_root)
    elif os.path.isfile(input_path) or any(n.lower().endswith(video_files.VIDEO_SUFFIXES)
                                           for _, _, names, _ in _walk(input_path) for n in names):
        sources, layout, labelled = _video_files(input_path, labels), LAYOUTS[1], labels is not None
    elif _has_frames(hidden_files.list_folder(input_path)[0]):
        sources, layout, labelled = [_single_folder(input_path, labels)], LAYOUTS[2], labels is not None
    else:
        sources, layout, labelled = _frame_folders(input_path, labels), LAYOUTS[3], labels is not None
        if all(s.problem and s.problem[1] == "no_frames" for s in sources):
            return [], layout  # no frame anywhere: not a video folder at all
    if labelled or any(s.masks or s.mask_problem for s in sources):
        sources = [dataclasses.replace(s, labelled=True) for s in sources]
    return sources, layout


def check_masks_found(sources: list[VideoSource], labels: str | None) -> None:
    """Refuses a labelled data set in which no video has masks (`preprocess video`; predict reads no masks): every
    clip would be all background. `--labels` naming a folder of something else does that, as does an empty
    DAVIS `Annotations/`.

    Raises:
        ValueError: one sentence naming the folder searched and the first mask expected.
    """
    usable = [s for s in sources if not s.problem]
    if not usable or not all(s.labelled and not s.masks and not s.mask_problem for s in usable):
        return
    first = usable[0]
    expected = os.path.join(first.mask_folder or "", first.names(1)[0] + mask_frames.MASK_SUFFIX)
    where = f"--labels {labels}" if labels else os.path.dirname(first.mask_folder or "")
    raise ValueError(f"{where} holds no masks for any of the {len(sources)} videos (expected e.g. {expected}); name the "
                     "folder that holds <video>/00000.png masks, or leave the masks out to convert the videos "
                     "unlabelled.")
