"""The package's layout: one folder per stage of the data flow, each importing only from the folders
before it, no import cycle, every public name documented where it is defined, and no name defined
twice. Read from the source files (their syntax trees), so it holds for code that is not run."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pybubble"
ORDER = ("config", "costs", "llm", "problem", "schedule", "data", "viz", "measure", "planner", "placement", "runtime",
         "integrations", "testing")
"""The stages of the data flow, in order."""
TOP_LEVEL = {"__init__", "__main__", "_native", "_moved"}
"""Modules outside the folders: the public API, ``python -m pybubble``, the core's import check and
the old names of moved modules."""
COMMAND_LINE = "cli"
"""The command line's folder: on top of the data flow, it may import every folder; none imports it."""


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(("pybubble",) + parts)] = ast.parse(path.read_text(), str(path))
    return out


def is_package(name: str) -> bool:
    return (PACKAGE.joinpath(*name.split(".")[1:]) / "__init__.py").exists() or name == "pybubble"


def imports(name: str, tree: ast.Module) -> set[str]:
    """Every pybubble module `name` imports, anywhere in the file (functions included)."""
    package = name if is_package(name) else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pybubble"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "pybubble":
                continue
            for alias in node.names:  # `from .x import y` imports module x.y when y is a module
                sub = f"{target}.{alias.name}"
                found.add(sub if (PACKAGE.joinpath(*sub.split(".")[1:]).with_suffix(".py").exists()
                                  or is_package(sub) or sub == "pybubble._core") else target)
    return found


def stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and is_package(name)) else None


MODULES = modules()


def test_every_folder_is_a_stage_of_the_data_flow():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= {*ORDER, COMMAND_LINE}, f"folders outside the data flow: {folders - {*ORDER, COMMAND_LINE}}"
    top = {name.split(".")[1] for name in MODULES if stage(name) is None and name != "pybubble"}
    assert top <= TOP_LEVEL, f"modules outside the folders: {top - TOP_LEVEL}"


def test_folders_import_only_from_earlier_folders():
    backwards = []
    for name, tree in MODULES.items():
        mine = stage(name)
        if mine in (None, COMMAND_LINE):
            continue
        for target in imports(name, tree):
            theirs = stage(target)
            if theirs == COMMAND_LINE:
                backwards.append(f"{name} imports the command line's {target}")
            elif theirs is None:
                if target not in ("pybubble._core", "pybubble._native"):
                    backwards.append(f"{name} imports the top-level {target}")
            elif ORDER.index(theirs) > ORDER.index(mine):
                backwards.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not backwards, "\n".join(backwards)


def test_no_import_cycle():
    graph = {name: {t for t in imports(name, tree) if t in MODULES and t != name} for name, tree in MODULES.items()}
    # a package's __init__ that re-exports is entered from its modules' imports of siblings; only
    # the top-level API package re-exports, and nothing inside imports it
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def _docstring_after(body: list[ast.stmt], i: int) -> bool:
    nxt = body[i + 1] if i + 1 < len(body) else None
    return isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)


def undocumented(name: str, tree: ast.Module) -> list[str]:
    """Public functions, classes, methods, properties, constants and dataclass fields of a module
    without a docstring (a field's or constant's docstring is the string literal after it)."""
    missing = []
    public = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            public = set(ast.literal_eval(node.value))
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(f"{name}.{node.name}")
            if isinstance(node, ast.ClassDef):
                for j, member in enumerate(node.body):
                    if isinstance(member, ast.FunctionDef) and not member.name.startswith("_") \
                            and ast.get_docstring(member) is None:
                        missing.append(f"{name}.{node.name}.{member.name}")
                    if isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name) \
                            and not member.target.id.startswith("_") and not _docstring_after(node.body, j):
                        missing.append(f"{name}.{node.name}.{member.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in public and not _docstring_after(tree.body, i):
                    missing.append(f"{name}.{t.id}")
    return missing


def test_every_public_name_is_documented_where_it_is_defined():
    missing = [m for name, tree in MODULES.items() for m in undocumented(name, tree)]
    assert not missing, "undocumented: " + ", ".join(missing)


def test_every_module_says_what_it_is():
    assert [name for name, tree in MODULES.items() if ast.get_docstring(tree) is None] == []


def test_no_name_is_defined_twice():
    """A public function, class or constant (an upper-case name) is defined in one module only."""
    where = defaultdict(list)
    for name, tree in MODULES.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_") \
                    and stage(name) != COMMAND_LINE and node.name != "main":
                where[node.name].append(name)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_"):
                    where[t.id].append(name)
    twice = {n: ms for n, ms in where.items() if len(ms) > 1}
    assert not twice, twice


@pytest.mark.parametrize("check", ["positive integer"])
def test_the_positive_integer_check_exists_once(check):
    """Every module checks arguments through pybubble.config.checks: the check's message is written
    there and nowhere else."""
    writers = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if f"is not a {check}" in p.read_text()]
    assert writers == ["config/checks.py"]


def bound_names(tree: ast.Module) -> dict[str, str]:
    """The names a module's top level binds to something other than a module of its own package,
    each with what binds it (a definition, an assignment or an import of a name from a module)."""
    bound = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound[node.name] = f"def {node.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    bound[t.id] = f"{t.id} = ..."
        elif isinstance(node, ast.ImportFrom) and not (node.level == 1 and node.module is None):
            for alias in node.names:  # `from . import sub` binds the subpackage itself: fine
                bound[alias.asname or alias.name] = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
    return bound


