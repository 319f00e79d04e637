"""Line and column of a few nodes, computed like LibCST's PositionProvider but much cheaper.

PositionProvider generates the whole module's code and records a range for every node. The
analyser needs positions for a handful of nodes (its findings), so this code generator records
only those, keeps no output text, and stops as soon as the last one is known. It follows
PositionProvidingCodegenState's rules (syntactic positions from `record_syntactic_position`
override the whitespace-inclusive ones), so the numbers are the same; tests compare the two.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterable, Iterator

import libcst as cst
from libcst._nodes.internal import CodegenState   # what PositionProvider subclasses, too
from libcst.metadata import CodePosition, CodeRange

_NEWLINE_RE = re.compile(r"\r\n?|\n")


class _AllFound(Exception):
    """Raised to stop code generation once every wanted node has its range."""


class _TargetedPositionState(CodegenState):
    def __init__(self, module: cst.Module, wanted: set[int]) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.wanted = wanted
        self.line = 1          # one-indexed
        self.column = 0        # zero-indexed
        self.starts: dict[int, CodePosition] = {}
        self.ranges: dict[int, CodeRange] = {}
        self.remaining = len(wanted)

    def _advance(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            segments = _NEWLINE_RE.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self._advance(token)

    def add_token(self, value: str) -> None:
        self._advance(value)

    def pop_trailing_newline(self) -> None:
        pass  # no text is kept

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            self.starts[id(node)] = CodePosition(self.line, self.column)

    def after_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.wanted:
            if key not in self.ranges:
                self._store(key, CodeRange(self.starts[key], CodePosition(self.line, self.column)))

    def _store(self, key: int, value: CodeRange) -> None:
        if key not in self.ranges:
            self.remaining -= 1
        self.ranges[key] = value

    @contextmanager
    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> Iterator[None]:
        if id(node) not in self.wanted:
            yield
            return
        # The hoisted ranges come from children generated inside this block: want them too.
        for extra in (start_node, end_node):
            if extra is not None and id(extra) not in self.wanted:
                self.wanted.add(id(extra))
                self.remaining += 1
        start = CodePosition(self.line, self.column)
        yield
        end = CodePosition(self.line, self.column)
        if start_node is not None:
            start = self.ranges[id(start_node)].start
        if end_node is not None:
            end = self.ranges[id(end_node)].end
        self._store(id(node), CodeRange(start, end))


class _StoppingState(_TargetedPositionState):
    def after_codegen(self, node: cst.CSTNode) -> None:
        super().after_codegen(node)
        if self.remaining <= 0:
            raise _AllFound


def node_ranges(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict[int, CodeRange]:
    """id(node) -> CodeRange (PositionProvider's numbers) for each of `nodes` in `module`."""
    wanted = {id(n) for n in nodes}
    if not wanted:
        return {}
    state = _StoppingState(module, set(wanted))
    try:
        module._codegen(state)
    except _AllFound:
        pass
    return state.ranges
