"""The package's shape, checked: no import cycle (function-local imports included), imports only go
down the layers, the data layers load without JAX, no error-code literal outside the error module,
every module declares ``__all__``, pyproject lists exactly the package folders, a wheel holds one
top-level package, and no module shadows a name its package exports.

The layers, lowest first: errors → _os → storage → format → data, pipeline → corpus, checkpoint → loader →
the package's own ``__init__`` → apps. A module may import from its own layer and those below. The
package's ``__init__`` names the loader's ``Loader`` but imports it (and JAX) only when it is asked
for, so ``import pskd_jax`` stays free of JAX.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tests.helpers import C_COMPILER_FOUND, ENV, ROOT, run_python

PACKAGE = ROOT / "pskd_jax"
APPS = ROOT / "apps"  # installed as pskd_jax.apps
LAYERS = {"errors": 0, "_os": 1, "storage": 2, "format": 3, "data": 4, "pipeline": 4, "corpus": 5, "checkpoint": 5,
          "loader": 6, "": 7, "apps": 8}  # "" is the package's own __init__
CODE = re.compile(r"E9\d{3}")


def module_files() -> dict[str, pathlib.Path]:
    """Every module of the installed package, by dotted name: pskd_jax/ and apps/ (as pskd_jax.apps)."""
    found = {}
    for directory, prefix in ((PACKAGE, ["pskd_jax"]), (APPS, ["pskd_jax", "apps"])):
        for path in sorted(directory.rglob("*.py")):
            parts = [*prefix, *path.relative_to(directory).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = module_files()


def resolve(package: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from … import`` statement of ``package`` imports from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(name: str, path: pathlib.Path) -> set[str]:
    """The package's modules ``name`` imports, wherever the import statement stands (function-local
    and ``TYPE_CHECKING`` imports included). ``from X import y`` counts as the module ``X.y`` when
    there is one, else as ``X``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            source = resolve(package, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    found.add(f"{source}.{alias.name}")
                elif source in MODULES:
                    found.add(source)
    found.discard(name)
    return found


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_the_graph_is_read():
    """The checks below see the imports they are about (a parser that found none would pass them)."""
    assert "pskd_jax.format.reader" in GRAPH["pskd_jax.format"]
    assert "pskd_jax.errors" in GRAPH["pskd_jax.format.reader"]
    assert "pskd_jax.apps.pskd" in MODULES and "pskd_jax._os.locks" in MODULES
    assert sum(map(len, GRAPH.values())) > 100


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
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


def test_cycles_are_found_where_there_are_some():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_imports_only_go_down_the_layers():
    upward = [f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})"
              for name, targets in GRAPH.items() for target in sorted(targets) if layer(target) > layer(name)]
    assert upward == []


def test_the_package_never_imports_its_apps():
    assert [(name, sorted(t for t in targets if t.startswith("pskd_jax.apps")))
            for name, targets in GRAPH.items()
            if not name.startswith("pskd_jax.apps") and any(t.startswith("pskd_jax.apps") for t in targets)] == []


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["pskd_jax", "pskd_jax.format", "pskd_jax.data", "pskd_jax.pipeline",
                                    "pskd_jax.corpus", "pskd_jax.checkpoint", "pskd_jax.errors", "pskd_jax._os",
                                    "pskd_jax.storage"])
