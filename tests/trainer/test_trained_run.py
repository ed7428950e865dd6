"""One owner loads a trained run: predict, evaluate, export and the pipelines' steps reach a run's config, task,
network and weights through `trainer.trained_run` alone (read statically, so a second path fails here)."""

import ast
import os

import pytest

from tests.test_import_layers import PACKAGES, REPOSITORY, import_graph

# What reads a run back: its config, its description, its weights. Only trained_run may call these (run_files
# defines the first two; the trainer's own set-up writes, and never reads, a run).
READERS = {"read_train_config", "read_model_info", "load_weights"}
OWNER = "trainer/trained_run.py"


def _calls(path: str) -> set[str]:
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), path)
    return {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree) if isinstance(node, ast.Call)}


def test_only_trained_run_reads_a_run_back():
    found = []
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(REPOSITORY, package)):
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, REPOSITORY)
                if name.endswith(".py") and relative != OWNER:
                    found += [f"{relative} calls {call}" for call in sorted(_calls(path) & READERS)]
    assert found == [], "a run is read back outside trainer/trained_run.py: " + "; ".join(found)


@pytest.mark.parametrize("reader", ["trainer.predict.predict", "trainer.evaluate", "trainer.export",
                                    "components.steps"])
def test_predict_evaluate_export_and_the_steps_load_through_trained_run(reader):
    """Following model_dir from predict (and the others) reaches the weights through one module: they import it, and
    none imports the old stops on the way (the task registry's restore, evaluate's loader, the plan)."""
    graph = import_graph()
    reached, frontier = set(), [reader]
    while frontier:  # every fullres module the reader's imports reach
        module = frontier.pop()
        for other in graph.get(module, ()):
            if other not in reached:
                reached.add(other)
                frontier.append(other)
    assert "trainer.trained_run" in reached
    if reader != "components.steps":  # the train step also imports the trainer (and with it the plan)
        assert not {"trainer.plan.compiled_step", "trainer.evaluate"} & (reached | set(graph[reader])) - {reader}, \
            sorted(reached)
