"""The floors of the package and the one direction of imports between them (issue 23, item 5).

Each module gets a floor by its path (FLOORS, most specific pattern wins); an import of mmrun code may go to
the same floor or one below, never above, and framework code (backend/<framework>/, engines/<framework>/) is
imported only from that framework's own folders or from the neutral part of its own package (the backend's
selection, the engine registry). Lazy imports inside functions count: they run too. The AST is read, nothing
is imported, so the whole walk takes well under a second.
"""
from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "mmrun"
SKIP_DIRS = {"tests", "docs", "scripts", "benchmarks", ".venv", "build", "dist", ".git", "__pycache__"}

# (path pattern, floor, level): lower levels are imported by higher ones, never the reverse. The most specific
# pattern (the longest) that matches a module's path decides its floor. Entries sit in models/ because users run
# them by path, but they are the top floor.
FLOORS: tuple[tuple[str, str, int], ...] = (
    ("__init__.py", "root", 0),  # the version only
    ("common/*", "common", 0),
    ("backend/*", "backend", 1),
    ("data/*", "data", 2),
    ("precision/*", "precision", 2),
    ("features/*", "features", 2),
    ("checkpoint/formats/*", "checkpoint-formats", 2),  # file formats: numpy, no model, no trainer
    ("models/*", "models", 3),
    ("engines/*", "engines", 4),
    ("training/*", "training", 5),
    ("models/pretrain_*.py", "entries", 6),
    ("models/*_demo.py", "entries", 6),
    ("checkpoint/convert_cli.py", "entries", 6),
    ("models/inference_*.py", "entries", 6),
    ("models/evaluate_*.py", "entries", 6),
    ("models/get_wan_feature.py", "entries", 6),
    ("models/inference_sora.py", "entries", 6),
    ("launchers/*", "launchers", 6),
    ("analyse/*", "analyse", 6),
    ("__main__.py", "launchers", 6),
    # The converters (`mmrun convert`, mm-convert's command lines) write mmrun checkpoints through the trainer's
    # store: the entries' floor, in a room of their own (checkpoint/), never inside a model folder.
    ("checkpoint/*", "entries", 6),
    # Standard library only, so any floor may call them: the worker side of the launcher's watchdog (the loop
    # beats it each step) and the per-phase timers the backends' train steps carry.
    ("launchers/heartbeat.py", "stdlib-only", 0),
    ("precision/timers.py", "stdlib-only", 0),
)
# Known upward imports, each with its reason; the test fails when one disappears, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {
    ("backend/torch/profiler.py", "mmrun.precision.profiling"):
        "the profiler fills precision's Report/OpRow types; precision.profiling calls the backend back",
    ("backend/mindspore/profiler.py", "mmrun.precision.profiling"):
        "the profiler fills precision's Report/OpRow types; precision.profiling calls the backend back",
}
# Folders that import one framework; each may be imported only from itself (never from the other framework's),
# from the neutral part of the package it sits in (backend/ selects its framework folder), or from the engine
# registry (engines/*.py: the facades through which training and the entries reach one framework's code).
FRAMEWORK_GATES = ("engines",)
FRAMEWORK_DIRS: dict[str, str] = {
    "backend/torch/": "torch", "backend/mindspore/": "mindspore",
    "engines/torch/": "torch", "engines/mindspore/": "mindspore",
}


@dataclass(frozen=True)
class Floor:
    name: str
    level: int
    framework: str | None  # "torch", "mindspore", or None for framework-neutral code
    package: str  # top folder: backend, engines, models, ...


def floor_of(path: str) -> Floor:
    """The floor of a module given its path relative to the repository root (posix form)."""
    matches = [(len(pattern), name, level) for pattern, name, level in FLOORS if fnmatch.fnmatch(path, pattern)]
    if not matches:
        raise LookupError(f"{path}: no floor in tests/test_layers.py FLOORS; add a row for its folder")
    _, name, level = max(matches)
    framework = next((fw for prefix, fw in FRAMEWORK_DIRS.items() if path.startswith(prefix)), None)
    return Floor(name, level, framework, path.split("/")[0] if "/" in path else "")


