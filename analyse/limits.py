"""What one file may cost the analyser (size, nesting, CPU time, memory), and the nesting check.

LibCST's native parser recurses once per nesting level and memoises every attempt, so its time and
memory grow with nesting depth times file size (measured, libcst 1.5.1, 8 MiB stack):
2000 nested parentheses or 4000 chained calls overflow the stack (a segfault, no Python exception);
20000 chained calls run 100 s before that; 20 lines of `f(a.b[1], {"k": ...` nested 50 deep
(18 KB) take 820 MB, 100 deep 3.2 GB. Normal code costs about 230 bytes of memory per byte of source.

Two layers keep every input within bounds. `nesting_too_deep` reads the tokens (`tokenize`,
linear time) and refuses, before LibCST sees it, an expression nested deeper than `max_depth`;
CPython itself refuses more than 200 nested brackets, so no runnable code is lost at 200. What
still goes wrong inside LibCST is contained by the worker process that analyses each file
(workers.py): a stack as large as `stack_bytes`, `cpu_seconds` of CPU time and `memory_bytes` of
memory per file; a file that exceeds them is skipped with the reason, and the run goes on.
"""
from __future__ import annotations

import io
import keyword
import tokenize
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 4 * MiB             # larger files are skipped (LibCST: about 1 GB at 4 MiB)
    max_depth: int = 200                 # expression nesting (see nesting_too_deep)
    cpu_seconds: float = 30.0            # CPU time per file: this much ...
    cpu_seconds_per_mib: float = 30.0    # ... plus this much per MiB (normal code: about 2 s per MiB)
    memory_bytes: int = 2048 * MiB       # memory a worker may add while analysing one file
    stack_bytes: int = 64 * MiB          # stack of the thread that parses (LibCST recurses natively)
    wall_seconds: float = 60.0           # a worker silent for 4 x its CPU budget plus this is stopped

    def cpu_budget(self, size: int) -> float:
        """CPU seconds a file of `size` bytes may take."""
        return self.cpu_seconds + self.cpu_seconds_per_mib * size / MiB

    def wall_budget(self, size: int) -> float:
        """Seconds without an answer after which a worker is given up (a shared machine is slow)."""
        return 4 * self.cpu_budget(size) + self.wall_seconds


DEFAULT_LIMITS = Limits()

_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
# Tokens that end one expression of a statement: nesting starts again after them.
_RESET = frozenset({",", ";", "=", "+=", "-=", "*=", "/=", "//=", "%=", "@=", "&=", "|=", "^=", ">>=", "<<=",
                    "**=", "->"})
# Keywords that nest the syntax tree as an operator does (`not not x`, `a if b else c if ...`).
_OPERATOR_WORDS = frozenset({"not", "and", "or", "if", "else", "lambda", "await", "in", "is", "yield"})
# Keywords that are values (an operand, like a name).
_VALUE_WORDS = frozenset({"True", "False", "None"})
_OPERAND_TYPES = frozenset({tokenize.NUMBER, tokenize.STRING}
                           | ({tokenize.FSTRING_END} if hasattr(tokenize, "FSTRING_END") else set()))


def nesting_too_deep(data: bytes, limit: int) -> tuple[int, int] | None:
    """(depth, line) where an expression first nests deeper than `limit`, or None.

    The depth estimates the syntax tree's: an open bracket adds one level on top of the expression
    it opens in, and within one expression every operator, operator keyword, `.attribute`, call or
    subscript adds one (`a.f().g()` is 4 deep, `-(-(x))` 4, `1 + 1 + 1` 2). Where the tokenizer
    gives up (a syntax error), the depth measured so far stands and LibCST reports the error.
    """
    if len(data) <= limit:      # every level needs at least one character
        return None
    bases, runs = [0], [0]      # per open bracket: the depth it opened at, operators since
    after_operand = False       # an operand just ended: `(` or `[` is a call or subscript
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            kind, text = tok.type, tok.string
            if kind == tokenize.OP:
                if text in _OPEN:
                    if after_operand:
                        runs[-1] += 1
                    depth = bases[-1] + runs[-1] + 1
                    if depth > limit:
                        return depth, tok.start[0]
                    bases.append(depth)
                    runs.append(0)
                    after_operand = False
                    continue
                if text in _CLOSE:
                    if len(bases) > 1:
                        bases.pop()
                        runs.pop()
                    after_operand = True
                    continue
                after_operand = text == "..."
                if text in _RESET:
                    runs[-1] = 0
                    continue
                if after_operand:
                    continue
            elif kind == tokenize.NAME:
                after_operand = text in _VALUE_WORDS or not keyword.iskeyword(text)
                if text not in _OPERATOR_WORDS:
                    continue
            elif kind == tokenize.NEWLINE:
                bases, runs = [0], [0]
                after_operand = False
                continue
            else:
                if kind in _OPERAND_TYPES:
                    after_operand = True
                continue
            runs[-1] += 1
            if bases[-1] + runs[-1] > limit:
                return bases[-1] + runs[-1], tok.start[0]
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError, LookupError, ValueError):
        pass
    return None
