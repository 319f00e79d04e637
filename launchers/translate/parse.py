"""tree-sitter-bash, wrapped: parse a script once, refuse what does not parse, and answer byte/line questions.

Offsets are bytes (tree-sitter's unit), so every edit lands exactly, whatever the encoding of the
comments around it (the MindSpeed migration guides' scripts carry Chinese comments).
"""
from __future__ import annotations

from bisect import bisect_right
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


def decode(data: bytes) -> str:
    """Script bytes as text; a byte that is not UTF-8 (a GBK or Latin-1 comment) becomes a lone surrogate, so that
    `encode` gives the very same byte back."""
    return data.decode("utf-8", errors="surrogateescape")


def encode(text: str) -> bytes:
    """The inverse of `decode`: text cut from the script (or built from such text) back to the script's bytes."""
    return text.encode("utf-8", errors="surrogateescape")


class ScriptSyntaxError(ValueError):
    """The script does not parse as bash; the message names the line."""

    def __init__(self, path: str, line: int, column: int, near: str):
        self.path, self.line, self.column, self.near = path, line, column, near
        self.reason = (f"bash syntax error near {near!r}: mmrun translate only rewrites scripts that parse. "
                       f"Check the line with `bash -n {path}` and fix it")
        super().__init__(f"{path}:{line}:{column}: {self.reason}")


@lru_cache(maxsize=1)
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


# Nodes whose place (parent, statement, previous named sibling) is indexed: every statement, and the commands and
# assignments inside statements. Others are found by walking up (tree-sitter's own `parent` walks down from the root,
# so that costs depth^2: fine for the few lint findings that ask).
INDEXED = frozenset({"command", "variable_assignment"})
_Place = tuple  # (parent, statement, previous named sibling)


@dataclass
class Script:
    source: bytes
    tree: tree_sitter.Tree
    path: str = "<script>"
    _line_starts: list[int] = field(default_factory=list, repr=False)
    _places: dict[int, _Place] | None = field(default=None, repr=False)  # node id -> place, for INDEXED nodes
    _column_cache: tuple[int, int, int] = field(default=(-1, -1, 0), repr=False)  # (line start, offset, column)

    def __post_init__(self) -> None:
        starts = [0]
        find, position = self.source.find, 0
        while (position := find(b"\n", position) + 1) > 0:
            starts.append(position)
        self._line_starts = starts

    @property
    def root(self) -> Node:
        return self.tree.root_node

    def text(self, start: int, end: int) -> str:
        return decode(self.source[start:end])

    def node_text(self, node: Node) -> str:
        return self.text(node.start_byte, node.end_byte)

    def line_of(self, offset: int) -> int:
        """1-based line number of a byte offset."""
        return bisect_right(self._line_starts, offset)

    def column_of(self, offset: int) -> int:
        """1-based column (in characters) of a byte offset.

        Counted from the previous answer when it lies on the same line before `offset` (findings come in
        source order), so that many findings on one long line cost the line's length once, not once each.
        """
        start = self._line_starts[self.line_of(offset) - 1]
        cached_start, cached_offset, cached_column = self._column_cache
        if cached_start == start and cached_offset <= offset:
            column = cached_column + _characters(self.source, cached_offset, offset)
        else:
            column = 1 + _characters(self.source, start, offset)
        self._column_cache = (start, offset, column)
        return column

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

    def parent_of(self, node: Node) -> Node | None:
        return self._place(node)[0]

    def statement_of(self, node: Node) -> Node:
        """The whole statement holding `node` (a command inside `cmd 2>&1 | tee x`, an assignment in `export X=1`)."""
        return self._place(node)[1]

    def previous_named_sibling(self, node: Node) -> Node | None:
        return self._place(node)[2]

    def is_top_level(self, node: Node) -> bool:
        parent = self.parent_of(self.statement_of(node))
        return parent is not None and parent.type == "program"

    def _place(self, node: Node) -> _Place:
        if self._places is None:
            self._places = _places(self.root)
        place = self._places.get(node.id)
        if place is None:  # not indexed: walk up
            parent = node.parent
            statement = node
            while statement.parent is not None and statement.parent.type not in BLOCKS:
                statement = statement.parent
            place = (parent, statement, node.prev_named_sibling)
        return place


def _places(root: Node) -> dict[int, _Place]:
    """The place of every statement and INDEXED node, in one walk (linear in the tree's size)."""
    places = {root.id: (None, root, None)}
    stack = [(root, root)]
    while stack:
        parent, statement = stack.pop()
        block = parent.type in BLOCKS
        previous = None
        for child in parent.children:
            child_statement = child if block else statement
            if block or child.type in INDEXED:
                places[child.id] = (parent, child_statement, previous)
            if child.is_named:
                previous = child
            if child.child_count:
                stack.append((child, child_statement))
    return places


def _characters(source: bytes, start: int, end: int) -> int:
    """Characters in source[start:end] (a byte that is not UTF-8 counts as one)."""
    return len(decode(source[start:end]))


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
    """The first node tree-sitter could not parse, found without recursion (scripts nest `$( )` thousands deep)."""
    while not (node.is_error or node.is_missing):
        following = next((c for c in node.children if c.has_error or c.is_error or c.is_missing), None)
        if following is None:
            return None
        node = following
    return node
