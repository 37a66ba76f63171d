"""The layout keeps the data flow: each package imports only from the packages below it (instances →
costmodels → solvers → interop → shardbench, the product → benchmarks, the harness), and no two modules
import each other, directly or around a loop, even through imports inside functions."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["instances", "costmodels", "solvers", "interop", "shardbench", "benchmarks"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import of the file, relative ones resolved."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, id(node) in top))
    return [(name, level) for name, level in found if name.split(".")[0] in LAYERS]


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an import names (an import of a name from a package resolves to the package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_packages_import_only_from_the_layers_below():
    modules = _project_modules()
    wrong = []
    for module, path in modules.items():
        layer = LAYERS.index(module.split(".")[0])
        for name, module_level in _imports(path):
            target = LAYERS.index(name.split(".")[0])
            if target > layer:
                wrong.append(f"{module} imports {name}{'' if module_level else ' (inside a function)'}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_cycles():
    modules = _project_modules()
    graph = {m: {o for name, _ in _imports(p) if (o := _owner(name, modules)) and o != m
                 and not m.startswith(o + ".")}  # a module may import its own package's __init__ names
             for m, p in modules.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_name_the_product_exports_is_what_it_names_once_every_module_is_loaded():
    # Loading a submodule binds its name on the package: a module named like an exported function would
    # then shadow the function (shardbench.replan was once the module, not the function).
    import importlib
    import inspect

    import shardbench

    for module in sorted(Path(shardbench.__file__).parent.glob("*.py")):
        importlib.import_module(f"shardbench.{module.stem}")
    for name in shardbench.__all__:
        assert not inspect.ismodule(getattr(shardbench, name)), name
