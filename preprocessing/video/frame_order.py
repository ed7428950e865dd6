"""A folder's frames (or masks) in time order, by the number in each name; hidden files left out; gaps named.

Frame files carry their place in time in their names: `00000.jpg` (DAVIS),
`00000.jpg, 00005.jpg, ...` (YouTube-VOS keeps every fifth frame), `00001.jpg`
(`ffmpeg -i clip.mp4 frames/%05d.jpg` starts at 1), `frame_1.png ...
frame_12.png` (unpadded); in a name of several numbers, the one that changes
from frame to frame (`cam2_t10_v3`). The order is the number's, never the text's (text
puts `frame_10` before `frame_2`). A folder is refused, naming the frame, when
its names cannot be ordered so without guessing: a name without a number, two
name patterns in one folder, two files of one number, or a gap in an
otherwise regular run (00006, 00008: 00007 is missing, and a clip over it
would jump two frames). The numbers may step by more than one (YouTube-VOS's
5), and need not step evenly: cameras and recorders name frames by their
capture time (`1701234567000.jpg, 1701234567033.jpg, 1701234567067.jpg` in
milliseconds at 30 fps: steps of 33 and 34, plus the clock's jitter). A step
counts as one frame while it lies within half the usual step (the median) of
it; a step of one and a half times that or more is a frame missing, a step of
half or less a frame out of the pattern.

Hidden files (`.DS_Store`, macOS's AppleDouble `._00000.jpg` copies, editors'
`.swp`, `Thumbs.db`; `common.hidden_files`) are never frames: they are left out
and counted.

Example:
    >>> ordered(["cam2_t10_v3.jpg", "cam2_t9_v3.jpg", "cam2_t8_v3.jpg"], (".jpg",)).names  # t counts time
    ('cam2_t8_v3', 'cam2_t9_v3', 'cam2_t10_v3')
    >>> ordered(["._frame_1.png", *(f"frame_{t}.png" for t in range(1, 11))], (".png",)).names[-3:]
    ('frame_8', 'frame_9', 'frame_10')
    >>> ordered(["00000.jpg", "00005.jpg", "00010.jpg"], (".jpg",)).step
    5
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics

from common import dead_letters, hidden_files

_DIGITS = re.compile(r"(\d+)")
RENUMBER_FIX = "name the frames by number in one pattern, e.g. 00000.jpg, 00001.jpg, ..."


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
    visible = [n for n in names if n.lower().endswith(suffixes) and not hidden_files.is_hidden(n)]
    parts = {name: _DIGITS.split(os.path.splitext(name)[0]) for name in visible}  # text, digits, text, ..., text
    for name, split in parts.items():
        if len(split) == 1:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what} {name} carries no number, so its place in time is unknown; {RENUMBER_FIX}"))
    first_name, first = next(iter(parts.items()), ("", [""]))
    for name, split in parts.items():
        if split[0::2] != first[0::2]:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what}s {first_name} and {name} follow two name patterns, so their order in time is ambiguous; "
                f"{RENUMBER_FIX}"))
    varying = [i for i in range(1, len(first), 2) if len({int(split[i]) for split in parts.values()}) > 1]
    if len(varying) > 1:  # cam1_0001, cam2_0001: which number is time?
        raise dead_letters.CaseError(stage, "frame_names_unordered", (
            f"the {what}s' names differ in {len(varying)} numbers ({first_name}, ...), so which one counts time is "
            f"ambiguous; {RENUMBER_FIX}"))
    at = varying[0] if varying else len(first) - 2  # the number that changes; else the last
    keyed = [(int(split[at]), name, os.path.splitext(name)[0], split) for name, split in parts.items()]
    keyed.sort()
    for (number, name, _, _), (next_number, next_name, _, _) in zip(keyed, keyed[1:]):
        if number == next_number:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what}s {name} and {next_name} both carry number {number}, so their order in time is ambiguous; "
                "keep one of them"))
    numbers = [k[0] for k in keyed]
    steps = [b - a for a, b in zip(numbers, numbers[1:])]
    step = statistics.median_low(steps) if steps else 1
    regular = [gap for gap in steps if _one_frame(gap, step)]
    for index, ((number, name, _, split), gap) in enumerate(zip(keyed, steps)):
        if _one_frame(gap, step):
            continue
        next_name = keyed[index + 1][1]
        others = f"{min(regular)}" if min(regular) == max(regular) else f"{min(regular)} to {max(regular)}"
        if gap < step:
            raise dead_letters.CaseError(stage, "frame_names_unordered", (
                f"{what}s {name} and {next_name} are numbered {gap} apart, the other {what}s {others}, so the "
                f"numbers do not count time; {RENUMBER_FIX}"))
        if others != str(step):  # capture times (jitter): no name of the missing frame can be known
            raise dead_letters.CaseError(stage, "frame_missing", (
                f"a {what} is missing between {name} and {next_name}: their numbers are {gap} apart, the other "
                f"{what}s' {others}, so a clip over the gap would jump in time; add the missing {what}, or cut the "
                f"video at the gap (the {what}s before it and after it as two folders)"))
        digits = split[at]
        width = len(digits) if digits.startswith("0") else 0
        missing = f"{''.join(split[:at])}{number + step:0{width}d}{''.join(split[at + 1:])}"
        raise dead_letters.CaseError(stage, "frame_missing", (
            f"{what} {missing} is missing: the {what}s go in steps of {step} but {name} is followed by "
            f"{next_name}, so a clip over the gap would jump in time; add the missing "
            f"{what}, or renumber the {what}s without a gap"))
    return Ordered(tuple(k[1] for k in keyed), tuple(k[2] for k in keyed), tuple(numbers), step)


def _one_frame(gap: int, step: int) -> bool:
    """Whether two numbers `gap` apart are consecutive frames of a run whose usual step is `step`: within half of
    it (for a counter, step 1 or 5, exactly `step`; for capture times, the clock's jitter)."""
    return 2 * abs(gap - step) < step
