"""The house's imports flow one way: _names -> events -> facts -> decide -> act -> engine -> hooks ->
report/cli. Every import counts, lazy ones inside functions included (they are how the start-up path
stays cheap, not a licence to reach up), and so do `sys.modules.get("fastpath_hooks....")` lookups.
No import circle anywhere, inside a layer included (the hook layer's modules are handed the hooks'
registry, `hooks.HOOKS`, instead of importing the module that holds it). act/ takes only data types and
constants from decide/ (capitalised names): the plan carries what act/ needs, it never calls decide/."""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

import fastpath_hooks

PACKAGE = "fastpath_hooks"
ROOT = os.path.dirname(fastpath_hooks.__file__)

# lowest first; a module may import its own layer or lower ones
LAYERS = (
    ("_names", "_registry"),
    ("events",),
    ("facts",),
    ("decide",),
    ("act",),
    ("engine",),
    ("hooks",),
    ("report", "cli", "__main__"),
    ("",),                       # the package itself: install()/uninstall() hand over to hooks
)


def modules(root: str, package: str) -> dict:
    """dotted name -> source path, for every module of the package under `root`."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join([package, *rel])] = os.path.join(folder, name)
    return out


def imports(name: str, path: str, known: dict, names: set | None = None) -> set:
    """The package modules `name` imports (anywhere in its body) or looks up in sys.modules; `names` collects
    (module, name) for each `from module import name` (a module imported that way is its own name)."""
    is_package = path.endswith("__init__.py")
    here = name if is_package else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                targets.append(sub if sub in known else origin)
                if names is not None:
                    names.add((origin, alias.name))
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGE + "."):
            targets = [node.value]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    inner = name.split(".", 1)[1] if "." in name else ""
    head = inner.split(".")[0]
    for rank, heads in enumerate(LAYERS):
        if head in heads:
            return rank
    raise AssertionError(f"{name}: in no layer - add it to LAYERS")


def circles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(root: str, package: str = PACKAGE) -> list:
    known = modules(root, package)
    named = {name: set() for name in known}
    graph = {name: imports(name, path, known, named[name]) for name, path in known.items()}
    found = []
    act, decide = (next(i for i, heads in enumerate(LAYERS) if head in heads) for head in ("act", "decide"))
    for name in sorted(n for n in known if layer_of(n) == act):
        for origin, imported in sorted(named[name]):
            if origin in known and layer_of(origin) == decide and not imported[:1].isupper():
                found.append(f"{name} imports {imported} from {origin}: act/ takes only data types from decide/")
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                found.append(f"{name} imports {target}, a higher layer")
    for component in circles(graph):
        found.append("import circle: " + " -> ".join(component))
    return found


def test_imports_flow_one_way():
    assert problems(ROOT) == []


def test_the_leaf_is_stdlib_only_and_imports_nothing_at_module_level():
    tree = ast.parse(open(os.path.join(ROOT, "_names.py"), encoding="utf-8").read())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert top == [], "the start-up path loads _names: keep its imports inside functions"
    # urllib.parse: only for a find-links URL with a %-escape; logging: only where something loaded it already;
    # _sha2/_sha256: CPython's own sha256, where hashlib is not loaded yet
    stdlib = ("os", "sys", "hashlib", "urllib.parse", "logging", "_sha2", "_sha256")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module in stdlib, ast.unparse(node)
        elif isinstance(node, ast.Import):
            assert all(a.name in stdlib for a in node.names), ast.unparse(node)


def test_the_registry_leaf_is_stdlib_only():
    """_registry (the kernel registry's index and a user's kernels) is loaded by the hooks too: the
    leaf _names at module level, the stdlib (json, tomllib; os and stat, which os loads) only where a user's pins
    file is read."""
    tree = ast.parse(open(os.path.join(ROOT, "_registry.py"), encoding="utf-8").read())
    top = [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert top == ["from ._names import GATES_MODULE, HUB_MODULE, MASKS_MODULE, PINS, environ_of"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):   # tomli: tomllib's own backport, where Python 3.10 has no tomllib
            assert all(a.name in ("os", "stat", "json", "tomllib", "tomli") for a in node.names), ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module == "_names", ast.unparse(node)


@pytest.mark.parametrize("files, expected", [
    ({"facts/__init__.py": "", "facts/probe.py": "def f():\n    from ..act import state\n",
      "act/__init__.py": "", "act/state.py": ""},
     ["pkg.facts.probe imports pkg.act.state, a higher layer"]),
    ({"act/__init__.py": "", "act/a.py": "from . import b\n", "act/b.py": "def f():\n    from .a import x\n"},
     ["import circle: pkg.act.a -> pkg.act.b"]),
    ({"hooks/__init__.py": "from . import gates\n", "hooks/gates.py": "from .. import hooks\n"},
     ["import circle: pkg.hooks -> pkg.hooks.gates"]),
    ({"events.py": "import sys\nm = sys.modules.get('pkg.engine')\n", "engine.py": ""},
     ["pkg.events imports pkg.engine, a higher layer"]),
    ({"decide/__init__.py": "", "decide/plan.py": "", "act/__init__.py": "",
      "act/run.py": "from ..decide.plan import Step, invocation\n\ndef f():\n    from ..decide import plan\n"},
     ["pkg.act.run imports plan from pkg.decide: act/ takes only data types from decide/",
      "pkg.act.run imports invocation from pkg.decide.plan: act/ takes only data types from decide/"]),
])
def test_the_checker_finds_what_it_is_for(tmp_path, files, expected):
    """The check itself can fail: an upward lazy import, a circle (inside one layer too), an upward
    sys.modules lookup and a function (or module) act/ takes from decide/ are found."""
    global PACKAGE
    (tmp_path / "__init__.py").write_text("")
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    saved, PACKAGE = PACKAGE, "pkg"
    try:
        assert problems(str(tmp_path), "pkg") == expected
    finally:
        PACKAGE = saved
