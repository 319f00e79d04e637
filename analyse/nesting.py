"""Refuse, before LibCST parses it, source nested deeper than its parser can take (see limits.py).

Two depths are measured on the tokens, in linear time: bracket nesting, and an estimate of the
syntax tree's depth. In the estimate an open bracket adds one level on top of the expression it
opens in; within one expression a chain of operators of the same binding strength nests one level
per operator (`1 + 1 + 1`, `.f().g()`, `not not x`, `lambda: lambda: x`), and an operator ends the
chains of those that bind tighter (in `a * b + c * d` the `+` starts a new term: 2 levels, not 3).
Comparisons (`a < b < c`) are one flat node in LibCST.

Most files are cleared without tokenizing: `_upper_bound` counts, with vector operations over the
bytes, the characters that can add a level in each logical line (outside strings and comments);
only where that count exceeds the limits (long literal tables, generated or deep code) are the
tokens read.
"""
from __future__ import annotations

import io
import keyword
import re
import tokenize

import numpy as np

from .limits import Limits

# Binding strength, loosest first.
(_LAMBDA, _TERNARY, _OR, _AND, _NOT, _COMPARE, _BITOR, _BITXOR, _BITAND, _SHIFT, _ADD, _MUL, _UNARY, _POWER,
 _AWAIT, _PRIMARY) = range(16)
_STRENGTHS = 16
_BINARY = {
    ":=": _LAMBDA, "|": _BITOR, "^": _BITXOR, "&": _BITAND, "<<": _SHIFT, ">>": _SHIFT, "+": _ADD, "-": _ADD,
    "*": _MUL, "/": _MUL, "//": _MUL, "%": _MUL, "@": _MUL, "**": _POWER, ".": _PRIMARY,
    "<": _COMPARE, ">": _COMPARE, "==": _COMPARE, "!=": _COMPARE, "<=": _COMPARE, ">=": _COMPARE,
}
_PREFIX = {"-": _UNARY, "+": _UNARY, "~": _UNARY}
_WORDS = {"lambda": _LAMBDA, "yield": _LAMBDA, "or": _OR, "and": _AND, "await": _AWAIT, "in": _COMPARE,
          "is": _COMPARE}
_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
# Tokens that end one expression of a statement: nesting starts again after them.
_RESET = frozenset({",", ";", "=", "+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=", "^=", ">>=", "<<=",
                    "**=", "->"})
_VALUE_WORDS = frozenset({"True", "False", "None"})
_OPERAND_TYPES = frozenset({tokenize.NUMBER, tokenize.STRING}
                           | ({tokenize.FSTRING_END} if hasattr(tokenize, "FSTRING_END") else set()))


def nesting_too_deep(data: bytes, limits: Limits) -> str | None:
    """Why `data` nests too deep for LibCST (one line, with the line number), or None."""
    smallest = min(limits.max_brackets, limits.max_depth)
    if len(data) <= smallest:      # every level needs at least one character
        return None
    bound = _upper_bound(data)
    if bound is not None and bound <= smallest:
        return None
    return _token_depth(data, limits)


# Strings and comments, whose characters are not code (prefixes such as rb"" are name characters).
_STRING_OR_COMMENT = re.compile(rb'''"""(?:[^"\\]|\\.|"(?!""))*(?:"""|\Z)|\'\'\'(?:[^'\\]|\\.|'(?!\'\'))*(?:\'\'\'|\Z)'''
                                rb'''|"(?:[^"\\\n]|\\.)*(?:"|$)|'(?:[^'\\\n]|\\.)*(?:'|$)|\#[^\r\n]*''', re.S | re.M)
_WORD_RE = re.compile(rb"\b(?:not|if|" + b"|".join(w.encode() for w in sorted(_WORDS)) + rb")\b")
_EVENT = np.zeros(256, np.int32)    # characters that can add a level: brackets, operators, dots
_EVENT[np.frombuffer(b"([{+-*/%@&|^~<>=!.:", np.uint8)] = 1
_BRACKET = np.zeros(256, np.int32)
_BRACKET[np.frombuffer(b"([{", np.uint8)] = 1
_BRACKET[np.frombuffer(b")]}", np.uint8)] = -1


