"""Every tensor handed to a torch.distributed collective is made on the device of its process group (issue 27).

CI has no GPU, and gloo reduces CPU tensors, so a buffer built on the host and reduced over an NCCL (or HCCL)
group passes every CPU test and fails only on an accelerator ("No backend type associated with device type
cpu"). This reads the AST of engines/ and backend/ instead: for each call of a torch.distributed collective,
every tensor argument that is a name is traced to its latest assignment before the call in the same function;
a torch factory without `device=` (torch.tensor, zeros, empty, ones, full, arange, from_numpy, ...) there, or
as the argument itself, is a host tensor and fails the test. `.to(where)`, `device=where`, `zeros_like(t)` or a
tensor that came from elsewhere pass: their device is the caller's choice, which the engine makes (the
parameters' device, or the host under gloo). Nothing is imported; the walk takes well under a second.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("engines", "backend")

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "reduce", "gather", "scatter", "send", "recv",
    "isend", "irecv", "all_to_all", "all_to_all_single", "batch_isend_irecv",
})
# torch functions that make a new tensor, on the host unless told `device=`
FACTORIES = frozenset({
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "rand", "randn", "randint",
    "from_numpy", "eye",
})
NO_DEVICE_ARGUMENT = frozenset({"from_numpy"})  # always the host


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to torch, names bound to torch.distributed) anywhere in the module."""
    torch_names, dist_names = set(), {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch":
                    torch_names.add(a.asname or "torch")
                elif a.name == "torch.distributed":
                    dist_names.add(a.asname or "torch.distributed")
                    torch_names.add("torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            for a in node.names:
                if a.name == "distributed":
                    dist_names.add(a.asname or "distributed")
    return torch_names | {"torch"}, dist_names


def _host_made(expr: ast.AST, torch_names: set[str]) -> bool:
    """Is `expr` a tensor a torch factory makes on the host (no `device=`), or a list of them?"""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return any(_host_made(e, torch_names) for e in expr.elts)
    if isinstance(expr, ast.ListComp):
        return _host_made(expr.elt, torch_names)
    if not isinstance(expr, ast.Call):
        return False
    name = _dotted(expr.func) or ""
    owner, _, function = name.rpartition(".")
    if owner not in torch_names or function not in FACTORIES:
        return False
    return function in NO_DEVICE_ARGUMENT or not any(k.arg == "device" for k in expr.keywords)


def _scopes(tree: ast.Module):
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node


def _own_nodes(scope: ast.AST):
    """The nodes of one function, not those of the functions nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def host_tensors_in_collectives(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: call(arg)' for every host-made tensor handed to a torch.distributed collective."""
    tree = ast.parse(source, filename)
    torch_names, dist_names = _aliases(tree)
    found: list[tuple[int, str]] = []
    for scope in _scopes(tree):
        nodes = list(_own_nodes(scope))
        assigned: dict[str, list[tuple[int, ast.AST]]] = {}
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append((node.lineno, node.value))
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func) or ""
            owner, _, function = name.rpartition(".")
            if owner not in dist_names or function not in COLLECTIVES:
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                value = arg
                if isinstance(arg, ast.Name):
                    earlier = [v for line, v in sorted(assigned.get(arg.id, []), key=lambda lv: lv[0])
                               if line < node.lineno]
                    value = earlier[-1] if earlier else None
                if value is not None and _host_made(value, torch_names):
                    found.append((node.lineno, f"{filename}:{node.lineno}: {name}({ast.unparse(arg)}) gets a tensor "
                                               f"made without device= ({ast.unparse(value)[:80]})"))
    return [message for _, message in sorted(found)]


def test_no_collective_gets_a_tensor_made_on_the_host():
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += host_tensors_in_collectives(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, ("tensors handed to torch.distributed collectives must be made on the process group's device "
                       "(the parameters' device; the host only under gloo):\n" + "\n".join(found))


# The checker itself, on the shapes it must tell apart. The first is optimizer_state.gather as it was in
# ca72f9f, which saved nothing on an H100 with --use-distributed-optimizer.
OLD_GATHER = '''
import torch

def gather(optimizer, names, dp_group, distributed):
    step = 3
    if distributed:
        step_t = torch.tensor([step], dtype=torch.int64)
        torch.distributed.all_reduce(step_t, op=torch.distributed.ReduceOp.MAX, group=dp_group)
    for key in keys:
        flat = torch.zeros(sum(sizes), dtype=torch.float32)
        if distributed:
            torch.distributed.all_reduce(flat, group=dp_group)
'''

GOOD = '''
import numpy as np
import torch
import torch.distributed as dist

def reduce(values, where):
    flat = torch.tensor(values, dtype=torch.float64)
    if dist.get_world_size() > 1:
        flat = flat.to(where)
        dist.all_reduce(flat)
    size = torch.tensor([3], dtype=torch.int64, device=where)
    sizes = [torch.zeros_like(size) for _ in range(2)]
    dist.all_gather(sizes, size)
    dist.broadcast(torch.from_numpy(np.zeros(3)).to(where), src=0)
'''

BAD = '''
from torch import distributed as d
import torch as t
import numpy as np

def reduce(where):
    d.broadcast(t.from_numpy(np.zeros(3)), src=0)
    chunks = [t.zeros(4, dtype=t.uint8) for _ in range(2)]
    d.all_gather(chunks, t.ones(4, device=where))
'''


def test_the_checker_fails_on_the_gather_that_lost_the_checkpoint():
    found = host_tensors_in_collectives(textwrap.dedent(OLD_GATHER))
    assert [f.split(": ")[1].split(" gets")[0] for f in found] == [
        "torch.distributed.all_reduce(step_t)", "torch.distributed.all_reduce(flat)"]


def test_the_checker_passes_device_placed_tensors_and_catches_aliases():
    assert host_tensors_in_collectives(textwrap.dedent(GOOD)) == []
    found = host_tensors_in_collectives(textwrap.dedent(BAD))
    assert [f.split(": ")[1].split(" gets")[0] for f in found] == [
        "d.broadcast(t.from_numpy(np.zeros(3)))", "d.all_gather(chunks)"]
