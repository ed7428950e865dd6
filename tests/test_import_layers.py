"""Imports run one way, read statically: every import of every module (function-local ones too) is checked.

The layers, lowest first. A module may import its own layer and the layers below it, never one above; and
no set of modules may import each other in a circle, whatever their layers. Imports inside an
`if __name__ == "__main__":` block count like any other: an entry point that imports the command line
which imports it back is a circle too (a program's entry point is a module of its own, `trainer/__main__.py`,
above everything it calls).
"""

from __future__ import annotations

import ast
import os

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("common", "preprocessing", "trainer", "components", "pipelines", "fullres")

LAYERS = (
    "common",
    "preprocessing.records",
    "preprocessing.ct",
    "preprocessing.images",
    "preprocessing.video",
    "preprocessing.beam",
    "preprocessing.cli",
    "trainer.parallel",
    "trainer.models",
    "trainer.augment",
    "trainer.config",
    "trainer.presets",
    "trainer.config_resolution",
    "trainer.data",
    "trainer.engine",
    "trainer.tasks",
    "trainer.plan",
    "trainer.trained_run",
    "trainer.export",
    "trainer.evaluate",
    "trainer.resolved_run",
    "trainer.run_setup",
    "trainer.train_loop",
    "trainer.train",
    "trainer.predict",
    "trainer.option_conflicts",
    "trainer.cli_help",
    "trainer.cli_options",
    "trainer.cli_predict",
    "trainer.cli_rent",
    "trainer.cli",
    "trainer.__main__",
    "fullres",
    "components",
    "pipelines",
)


def module_files() -> dict[str, str]:
    """Dotted module name -> path, for every module of the fullres packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPOSITORY, package)):
            for name in files:
                if name.endswith(".py"):
                    relative = os.path.relpath(os.path.join(folder, name), REPOSITORY)[:-3]
                    dotted = relative.replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = os.path.join(folder, name)
    return found


def imported_modules(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The fullres modules `name` imports anywhere in its file (package `__init__`s of each included)."""
    with open(path) as file:
        tree = ast.parse(file.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    found = set()
    for target in targets:
        if target.split(".")[0] not in PACKAGES:
            continue
        parts = target.split(".")
        found.update(".".join(parts[:end]) for end in range(1, len(parts) + 1) if ".".join(parts[:end]) in modules)
    found.discard(name)
    return found


def layer_of(name: str) -> int:
    matches = [index for index, layer in enumerate(LAYERS) if name == layer or name.startswith(layer + ".")]
    if matches:
        return max(matches, key=lambda index: len(LAYERS[index]))
    return -1  # a package's own __init__ (`trainer`, `preprocessing`): imports nothing of fullres (checked below)


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_layer_and_package_roots_import_nothing():
    graph = import_graph()
    roots = [name for name in graph if layer_of(name) == -1]
    assert sorted(roots) == ["preprocessing", "trainer"], f"modules outside every layer: {roots}; add them to LAYERS"
    for root in roots:
        assert not graph[root], f"{root}/__init__.py imports {sorted(graph[root])}; a package root imports nothing"


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_upward_imports():
    graph = import_graph()
    upward = [f"{name} ({LAYERS[layer_of(name)]}) imports {other} ({LAYERS[layer_of(other)]})"
              for name, imports in sorted(graph.items()) for other in sorted(imports)
              if layer_of(other) > layer_of(name)]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_check_sees_function_local_imports_and_cycles(tmp_path):
    """The checker itself: a cycle hidden in a function-local import, and an upward import, are both found."""
    module_a = tmp_path / "a.py"
    module_a.write_text("def f():\n    from trainer import train\n")
    modules = {"trainer.engine.a": str(module_a), "trainer.train": "", "trainer": ""}
    imports = imported_modules("trainer.engine.a", str(module_a), modules)
    assert imports == {"trainer", "trainer.train"}
    assert layer_of("trainer.train") > layer_of("trainer.engine.a")
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    # An entry point's `__main__` block imports too: `train` run as a program, calling the CLI that imports
    # `train`, is a circle (it was, until trainer/__main__.py took the entry point).
    main_block = tmp_path / "b.py"
    main_block.write_text("if __name__ == '__main__':\n    from trainer import cli\n")
    cli_module = tmp_path / "cli.py"
    cli_module.write_text("def train():\n    from trainer import train\n")
    modules = {"trainer.cli": str(cli_module), "trainer.train": str(main_block), "trainer": ""}
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items() if path}
    assert graph["trainer.train"] == {"trainer", "trainer.cli"}
    assert cycles(graph) == [["trainer.cli", "trainer.train"]]