def module_path(module: str, root: Path = ROOT) -> str | None:
    """mmrun.a.b -> 'a/b.py' or 'a/b/__init__.py' (whichever exists), None if it is no module of ours."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    rel = "/".join(parts[1:])
    for candidate in ((f"{rel}.py", f"{rel}/__init__.py") if rel else ("__init__.py",)):
        if (root / candidate).is_file():
            return candidate
    return None


def imports_of(source: str, path: str) -> list[tuple[int, str]]:
    """Every mmrun module `source` imports (top level and inside functions), as (line, dotted name).
    `from mmrun.x import y` names mmrun.x.y when y is a module, else mmrun.x (resolved by the caller)."""
    package = [PACKAGE, *path.split("/")[:-1]]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from ..a import b
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != PACKAGE:
                continue
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def target_of(name: str, root: Path = ROOT) -> tuple[str, str] | None:
    """(dotted module, path) of the longest prefix of `name` that is a module of ours."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        path = module_path(module, root)
        if path:
            return module, path
    return None


def violations(source: str, path: str, root: Path = ROOT) -> list[str]:
    """`path:line imports X (floor Y above floor Z)` for every import of `source` that goes up a floor, or into
    another framework's code, or into a framework's folder from outside its own package."""
    here = floor_of(path)
    found: list[str] = []
    seen = set()
    for line, name in imports_of(source, path):
        target = target_of(name, root)
        if target is None or target[1] == path or (line, target[0]) in seen or (path, target[0]) in ALLOWED:
            continue
        seen.add((line, target[0]))
        module, target_path = target
        there = floor_of(target_path)
        if there.level > here.level:
            found.append(f"{path}:{line} imports {module} (floor {there.name} above floor {here.name})")
        elif there.framework and here.framework and there.framework != here.framework:
            found.append(f"{path}:{line} imports {module} ({there.framework} code from {here.framework} code)")
        elif (there.framework and not here.framework and here.package != there.package
              and here.package not in FRAMEWORK_GATES):
            found.append(f"{path}:{line} imports {module} ({there.framework} code of {there.package}/ from "
                         f"floor {here.name}: go through {there.package}'s neutral API)")
    return found


def package_modules(root: Path = ROOT) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                  if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]))


def test_imports_go_down_the_floors():
    found = []
    for path in package_modules():
        found += violations((ROOT / path).read_text(encoding="utf-8"), path)
    assert not found, "imports against the floors (tests/test_layers.py FLOORS):\n" + "\n".join(found)


def test_allowed_exceptions_still_exist():
    for (path, module), reason in ALLOWED.items():
        assert module in {name for _, name in imports_of((ROOT / path).read_text(encoding="utf-8"), path)} or any(
            name.startswith(module + ".") for _, name in imports_of((ROOT / path).read_text(encoding="utf-8"), path)), (
            f"{path} no longer imports {module}: drop it from ALLOWED ({reason})")


def test_every_module_has_a_floor():
    for path in package_modules():
        floor_of(path)  # raises with the path when a new folder has no row


MODEL_SHARED = ("vlm",)  # folders under models/ that are shared blocks, not a family


def families_imported(source: str, path: str, root: Path = ROOT) -> set[str]:
    """The model family folders (models/<family>/) a module imports, lazy imports included."""
    found = set()
    for _, name in imports_of(source, path):
        target = target_of(name, root)
        parts = target[1].split("/") if target else []
        if len(parts) > 2 and parts[0] == "models" and parts[1] not in MODEL_SHARED:
            found.add(parts[1])
    return found


