"""One-sentence errors and progress lines for every layer's commands (`fullres ...`)."""

from __future__ import annotations

import os
import sys
import traceback

import typer


def fail(message: str) -> None:
    """One sentence on stderr and exit 2; with `fullres --verbose`, the traceback of the error being handled first."""
    if os.environ.get("FULLRES_VERBOSE") == "1" and sys.exc_info()[1] is not None:
        traceback.print_exc()
    typer.echo(f"fullres: error: {message}", err=True)
    raise typer.Exit(code=2)


def fail_if_write_error(error: Exception, output) -> None:
    """Disk full or permission denied while writing `output` becomes one sentence; other errors propagate."""
    from common import file_writes

    sentence = file_writes.write_failure(error, str(output))
    if sentence is None:
        raise error
    fail(sentence)


def say(message: str) -> None:
    """Progress lines, flushed at once: logs piped to a file or a pipeline runner show them as they happen."""
    typer.echo(message)
    sys.stdout.flush()


def given(context) -> set[str]:
    """The names of a command's parameters given on the command line (or the environment), not left at their
    defaults (`click.Context.get_parameter_source`); empty without a context (the command called from Python)."""
    if context is None:
        return set()
    return {parameter.name for parameter in context.command.params
            if (source := context.get_parameter_source(parameter.name)) is not None
            and source.name not in ("DEFAULT", "DEFAULT_MAP")}
