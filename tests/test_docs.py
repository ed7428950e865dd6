"""The README and docs/ speak to users: pages a reader finishes, links that lead somewhere, no words of the team.

Every page of docs/ is at most 15 KB and all of them together at most 200 KB; every relative link in the README
and docs/ points at a file that exists and, with `#anchor`, at a heading of that page; every `benchmarks/...py`
script the docs name exists; and no page speaks of the project's own process (issue numbers, the team, sessions).
"""

import os
import re

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPOSITORY, "docs")
PAGE_LIMIT = 15 * 1000  # the KB of the docs' own sizes (348 KB was 348,527 bytes)
TOTAL_LIMIT = 200 * 1000
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"(?<![\w/])benchmarks/[\w/]+\.py\b")
# The project's process in user docs: "issue 49", "issues 28-32", "#50", "round 6", the team, its sessions.
PROCESS_WORDS = re.compile(r"\bissues? \d|(?<![\w/&])#\d|\bround \d|\bthe lead\b|\bengineers?\b|\bsessions?\b"
                           r"|\bturn \d", re.IGNORECASE)


def _pages():
    return ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(DOCS) if name.endswith(".md"))


def _read(name):
    with open(os.path.join(REPOSITORY, name), encoding="utf-8") as file:
        return file.read()


def _prose(text):
    """The text outside fenced code blocks (a shell command may hold `#` comments)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def anchors(text):
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_anchors_follow_githubs_rule():
    text = "# Planning: `fullres plan --target`\n## The GPU's bytes, measured\n## Notes\n## Notes\n"
    assert anchors(text) == {"planning-fullres-plan---target", "the-gpus-bytes-measured", "notes", "notes-1"}


def test_every_page_is_at_most_15_kib_and_all_at_most_200_kib():
    sizes = {name: len(_read(name).encode("utf-8")) for name in _pages() if name.startswith("docs")}
    over = {name: size for name, size in sizes.items() if size > PAGE_LIMIT}
    assert not over, f"split these pages by what a reader comes for (at most {PAGE_LIMIT} bytes each): {over}"
    assert sum(sizes.values()) <= TOTAL_LIMIT, f"docs/ is {sum(sizes.values())} bytes, over {TOTAL_LIMIT}"


@pytest.mark.parametrize("name", _pages())
def test_no_page_speaks_of_the_projects_process(name):
    found = [match.group(0) for match in PROCESS_WORDS.finditer(_read(name))]
    assert not found, f"{name} speaks of the project's process ({found}): say what a thing does, not its history"


@pytest.mark.parametrize("name", _pages())
def test_every_relative_link_resolves(name):
    text = _read(name)
    broken = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(REPOSITORY, os.path.dirname(name), path)) if path else \
            os.path.join(REPOSITORY, name)
        if not os.path.exists(file):
            broken.append(f"{target}: no such file")
        elif anchor and file.endswith(".md") and anchor not in anchors(_read(os.path.relpath(file, REPOSITORY))):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{name}: " + "; ".join(broken)


@pytest.mark.parametrize("name", _pages())
def test_every_benchmark_script_named_exists(name):
    missing = sorted({path for path in SCRIPT.findall(_read(name)) if not os.path.exists(os.path.join(REPOSITORY, path))})
    assert not missing, f"{name} names benchmark scripts that do not exist: {missing}"


def test_the_checks_catch_what_they_are_for():
    assert PROCESS_WORDS.search("as issue 49 measured") and PROCESS_WORDS.search("before #50")
    assert PROCESS_WORDS.search("the lead runs it") and PROCESS_WORDS.search("seven sessions")
    assert not PROCESS_WORDS.search("jax-ml/jax issues/16894, the leading minors, 2 rounds")
    assert LINK.findall("see [a](b.md#c) and [d](https://e)") == ["b.md#c", "https://e"]