def family_folders(root: Path = ROOT) -> list[str]:
    return sorted(p.name for p in (root / "models").iterdir()
                  if p.is_dir() and (p / "__init__.py").is_file() and p.name not in MODEL_SHARED)


def test_no_model_folder_imports_training():
    """A model knows no trainer: converters and checkpoint I/O are checkpoint/'s (issue 38)."""
    found = [f"{path}:{line} imports {name}" for path in package_modules() if path.startswith("models/")
             and path.count("/") >= 2 for line, name in imports_of((ROOT / path).read_text(encoding="utf-8"), path)
             if name.startswith("mmrun.training")]
    assert not found, "model folders importing training/:\n" + "\n".join(found)


def test_no_family_imports_another_family():
    """A family folder imports no other family folder but the base the family table names for it (its public
    names only), and shared model code (models/vlm/, models/*.py below the entries) imports no family: where it
    needs one family's part it asks the family table (models/families.py)."""
    from mmrun.models.families import FAMILIES

    bases = {family.name: family.base for family in FAMILIES}
    families = family_folders()
    assert {"qwen2_vl", "qwen3_vl", "wan"} <= set(families) and set(families) <= set(bases)
    found = []
    for path in package_modules():
        parts = path.split("/")
        if parts[0] != "models" or floor_of(path).name == "entries":
            continue
        own = parts[1] if len(parts) > 2 and parts[1] not in MODEL_SHARED else None
        source = (ROOT / path).read_text(encoding="utf-8")
        others = families_imported(source, path) - {own, bases.get(own)}
        found += [f"{path} imports the {other} family" for other in sorted(others)]
        base = bases.get(own)
        found += [f"{path}:{line} imports {name}, a private name of its base family {base}"
                  for line, name in imports_of(source, path)
                  if base and name.startswith(f"mmrun.models.{base}.") and name.rsplit(".", 1)[-1].startswith("_")]
    assert not found, "\n".join(found)


def engine_import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in package_modules(root):
        if not path.startswith("engines/"):
            continue
        targets = {target_of(name, root) for _, name in imports_of((root / path).read_text(encoding="utf-8"), path)}
        graph[path] = {t[1] for t in targets if t and t[1].startswith("engines/") and t[1] != path}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (one path around each strongly connected group of two or more modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_circle_inside_engines():
    found = cycles(engine_import_graph())
    assert not found, "import circles inside engines/ (a base module importing what builds on it):\n" + "\n".join(
        " <-> ".join(group) for group in found)


def test_rule_checkers_catch_planted_cases():
    assert families_imported("from mmrun.models.qwen3_vl import mm_layout\n", "models/qwen2_vl/x.py") == {"qwen3_vl"}
    assert families_imported("from mmrun.models.vlm import blocks\n", "models/qwen3_vl/x.py") == set()
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_checker_catches_planted_violations():
    planted = ("from mmrun.training.pretrain import pretrain\n"
               "def later():\n"
               "    from mmrun.engines.mindspore.parallel import engine\n"
               "    from mmrun.common import atomic_write\n")
    found = violations(planted, "engines/torch/megatron_core/engine.py")
    assert found == [
        "engines/torch/megatron_core/engine.py:1 imports mmrun.training.pretrain (floor training above floor engines)",
        "engines/torch/megatron_core/engine.py:3 imports mmrun.engines.mindspore.parallel.engine "
        "(mindspore code from torch code)",
    ]
    relative = violations("from ..torch import device\n", "backend/mindspore/ops.py")
    assert relative == ["backend/mindspore/ops.py:1 imports mmrun.backend.torch.device (torch code from mindspore code)"]
    portable = violations("from mmrun.backend.torch import nn\n", "models/gpt.py")
    assert portable and "go through backend's neutral API" in portable[0]
    assert violations("from mmrun.engines import create\n", "training/pretrain.py") == []


if __name__ == "__main__":
    for module in package_modules():
        for line in violations((ROOT / module).read_text(encoding="utf-8"), module):
            print(line)
