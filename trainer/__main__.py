"""`python -m trainer train ...` (and `plan`): the trainer's commands without the rest of the `fullres` command line.

The entry point sits above `trainer.cli` and nothing imports it, so running the
trainer as a program adds no import circle (`trainer.train` does not import the
command line that calls it). `fullres train --local-processes N` starts each
process this way.
"""

import sys

from common import startup
from trainer import cli

if __name__ == "__main__":
    startup.collect_after_imports()  # the command imports its libraries when it runs
    cli.main(sys.argv[1:])
