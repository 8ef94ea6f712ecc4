"""The shape of the code, read from its syntax trees (nothing is imported): imports point one way
(wam_diff_ros -> core, wam_diff_training -> core, wam_diff_kernels -> core; no module circles, lazy imports inside functions
included) and no function in the core, the ROS package or training runs over MAX_FUNCTION_LINES."""
import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wam_diff_core", "wam_diff_kernels", "wam_diff_training", "wam_diff_ros")
# package -> packages it must not import (nor name by a module-path string)
FORBIDDEN = {
    "wam_diff_core": ("wam_diff_kernels", "wam_diff_training", "wam_diff_ros"),
    "wam_diff_training": ("wam_diff_ros",),
    "wam_diff_kernels": ("wam_diff_training", "wam_diff_ros"),
}
MAX_FUNCTION_LINES = 80
SHORT_FUNCTION_PACKAGES = ("wam_diff_core", "wam_diff_ros", "wam_diff_training")
IMPORTERS = {"import_module", "__import__", "find_spec"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of PACKAGES (a package is its __init__)."""
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _owner(name: str) -> str:
    """The nearest module of MODULES that `name` (a dotted import target) lies in, or "" for outside ones."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Modules of MODULES that an import statement of `module` loads (relative imports resolved)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        # `from pkg import mod` loads pkg.mod when that is a module, else a name defined in pkg
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    return [owner for owner in map(_owner, names) if owner and owner != module]


def _import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import of it}."""
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, node):
                    graph[module].setdefault(target, node.lineno)
    return graph


def _cycles(graph: dict[str, dict[str, int]], nodes) -> list[list[str]]:
    """Strongly connected components of more than one of `nodes` (Tarjan, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_module_imports_itself_back_through_a_circle():
    graph = _import_graph()
    cycles = _cycles(graph, MODULES)
    lines = []
    for component in cycles:
        members = set(component)
        edges = [f"{a} -> {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in members]
        lines.append("; ".join(edges))
    assert not cycles, f"{len(cycles)} import circle(s):\n" + "\n".join(lines)


def _module_path_strings(tree: ast.Module, packages: tuple[str, ...]) -> list[tuple[int, str]]:
    """String constants that name a module of `packages`: a dotted path ("wam_diff_training.report",
    "wam_diff_kernels.plugin:register"), or a bare package name handed to an import function."""
    dotted = re.compile(rf"({'|'.join(packages)})(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and dotted.fullmatch(node.value):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            if (func in IMPORTERS and isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and first.value.split(".")[0] in packages and not dotted.fullmatch(first.value)):
                found.append((node.lineno, first.value))
    return sorted(found)


def test_imports_point_down_to_the_core_and_never_up():
    graph = _import_graph()
    offenders = []
    for module in sorted(MODULES):
        banned = FORBIDDEN.get(module.split(".")[0], ())
        if not banned:
            continue
        for target, line in sorted(graph.get(module, {}).items()):
            if target.split(".")[0] in banned:
                offenders.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
        for line, text in _module_path_strings(TREES[module], banned):
            offenders.append(f"{MODULES[module].relative_to(ROOT)}:{line} names the module path {text!r}")
    assert not offenders, f"{len(offenders)} import(s) pointing up or sideways:\n" + "\n".join(offenders)


def test_no_function_runs_over_the_line_limit():
    offenders = []
    for module in sorted(MODULES):
        if module.split(".")[0] not in SHORT_FUNCTION_PACKAGES:
            continue
        for node in ast.walk(TREES[module]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not offenders, (f"{len(offenders)} function(s) over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders))


def test_the_checks_see_a_circle_an_upward_import_and_a_module_path_string():
    """The walkers themselves: a planted circle is found, relative imports resolve, strings are caught."""
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1, "e": 1}, "e": {"d": 1}, "f": {"f": 1}}
    assert _cycles(graph, "abcdef") == [["a", "b", "c"], ["d", "e"]]
    node = ast.parse("from ..extensions import Registry").body[0]
    assert _targets("wam_diff_core.model.runner", node) == ["wam_diff_core.extensions"]
    tree = ast.parse('LAZY = {"report": "wam_diff_training.report"}\nimportlib.import_module("wam_diff_kernels")\nHELP = "training data"')
    assert _module_path_strings(tree, ("wam_diff_kernels", "wam_diff_training")) == [
        (1, "wam_diff_training.report"), (2, "wam_diff_kernels")]
