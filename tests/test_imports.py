"""The package's module graph has no cycles, counting imports inside functions too (they hid one before)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "regulargpt"


def _module_graph() -> dict[str, set[str]]:
    """module → the package modules it imports anywhere in its file (``from pkg import submodule`` counts as the
    submodule, ``from pkg import name`` as the package's ``__init__``)."""
    files = {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): f
             for f in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, …, a], or None (depth-first search, grey/black colouring)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_of_the_package_imports_itself_back() -> None:
    graph = _module_graph()
    assert "regulargpt.model.dilation" in graph["regulargpt.model.flex_sliding"]  # the graph sees real imports
    assert _cycle(graph) is None


def test_evaluation_model_and_run_directory_import_nothing_from_training_or_experiments() -> None:
    """Layers: model, run_directory < evaluation < train < experiments; evaluation and the experiment tables read run
    directories through ``regulargpt.run_directory``, never through the trainer."""
    graph = _module_graph()
    assert "regulargpt.train.formal_trainer" in graph["regulargpt.experiments.formal_sweep"]  # sees real imports
    assert "regulargpt.run_directory" in graph["regulargpt.experiments.formal_tables"]

    def upper(target: str) -> bool:
        return any(target == layer or target.startswith(f"{layer}.")
                   for layer in ("regulargpt.train", "regulargpt.experiments"))

    wrong = {module: sorted(filter(upper, targets)) for module, targets in graph.items()
             if module.startswith(("regulargpt.evaluation", "regulargpt.model", "regulargpt.run_directory"))
             and any(map(upper, targets))}
    assert wrong == {}
