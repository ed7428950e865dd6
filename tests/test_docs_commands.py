"""Every `fullres ...` command the README and docs/ show parses with the real CLI.

Each command line in a fenced code block (```bash, ```sh, ```console or a bare
```) is parsed by the `fullres` click command tree without running anything:
`make_context` on each command of the chain checks that the subcommands exist,
that every option exists, and that every value converts to the option's type
(an integer option given `many` fails). A doc that names a flag the CLI lacks
fails here, not in a reader's terminal.

Conventions the parser follows: `\\` continuations are joined; `# ...` comments
are dropped; in ```console blocks only `$ ` lines are commands; `uv run`,
`python3 -m uv run --locked` and the like before `fullres` are launchers; a bare
`...` token elides the rest of a command, so required options may be missing
from that line (the options it does give are still checked). Placeholders such
as `RUN_DIR` or `gs://BUCKET/...` are ordinary string values.
"""

import os
import re
import shlex

import pytest
import typer

from pipelines import cli

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
LAUNCHERS = {"python", "python3", "-m", "uv", "run", "--locked", "--frozen"}
REDIRECTIONS = {">", ">>", "<", "2>"}
SEPARATORS = {"&&", "||", ";", "|", "(", ")", "&"}
ELISION = "..."


def _documents():
    names = ["README.md"] + sorted(
        os.path.join("docs", name) for name in os.listdir(os.path.join(REPOSITORY, "docs")) if name.endswith(".md")
    )
    return names


def _code_lines(text):
    """(line number, line) of every line inside a shell-like fenced block, continuations joined."""
    lines = text.splitlines()
    fence = None
    pending, pending_start = "", 0
    for number, line in enumerate(lines, start=1):
        opening = re.match(r"^\s*```(\S*)\s*$", line)
        if fence is None:
            if opening:
                fence = opening.group(1)
            continue
        if re.match(r"^\s*```\s*$", line):
            fence = None
            continue
        if fence not in SHELL_BLOCKS:
            continue
        if fence == "console" and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        if not pending:
            pending_start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending_start, pending + line
        pending = ""


def _fullres_commands(line):
    """The argument lists of the `fullres` commands on one shell line."""
    if not re.search(r"(^|[\s;&|(])fullres\s", line):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands, segment, redirected = [], [], False
    for token in tokens + [";"]:
        if token in REDIRECTIONS:  # `> plan.json`: the file is the shell's, not an argument
            redirected = True
            continue
        if token not in SEPARATORS:
            if redirected:
                redirected = False
                continue
            segment.append(token)
            continue
        if "fullres" in segment:
            position = segment.index("fullres")
            if all(word in LAUNCHERS for word in segment[:position]):
                commands.append(segment[position + 1:])
        segment = []
    return commands


def _collect():
    found = []
    for name in _documents():
        with open(os.path.join(REPOSITORY, name)) as file:
            text = file.read()
        for number, line in _code_lines(text):
            for arguments in _fullres_commands(line):
                found.append(pytest.param(arguments, id=f"{name}:{number}"))
    return found


def _is_missing_parameter(error):
    return any(kind.__name__ == "MissingParameter" for kind in type(error).__mro__)


def dry_parse(arguments):
    """Parse `fullres ARGUMENTS` as the CLI would, without running it; return a problem or None."""
    elided = ELISION in arguments
    command, name, parent, remaining = typer.main.get_command(cli.app), "fullres", None, list(arguments)
    try:
        while hasattr(command, "resolve_command"):  # a group: its own options, then a subcommand
            # fullres's group options are all flags (--verbose, --help), so they are the leading "-" words.
            count = next((i for i, word in enumerate(remaining) if not word.startswith("-")), len(remaining))
            if count == len(remaining):
                return f"`{name}` needs a subcommand"
            context = command.make_context(name, remaining[:count + 1], parent=parent)
            name, command, remaining = command.resolve_command(context, remaining[count:])
            parent = context
        context = command.make_context(name, remaining, parent=parent, allow_extra_args=True)
    except typer.TyperException as error:
        if elided and _is_missing_parameter(error):
            return None
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        return f"{type(error).__name__}: {message}"
    extra = [word for word in context.args if word != ELISION]
    if extra and not command.context_settings.get("allow_extra_args"):  # preprocess passes Beam's options on
        return f"unexpected extra argument(s) {extra}"
    return None


DOC_COMMANDS = _collect()


def test_the_docs_show_commands():
    readme = [command for command in DOC_COMMANDS if command.id.startswith("README.md:")]
    assert len(readme) >= 5, "the README's code blocks should show the main fullres commands"
    assert len(DOC_COMMANDS) >= 15


@pytest.mark.parametrize("arguments", DOC_COMMANDS)
def test_documented_command_parses(arguments):
    problem = dry_parse(arguments)
    assert problem is None, f"fullres {shlex.join(arguments)}\n  {problem}"


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["train", "--train", "x", "--output", "y", "--no-such-flag", "3"], "No such option"),
        (["plan", "--batch-size", "many"], "--batch-size"),
        (["no-such-command"], "No such command"),
        (["preprocess"], "needs a subcommand"),
        (["predict", "--model", "m", "--input", "i"], "Missing"),
        (["demo", "extra"], "extra"),
        (["preprocess", "ct", "--input", "i", "--output", "o", "--num-shards", "x"], "--num-shards"),
        (["--no-such-global", "demo"], "No such option"),
    ],
)
def test_the_dry_parse_refuses_what_the_cli_refuses(arguments, expected):
    problem = dry_parse(arguments)
    assert problem is not None and expected in problem, problem


def test_continuations_comments_prompts_and_launchers():
    text = "\n".join([
        "```console",
        "$ uv run fullres plan \\",
        "    --partitions 1,2  # a comment",
        "fullres train --not-a-command-output",
        "```",
        "```bash",
        "python3 -m pip install uv && python3 -m uv run --locked fullres demo",
        "echo fullres: error: not a command",
        "```",
        "```python",
        "fullres demo --ignored",
        "```",
    ])
    commands = [command for _, line in _code_lines(text) for command in _fullres_commands(line)]
    assert commands == [["plan", "--partitions", "1,2"], ["demo"]]