def _upper_bound(data: bytes) -> int | None:
    """At least both depths `_token_depth` measures (None: cannot tell), from a few passes over the bytes.

    Every level needs a bracket, an operator character or an operator keyword in the same logical
    line, so their count since the last line end outside brackets, plus the bracket depth, bounds
    both depths from above.
    """
    if not data:
        return 0
    chars = np.frombuffer(data, np.uint8)
    edges = np.zeros(len(chars) + 1, np.int32)
    for match in _STRING_OR_COMMENT.finditer(data):
        edges[match.start()] += 1
        edges[match.end()] -= 1
    code = np.cumsum(edges[:-1]) == 0
    depth = np.cumsum(_BRACKET[chars] * code)
    if depth.min() < 0:
        return None   # more closing brackets than opening ones: a syntax error, let the tokens tell
    events = _EVENT[chars] * code
    for match in _WORD_RE.finditer(data):
        events[match.start()] += code[match.start()]
    counted = np.cumsum(events)
    line_end = (chars == 10) & code & (depth == 0)
    line_end[1:] &= chars[:-1] != 92   # a backslash joins the next line
    counted -= np.maximum.accumulate(np.where(line_end, counted, 0))
    return int((depth + counted).max())


def _token_depth(data: bytes, limits: Limits) -> str | None:
    # Per open bracket: the depth it opened at, and the chain length of each binding strength.
    bases: list[int] = [0]
    chains: list[list[int]] = [[0] * _STRENGTHS]
    after_operand = False   # an operand just ended: `(` or `[` is a call or subscript, `-` is binary
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            kind, text = tok.type, tok.string
            strength = None
            if kind == tokenize.OP:
                if text in _OPEN:
                    if after_operand:
                        depth = _extend(chains[-1], _PRIMARY)
                    else:
                        depth = sum(chains[-1])
                    depth += bases[-1] + 1
                    if len(bases) > limits.max_brackets:
                        return (f"brackets nested more than {limits.max_brackets} deep at line {tok.start[0]} "
                                "(more than CPython accepts)")
                    if depth > limits.max_depth:
                        return _too_deep(limits, tok)
                    bases.append(depth)
                    chains.append([0] * _STRENGTHS)
                    after_operand = False
                    continue
                if text in _CLOSE:
                    if len(bases) > 1:
                        bases.pop()
                        chains.pop()
                    after_operand = True
                    continue
                if text in _RESET:
                    chains[-1] = [0] * _STRENGTHS
                elif text == ":":   # a dict entry, slice or annotation ends; a lambda goes on
                    chains[-1] = [chains[-1][_LAMBDA]] + [0] * (_STRENGTHS - 1)
                elif after_operand or text == ".":
                    strength = _BINARY.get(text)
                else:
                    strength = _PREFIX.get(text)
                after_operand = text == "..."
            elif kind == tokenize.NAME:
                if text == "if":
                    strength = _TERNARY if after_operand else None
                elif text == "not":
                    strength = _COMPARE if after_operand else _NOT   # `not in`, or logical not
                else:
                    strength = _WORDS.get(text)
                after_operand = text in _VALUE_WORDS or not keyword.iskeyword(text)
            elif kind == tokenize.NEWLINE:
                bases, chains = [0], [[0] * _STRENGTHS]
                after_operand = False
            elif kind in _OPERAND_TYPES:
                after_operand = True
            if strength is not None and _extend(chains[-1], strength) + bases[-1] > limits.max_depth:
                return _too_deep(limits, tok)
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError, LookupError, ValueError):
        pass   # the depth measured so far stands; LibCST reports the syntax error
    return None


def _extend(chain: list[int], strength: int) -> int:
    """One more operator of `strength`: its chain grows, tighter ones end. Returns the new depth."""
    chain[strength] = 1 if strength == _COMPARE else chain[strength] + 1
    for tighter in range(strength + 1, _STRENGTHS):
        chain[tighter] = 0
    return sum(chain)


def _too_deep(limits: Limits, tok: tokenize.TokenInfo) -> str:
    return (f"an expression nested more than {limits.max_depth} levels deep at line {tok.start[0]} "
            "(chained calls, operators, brackets)")
