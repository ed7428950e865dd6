"""A folder's frames (or masks) in time order, by the number in each name; hidden files left out; gaps named.

Frame files carry their place in time in their names: `00000.jpg` (DAVIS),
`00000.jpg, 00005.jpg, ...` (YouTube-VOS keeps every fifth frame), `00001.jpg`
(`ffmpeg -i clip.mp4 frames/%05d.jpg` starts at 1), `frame_1.png ...
frame_12.png` (unpadded). The order is the number's, never the text's (text
puts `frame_10` before `frame_2`). A folder is refused, naming the frame, when
its names cannot be ordered so without guessing: a name without a number, two
name patterns in one folder, two files of one number, or a gap in an
otherwise regular run (00006, 00008: 00007 is missing, and a clip over it
would jump two frames). The numbers may step by more than one, as long as
every step is the same (YouTube-VOS's 5).

Hidden files (`.DS_Store`, macOS's AppleDouble `._00000.jpg` copies, editors'
`.swp`) are never frames: they are left out and counted.

Example:
    >>> ordered(["._frame_1.png", *(f"frame_{t}.png" for t in range(1, 11))], (".png",)).names[-3:]
    ('frame_8', 'frame_9', 'frame_10')
    >>> ordered(["00000.jpg", "00005.jpg", "00010.jpg"], (".jpg",)).step
    5
"""

from __future__ import annotations

import dataclasses
import os
import re

from common import dead_letters

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")  # the last run of digits is the frame's number
RENUMBER_FIX = "name the frames by number in one pattern, e.g. 00000.jpg, 00001.jpg, ..."


def is_hidden(name: str) -> bool:
    """Dotfiles: `.DS_Store`, AppleDouble `._00000.jpg`, `.git`: never a frame, mask, video or video folder."""
    return name.startswith(".")


@dataclasses.dataclass(frozen=True)
class Ordered:
    """The files of one folder that carry a suffix of interest, in time order."""

    files: tuple[str, ...]  # file names, in order
    names: tuple[str, ...]  # their stems (`00005`, `frame_2`): what masks and predicted masks are named by
    numbers: tuple[int, ...]
    step: int  # the numbers' step (1; YouTube-VOS 5); 1 for fewer than two files


def ordered(names: list[str], suffixes: tuple[str, ...], what: str = "frame", stage: str = "read") -> Ordered:
    """The `names` ending in `suffixes` (any case), hidden ones left out, in the order of the numbers they carry.

    Raises:
        dead_letters.CaseError: `frame_names_unordered` (a name without a number, two patterns, two files of one
            number) or `frame_missing` (a gap in the numbers), naming the file, in a sentence about `what`.
    """
    visible = [n for n in names if n.lower().endswith(suffixes) and not is_hidden(n)]
    keyed, patterns = [], {}
    for name in visible:
        stem = os.path.splitext(name)[0]
        match = _NUMBERED.match(stem)
        if match is None:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what} {name} carries no number, so its place in time is unknown; {RENUMBER_FIX}"))
        pattern = (match.group(1), match.group(3))
        patterns.setdefault(pattern, name)
        if len(patterns) > 1:
            first = next(iter(patterns.values()))
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what}s {first} and {name} follow two name patterns, so their order in time is ambiguous; "
                f"{RENUMBER_FIX}"))
        keyed.append((int(match.group(2)), name, stem))
    keyed.sort()
    for (number, name, _), (next_number, next_name, _) in zip(keyed, keyed[1:]):
        if number == next_number:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what}s {name} and {next_name} both carry number {number}, so their order in time is ambiguous; "
                "keep one of them"))
    numbers = [k[0] for k in keyed]
    steps = [b - a for a, b in zip(numbers, numbers[1:])]
    step = min(steps) if steps else 1
    for (number, name, stem), gap in zip(keyed, steps):
        if gap != step:
            match = _NUMBERED.match(stem)
            width = len(match.group(2)) if match.group(2).startswith("0") else 0
            missing = f"{match.group(1)}{number + step:0{width}d}{match.group(3)}"
            raise dead_letters.CaseError(stage, "frame_missing", (
                f"{what} {missing} is missing: the {what}s go in steps of {step} but {name} is followed by "
                f"{keyed[numbers.index(number) + 1][1]}, so a clip over the gap would jump in time; add the missing "
                f"{what}, or renumber the {what}s without a gap"))
    return Ordered(tuple(k[1] for k in keyed), tuple(k[2] for k in keyed), tuple(numbers), step)


def list_folder(folder: str) -> tuple[list[str], int]:
    """(the visible entries of `folder`, how many hidden ones were left out)."""
    names = os.listdir(folder)
    visible = [n for n in names if not is_hidden(n)]
    return visible, len(names) - len(visible)
