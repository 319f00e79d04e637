"""tree-sitter-bash, wrapped: parse a script once, refuse what does not parse, and answer byte/line questions.

Offsets are bytes (tree-sitter's unit), so every edit lands exactly, whatever the encoding of the
comments around it (the seed scripts carry Chinese comments).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

import tree_sitter
import tree_sitter_bash

Node = tree_sitter.Node

# Statement containers: a child of one of these is a whole statement (it can take a comment line above it).
BLOCKS = frozenset({
    "program", "compound_statement", "do_group", "if_statement", "elif_clause", "else_clause",
    "case_item", "subshell", "function_definition",
})


class ScriptSyntaxError(ValueError):
    """The script does not parse as bash; the message names the line."""

    def __init__(self, path: str, line: int, column: int, near: str):
        self.path, self.line, self.column, self.near = path, line, column, near
        super().__init__(
            f"{path}:{line}:{column}: bash syntax error near {near!r}: mmrun translate only rewrites scripts that parse. "
            f"Check the line with `bash -n {path}` and fix it"
        )


@lru_cache(maxsize=1)
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


@dataclass
class Script:
    source: bytes
    tree: tree_sitter.Tree
    path: str = "<script>"
    _line_starts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        starts = [0]
        starts.extend(i + 1 for i, byte in enumerate(self.source) if byte == 0x0A)
        self._line_starts = starts

    @property
    def root(self) -> Node:
        return self.tree.root_node

    def text(self, start: int, end: int) -> str:
        return self.source[start:end].decode("utf-8", errors="replace")

    def node_text(self, node: Node) -> str:
        return self.text(node.start_byte, node.end_byte)

    def line_of(self, offset: int) -> int:
        """1-based line number of a byte offset."""
        low, high = 0, len(self._line_starts) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self._line_starts[mid] <= offset:
                low = mid
            else:
                high = mid - 1
        return low + 1

    def column_of(self, offset: int) -> int:
        """1-based column (in characters) of a byte offset."""
        start = self._line_starts[self.line_of(offset) - 1]
        return len(self.text(start, offset)) + 1

    def line_start(self, offset: int) -> int:
        return self._line_starts[self.line_of(offset) - 1]

    def line_end(self, offset: int) -> int:
        """Offset just past the newline of the line holding `offset` (or the end of the file)."""
        line = self.line_of(offset)
        return self._line_starts[line] if line < len(self._line_starts) else len(self.source)

    def indent_of(self, offset: int) -> str:
        start = self.line_start(offset)
        end = start
        while end < len(self.source) and self.source[end] in b" \t":
            end += 1
        return self.text(start, end)

    def walk(self, node: Node | None = None) -> Iterator[Node]:
        """Every node, depth first, in source order."""
        stack = [node or self.root]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(current.children))

    def statement_of(self, node: Node) -> Node:
        """The whole statement holding `node` (a command inside `cmd 2>&1 | tee x`, an assignment in `export X=1`)."""
        current = node
        while current.parent is not None and current.parent.type not in BLOCKS:
            current = current.parent
        return current

    def is_top_level(self, node: Node) -> bool:
        statement = self.statement_of(node)
        return statement.parent is not None and statement.parent.type == "program"


def parse_script(source: bytes, path: str = "<script>") -> Script:
    """Parse bash source; raise ScriptSyntaxError naming the first line tree-sitter could not parse."""
    tree = _parser().parse(source)
    script = Script(source, tree, path)
    if tree.root_node.has_error:
        bad = _first_error(tree.root_node)
        offset = bad.start_byte if bad is not None else 0
        near = script.text(offset, min(len(source), offset + 30)).split("\n")[0] or script.text(script.line_start(offset), offset).strip()
        raise ScriptSyntaxError(path, script.line_of(offset), script.column_of(offset), near)
    return script


def _first_error(node: Node) -> Node | None:
    if node.is_error or node.is_missing:
        return node
    for child in node.children:
        if child.has_error or child.is_error or child.is_missing:
            found = _first_error(child)
            if found is not None:
                return found
    return None