def test_importing_a_layer_below_the_loader_loads_no_jax_and_no_app(module):
    code = f"""
        import sys
        import {module}
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib") or m.startswith("pskd_jax.apps")))
    """
    result = run_python(code, env=dict(ENV, PYTHONDONTWRITEBYTECODE="1"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["pskd_jax", "pskd_jax.apps.pskd"])
def test_importing_the_package_or_its_command_loads_nothing_heavy(module):
    """Start-up of a command stays small: ml_dtypes (most of a second), tqdm and the package
    metadata are imported where first needed, not with the package."""
    code = f"""
        import sys
        import {module}
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ml_dtypes", "tqdm", "jax", "tokenizers")
                     or m == "importlib.metadata"))
    """
    result = run_python(code, env=dict(ENV, PYTHONDONTWRITEBYTECODE="1"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.subprocess
def test_dtype_tables_answer_alike_before_and_after_ml_dtypes_is_imported():
    """The tables that name ml_dtypes' types are made when first needed: every answer given
    before ml_dtypes is imported is the one given after, and a checkpoint without its types
    saves and restores without importing it."""
    code = """
        import os, sys, tempfile
        import numpy as np
        import pskd_jax
        from pskd_jax.format import encodings as en, stored_dtypes as sd
        from pskd_jax.checkpoint import safetensors as st

        dtypes = [np.dtype(n) for n in ("<f8", ">f8", "<f4", "<f2", "int8", "uint16", "int64", "bool",
                                        "complex64", "complex128", "U3", "O")]
        names = ["float64", "float32", "float16", "int32", "uint8", "bool", "complex64", "nope", "float8_x"]

        def answers():
            return (
                [(sd.dtype_name(d), sd.form_of_dtype(d), en.is_real_dtype(d) if d.kind != "U" and d.kind != "O"
                  else None, en.encoding_of_dtype(d), sd.is_narrow_integer(d), en.is_bfloat16(d)) for d in dtypes],
                [sd.dtype_named(n) for n in names],
                [en.REAL_DTYPES[e] for e in (en.Encoding.F64, en.Encoding.F32)],
                [st.SAFETENSORS_DTYPES.get(k) for k in ("F32", "I64", "nope")],
                "float32" in sd._FLOATS, "int4x" in sd._NARROW,
            )

        before = answers()
        path = os.path.join(tempfile.mkdtemp(), "c.psk.d")
        tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int64(-3), "b": np.array([True])}
        pskd_jax.save(path, tree)
        back = pskd_jax.restore(path, as_numpy=True)
        assert all(np.array_equal(back[k], tree[k]) for k in tree)
        assert "ml_dtypes" not in sys.modules, "imported by the answers or the save"
        import ml_dtypes

        assert answers() == before
        assert en.is_bfloat16("bfloat16") and en.is_bfloat16(np.dtype(ml_dtypes.bfloat16))
        assert sd.dtype_named("bfloat16") == en.bfloat16 == en.REAL_DTYPES[en.Encoding.BF16]
        assert sd.dtype_named("float8_e4m3fn") == np.dtype(ml_dtypes.float8_e4m3fn)
        assert sd.dtype_name(np.dtype(ml_dtypes.int4)) == "int4" and sd.is_narrow_integer(np.dtype(ml_dtypes.int4))
        print("ok")
    """
    result = run_python(code, env=dict(ENV, PYTHONDONTWRITEBYTECODE="1"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the constant nodes that are docstrings (of the module, a class or a function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_no_error_code_literal_outside_the_error_module():
    found = []
    for name, path in MODULES.items():
        if name == "pskd_jax.errors":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = docstrings(tree)
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                  and CODE.fullmatch(node.value)]
    assert found == [], "raise the error's subclass instead of writing its code"
    errors = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    assert sum(isinstance(n, ast.Constant) and CODE.fullmatch(str(n.value)) is not None for n in ast.walk(errors)) >= 13


def top_level_bindings(tree: ast.Module) -> tuple[set[str], list[str] | None]:
    """The names a module binds at its top level (in if/try blocks too), and its ``__all__`` (None
    when it has none; a list of what it holds otherwise)."""
    bound, exported = set(), None

    def visit(statements) -> None:
        nonlocal exported
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                    if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                        exported = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return bound, exported


@pytest.mark.slow
def test_every_module_declares_all_of_names_it_defines():
    missing, unbound, repeated = [], [], []
    for name, path in MODULES.items():
        bound, exported = top_level_bindings(ast.parse(path.read_text(encoding="utf-8")))
        if exported is None:
            missing.append(name)
            continue
        unbound += [f"{name}.{n}" for n in exported if n not in bound]
        repeated += [f"{name}.{n}" for n in set(exported) if exported.count(n) > 1]
    assert (missing, unbound, repeated) == ([], [], [])


def package_folders() -> set[str]:
    return {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}


def test_pyproject_lists_every_package_folder_and_the_apps():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = project["tool"]["setuptools"]
    assert "pskd_jax._os" in package_folders()
    assert set(setuptools["packages"]) == package_folders() | {"pskd_jax.apps"}
    assert len(setuptools["packages"]) == len(set(setuptools["packages"]))
    assert setuptools["package-dir"] == {"pskd_jax.apps": "apps"} and (APPS / "__init__.py").exists()
    assert not [p for p in APPS.iterdir() if p.is_dir() and (p / "__init__.py").exists()]  # no package in apps/
    assert project["project"]["scripts"]["pskd"].startswith("pskd_jax.apps.")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("compiler", ["found", "failing"])
def test_a_wheel_holds_one_top_level_package(tmp_path, compiler):
    """Built from a copy of the tracked sources (the build writes build/ and egg-info beside them),
    without the network and without build isolation: the test extra installs what the build needs.
    With the machine's C compiler the wheel holds the compiled scan of packed segments; with a
    compiler that fails (``CC=false``, as a machine without one) the build still succeeds, without it."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")
    shutil.copytree(PACKAGE, source / "pskd_jax", ignore=ignore)
    shutil.copytree(APPS, source / "apps", ignore=ignore)
    env = ENV if compiler == "found" else {**ENV, "CC": "false"}
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", str(source), "-w", str(tmp_path / "wheels")], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("pskd_jax-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"pskd_jax"}, sorted(top)
    assert len(top) == 2
    assert {f"pskd_jax/apps/{p.name}" for p in APPS.glob("*.py")} <= set(names)
    assert {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")} <= set(names)
    assert "pskd_jax/py.typed" in names  # a user's type checker reads the package's annotations
    assert "pskd_jax/corpus/_segments.pyi" in names
    compiled = [n for n in names if n.startswith("pskd_jax/corpus/_segments.") and n.endswith((".so", ".pyd"))]
    if compiler == "failing":
        assert compiled == []
    elif C_COMPILER_FOUND:  # (a compiler here: the wheel holds the scan)
        assert len(compiled) == 1, names
    assert "pskd = pskd_jax.apps.pskd:run" in entry_points


def test_no_module_is_named_like_a_name_its_package_exports():
    """``pskd_jax.checkpoint.save`` must be the function, not a module that shadows it."""
    clashes = []
    for package, init in MODULES.items():
        if init.name != "__init__.py":
            continue
        tree = ast.parse(init.read_text(encoding="utf-8"))
        _, exported = top_level_bindings(tree)
        submodules = {n.rpartition(".")[2] for n in MODULES if n.rpartition(".")[0] == package}
        # exporting the submodule itself is no clash: ``from . import windows`` exports the module
        modules_exported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                            for alias in node.names
                            if resolve(package, node) == package and alias.name in submodules}
        clashes += [f"{package}.{n}" for n in sorted((set(exported or ()) & submodules) - modules_exported)]
    assert clashes == []


def test_the_package_marks_itself_typed():
    assert (PACKAGE / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["pskd_jax"]


def layout_map() -> dict[str, str]:
    """The code map of ``docs/layout.md``: each entry of its tree (``_os/``, ``format/``,
    ``errors.py``, ``apps/``, ``fuzz/, tools/``…) and the words written beside it."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    tree = text.split("```text\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    name = None
    for line in tree.splitlines():
        found = re.match(r"^(\s*)([^\s,]+(?:, [^\s,]+)*)\s*(.*)$", line)
        if found and len(found[1]) <= 2 and not line.startswith(" " * 3):
            name = found[2]
            entries[name] = found[3]
        elif name is not None:
            entries[name] += " " + line.strip()
    return entries


def test_the_layout_page_maps_every_folder_and_module_of_the_tree():
    entries = layout_map()
    words = {name: set(re.findall(r"[\w.]+", described)) for name, described in entries.items()}
    missing = []
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        described = words.get(f"{folder.name}/")
        if described is None:
            missing.append(f"pskd_jax/{folder.name}/")
            continue
        missing += [f"pskd_jax/{folder.name}/{m.name}" for m in sorted(folder.glob("*.py"))
                    if m.stem != "__init__" and m.stem not in described]
    missing += [f"pskd_jax/{p.name}" for p in sorted(PACKAGE.iterdir()) if p.is_file() and not p.name.startswith(".")
                and p.name not in entries]
    missing += [f"apps/{m.name}" for m in sorted(APPS.glob("*.py"))
                if m.stem != "__init__" and m.stem not in words["apps/"]]
    listed = {part.strip().rstrip("/") for name in entries for part in name.split(",")}
    ignored = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()]
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
               and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored if pattern)}
    missing += sorted(folders - listed - {"pskd_jax"})
    assert missing == []