def test_no_public_name_shadows_a_subpackage():
    """`import pybubble.X.Y as y` resolves X as an attribute of pybubble first: a function or class
    named like the subpackage X hides it ("cannot import name 'Y' from 'X'")."""
    shadows = []
    for name, tree in MODULES.items():
        if not is_package(name):
            continue
        folder = PACKAGE.joinpath(*name.split(".")[1:])
        subpackages = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        shadows += [f"{name}.{n}: {how}" for n, how in bound_names(tree).items() if n in subpackages]
    assert not shadows, "\n".join(shadows)


@pytest.mark.parametrize("sub", [*ORDER, COMMAND_LINE])
def test_every_subpackage_imports_by_its_dotted_name(sub):
    """Each subpackage's modules import as `import pybubble.SUB.MODULE as m` (no name the package
    binds hides a module: the runtime's `launch` function lives in `launcher`), and every name of
    their ``__all__`` exists."""
    import importlib

    if sub == "runtime":
        pytest.importorskip("torch")
    for path in sorted((PACKAGE / sub).glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"pybubble.{sub}.{path.stem}")
        namespace: dict = {}
        exec(f"import pybubble.{sub}.{path.stem} as m", namespace)
        assert namespace["m"] is module
        # and `from pybubble.SUB.MODULE import *` works: every name of __all__ is defined
        assert [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)] == [], module.__name__


RUNTIME = sorted((PACKAGE / "runtime").glob("*.py"))
TRAINER = sorted((PACKAGE / "testing" / "mllm").glob("*.py"))
"""The test trainer (pybubble.testing.mllm): a user of the runtime, held to its rules."""
EXAMPLES = sorted((PACKAGE.parent / "examples").glob("*.py"))
TORCH_SEAMS = "torch_seams.py"
"""The one runtime module that names torch's private attributes."""
EVERY = sorted(PACKAGE.rglob("*.py"))


def _sizes(path: Path) -> list[tuple[str, str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(type(n).__name__, n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_no_module_class_or_function_is_past_what_one_reads_at_once():
    """The whole package and the examples: no module over 500 lines, no class over 250, no function
    over 60."""
    long = [f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in [*EVERY, *EXAMPLES]
            if (n := len(p.read_text().splitlines())) > 500]
    long += [f"{p.relative_to(PACKAGE.parent)}: {kind} {name} ({lines} lines)" for p in [*EVERY, *EXAMPLES]
             for kind, name, lines in _sizes(p) if lines > (250 if kind == "ClassDef" else 60)]
    assert not long, "\n".join(long)


def test_no_two_modules_share_a_name():
    """One name, one role: no two modules of the package share a file name (``__init__``,
    ``__main__`` and the command line's modules, each named after its command, aside)."""
    where = defaultdict(list)
    for p in EVERY:
        if p.stem not in ("__init__", "__main__") and p.parent.name != COMMAND_LINE:
            where[p.stem].append(str(p.relative_to(PACKAGE)))
    assert {n: ps for n, ps in where.items() if len(ps) > 1} == {}


def test_the_runtime_is_built_from_few_parameters():
    """EncoderRuntime takes the encoder, its stages, schedule and example, the groups, the options and
    the device (and, deprecated, the old keyword arguments): at most 8 parameters."""
    tree = ast.parse((PACKAGE / "runtime" / "encoder_runtime.py").read_text())
    init = next(m for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EncoderRuntime"
                for m in n.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
    a = init.args
    params = [*a.posonlyargs, *a.args[1:], *a.kwonlyargs] + ([a.vararg] if a.vararg else []) + ([a.kwarg] if a.kwarg else [])
    assert len(params) <= 8, [p.arg for p in params]


def test_no_caller_asks_which_executor_it_has():
    """The host and CUDA executors differ only in their methods: no ``.timed`` and no ``isinstance``
    on an executor outside pybubble/runtime/executors.py."""
    found = []
    for p in EVERY:
        if p.name == "executors.py" and p.parent.name == "runtime":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "timed":
                found.append(f"{p.name}:{node.lineno}: .timed")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and "Executor" in ast.unparse(node.args[1])):
                found.append(f"{p.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def _private_uses(path: Path) -> list[str]:
    """``x._name`` where x is not ``self``/``cls`` (another object's or module's private name), and
    ``from pybubble... import _name``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pybubble")):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_runtime_module_uses_another_modules_private_names():
    """Only torch_seams.py names torch's private seams; no module reaches into another's
    underscore names (the runtime's and the trainer's; aten's op names are not seams)."""
    allowed = ("._exit",  # os._exit: public despite its name
               "._attn_implementation")  # transformers' switch of attention, in testing/mllm/packed.py only
    found = [u for p in [*RUNTIME, *TRAINER, *EXAMPLES] if p.name != TORCH_SEAMS for u in _private_uses(p)
             if not u.endswith(allowed) and "._scaled_dot_product" not in u and "._fused_rms_norm" not in u]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", sorted((PACKAGE / "placement").glob("*.py")), ids=lambda p: p.name)
def test_the_placement_package_imports_no_torch(path):
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n.split(".")[0] == "torch"}
