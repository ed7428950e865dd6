"""The edge between what fits and what does not, over an ordered list of candidates, in few probes.

`fullres plan --largest` walks sizes the network takes (`largest_volume`), the smallest-slice search walks a
generation's slices (`smallest_slice`); both ask one question per candidate, "does it fit?", whose answer costs a
compile on the target's compiler (minutes here). `find_edge` answers with as few as it can: the first probe where
the caller guesses, then steps that double away from it until the answer changes, then bisection. A probe may
answer None, "not searched" (the time ran out): the search stops there and says which candidates it did not reach,
never that they do not fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclasses.dataclass(frozen=True)
class Edge(Generic[P]):
    """What `find_edge` found, by index into the candidates (fitting ones at the low end).

    `last_fit`: the highest index that fits (None: none probed fits); `first_miss`: the lowest index above it that
    does not (None: none probed above it misses); `unsearched`: the indices strictly between them the search did not
    reach (time ran out): neither fitting nor not. `points`: every probe's answer, in the order asked.
    """

    last_fit: int | None
    first_miss: int | None
    unsearched: tuple[int, ...]
    points: dict[int, P]


def find_edge(count: int, probe: Callable[[int], P], fits: Callable[[P], bool | None], start: int = 0,
              guess: Callable[[int, P], int] | None = None) -> Edge[P]:
    """The edge between the candidates 0..count-1 that fit (low indices) and those that do not (high ones).

    Args:
        count: how many candidates there are.
        probe: the answer for one index (compiles; called at most once per index).
        fits: True, False, or None where the probe was not searched (the search then stops).
        start: the index to probe first.
        guess: from the first answer, the index to probe next (e.g. scaled from its bytes), or None.

    Example:
        >>> edge = find_edge(100, lambda i: i, lambda i: i <= 41, start=3)
        >>> edge.last_fit, edge.first_miss, edge.unsearched, len(edge.points) <= 14
        (41, 42, (), True)
    """
    points: dict[int, P] = {}
    stopped = False

    def ask(index: int) -> None:
        nonlocal stopped
        points[index] = probe(index)
        stopped = fits(points[index]) is None

    if count < 1:
        return Edge(None, None, (), points)
    start = min(max(start, 0), count - 1)
    ask(start)
    if guess is not None and not stopped:
        guessed = min(max(guess(start, points[start]), 0), count - 1)
        if guessed != start:
            ask(guessed)
    step = 1
    while not stopped:
        fit = [i for i, p in points.items() if fits(p)]
        last_fit = max(fit, default=None)
        misses = [i for i, p in points.items() if fits(p) is False and (last_fit is None or i > last_fit)]
        first_miss = min(misses, default=None)
        if last_fit is None:
            if first_miss == 0:
                break
            following = max(0, first_miss - step)  # no fit yet: step down, doubling
        elif first_miss is None:
            if last_fit == count - 1:
                break
            following = min(count - 1, last_fit + step)  # no miss above yet: step up, doubling
        elif first_miss - last_fit <= 1:
            break
        else:
            following = (last_fit + first_miss) // 2
        step *= 2
        ask(following)
    fit = [i for i, p in points.items() if fits(p)]
    last_fit = max(fit, default=None)
    misses = [i for i, p in points.items() if fits(p) is False and (last_fit is None or i > last_fit)]
    first_miss = min(misses, default=None)
    low = -1 if last_fit is None else last_fit
    high = count if first_miss is None else first_miss
    unsearched = tuple(i for i in range(low + 1, high) if i not in points or fits(points[i]) is None) \
        if stopped else ()
    return Edge(last_fit, first_miss, unsearched, points)
