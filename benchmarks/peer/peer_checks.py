"""What peer_bench.py checks with fullres itself before any row runs: each candidate's `--set` strings, resolved as
its rows resolve them (`peer_rows.fullres_config`), so a typo is one sentence at the start, not rows that fail after
the baseline's minutes on a GPU.

The check runs in a process of its own on the CPU: importing fullres sets the environment its rows inherit (the
compilation cache, the allocator's share) and would hold Keras and JAX in the command's process.
Alone: `python benchmarks/peer/peer_checks.py ROWS_JSON` prints a line starting with PROBLEM_MARK, or nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
PROBLEM_MARK = "CANDIDATE_PROBLEM "


def candidate_problem(rows: list[dict]) -> str | None:
    """One sentence naming the first of `rows` (fullres rows with their `sets`) whose settings fullres refuses, or
    None (also where there are none to check)."""
    if not rows:
        return None
    environment = dict(os.environ, JAX_PLATFORMS="cpu")  # resolving settings touches no device
    found = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(rows)], capture_output=True,
                           text=True, cwd=REPOSITORY, env=environment, timeout=600)
    said = [line for line in found.stdout.splitlines() if line.startswith(PROBLEM_MARK)]
    if said:
        return said[0][len(PROBLEM_MARK):]
    if found.returncode != 0:
        tail = " | ".join((found.stdout + found.stderr).strip().splitlines()[-2:])[-400:]
        return f"--candidate: fullres could not check the candidates' settings (exit {found.returncode}: {tail})"
    return None


def main() -> None:
    sys.path[:0] = [HERE, REPOSITORY]
    import peer_rows

    for row in json.loads(sys.argv[1]):
        try:
            peer_rows.fullres_config(row)
        except ValueError as error:  # a sentence of fullres's own (UserModelError and PartitionError among them)
            print(f"{PROBLEM_MARK}--candidate {' '.join(row['sets'])!r}: {error}", flush=True)
            return


if __name__ == "__main__":
    main()
