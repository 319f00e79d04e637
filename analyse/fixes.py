"""Apply the safe rewrites that findings carry, keeping formatting and comments (LibCST).

Edits replace leaf nodes (a Name part of a dotted chain, a method name, a string token) or add a
comment line above a statement, so edits never nest and one identity-keyed pass applies them all.
"""
from __future__ import annotations

import difflib
import os

import libcst as cst

from .visitor import Edit

IMPORT_COMMENT = "# noqa: F401  added by mmrun analyse --fix: registers torch.npu and the npu device"


class _ApplyEdits(cst.CSTTransformer):
    def __init__(self, edits: list[Edit]) -> None:
        super().__init__()
        self.replace = {id(e.node): e.new for e in edits if e.new is not None}
        self.comments: dict[int, list[str]] = {}
        for e in edits:
            if e.comment is not None:
                self.comments.setdefault(id(e.node), [])
                if e.comment not in self.comments[id(e.node)]:
                    self.comments[id(e.node)].append(e.comment)

    def on_leave(self, original_node, updated_node):
        new = self.replace.get(id(original_node))
        if new is not None:
            return new
        comments = self.comments.get(id(original_node))
        if comments:
            lines = list(updated_node.leading_lines)
            lines += [cst.EmptyLine(indent=True, comment=cst.Comment(f"# {c}")) for c in comments]
            return updated_node.with_changes(leading_lines=lines)
        return updated_node


def _imports_torch(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                name = cst.helpers.get_full_name_for_node(alias.name) or ""
                if name == "torch" or name.startswith("torch."):
                    return True
        elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            name = cst.helpers.get_full_name_for_node(small.module) or ""
            if name == "torch" or name.startswith("torch."):
                return True
    return False


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def import_anchor(module: cst.Module) -> int:
    """Index in module.body after which `import torch_npu` goes.

    After the first top-level `import torch...` line; else after the leading block of docstring
    and imports (so `from __future__` stays first).
    """
    for i, stmt in enumerate(module.body):
        if _imports_torch(stmt):
            return i
    last = -1
    for i, stmt in enumerate(module.body):
        is_docstring = (i == 0 and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                        and isinstance(stmt.body[0], cst.Expr)
                        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))
        if is_docstring or _is_import(stmt):
            last = i
        else:
            break
    return last


def add_import(module: cst.Module, name: str, at: int) -> cst.Module:
    stmt = cst.parse_statement(f"import {name}  {IMPORT_COMMENT}\n")
    body = list(module.body)
    body.insert(at + 1, stmt)
    return module.with_changes(body=body)


def apply_edits(module: cst.Module, edits: list[Edit], import_name: str | None) -> cst.Module:
    new_module = module.visit(_ApplyEdits(edits)) if edits else module
    if import_name:
        new_module = add_import(new_module, import_name, import_anchor(module))
    return new_module


def unified_diff(path: str, old: str, new: str) -> str:
    """A diff `git apply` takes for relative paths (a/ b/ prefixes); absolute paths as they are."""
    before, after = (path, path) if os.path.isabs(path) else (f"a/{path}", f"b/{path}")
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=before, tofile=after))
