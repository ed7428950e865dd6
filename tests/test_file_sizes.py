"""A file is a room you can read in one sitting (STYLE.md 2): no module of fullres's packages is over 400 lines."""

import os

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("common", "preprocessing", "trainer", "components", "pipelines", "fullres", "benchmarks")
LIMIT = 400


def test_no_module_is_over_400_lines():
    long = []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPOSITORY, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as file:
                        count = sum(1 for _ in file)
                    if count > LIMIT:
                        long.append(f"{os.path.relpath(path, REPOSITORY)} ({count} lines)")
    assert not long, f"over {LIMIT} lines, split into rooms that read in one sitting: {', '.join(long)}"
