"""What one file may cost the analyser: size, nesting, CPU time, memory, stack.

LibCST parses in native code that recurses once per level of the syntax tree and memoises every
attempt, so its time and memory grow with nesting depth times file size. Measured with libcst
1.5.1 on an 8 MiB stack: 2000 nested parentheses, 4000 chained calls or 12000 chained `+`
overflow the stack (a segfault, no Python exception); 20000 chained calls run 100 s before that;
20 lines of `f(a.b[1], {"k": ...` nested 50 deep (18 KB) take 820 MB, 100 deep 3.2 GB. Normal code
costs about 230 bytes of memory and 1 µs of CPU per byte of source.

Two layers keep every input within these limits. nesting.py refuses, before LibCST sees it, a file
whose brackets nest deeper than CPython's own limit or whose expressions nest deeper than
`max_depth` (CPython's compiler gives up near there too), so no runnable code is refused. What
still goes wrong inside LibCST is contained by the worker process that analyses each file
(workers.py): a large stack and recursion limit, a CPU-time and a memory budget per file; a file
that exceeds them is skipped with the reason, and the run goes on. docs/analyse.md shows the
table below (docgen.py renders it from the `doc` of each field).
"""
from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20
CPYTHON_MAX_BRACKETS = 200   # CPython's tokenizer: "too many nested parentheses" beyond this


def _limit(default, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Limits:
    max_bytes: int = _limit(4 * MiB, "larger files are skipped (LibCST needs about 1 GB for 4 MiB of code)")
    max_brackets: int = _limit(CPYTHON_MAX_BRACKETS, "brackets nested deeper are refused before parsing "
                                                     "(CPython refuses them too)")
    max_depth: int = _limit(1000, "expressions nested deeper (chained calls, operators, brackets) are refused "
                                  "before parsing (CPython's compiler gives up near there)")
    cpu_seconds: float = _limit(30.0, "CPU seconds a file may take to analyse ...")
    cpu_seconds_per_mib: float = _limit(30.0, "... plus this many per MiB (normal code needs about 2 s per MiB)")
    memory_bytes: int = _limit(2048 * MiB, "memory a worker may add while analysing one file")
    stack_bytes: int = _limit(64 * MiB, "stack of the worker thread that parses and analyses")
    recursion_limit: int = _limit(20000, "Python's recursion limit in a worker (LibCST's visitors recurse "
                                         "once per level)")
    wall_seconds: float = _limit(60.0, "a worker silent for 4 times its CPU budget plus this many seconds "
                                       "is stopped (a hung file system)")

    def cpu_budget(self, size: int) -> float:
        """CPU seconds a file of `size` bytes may take."""
        return self.cpu_seconds + self.cpu_seconds_per_mib * size / MiB

    def wall_budget(self, size: int) -> float:
        """Seconds without an answer after which a worker is given up (a shared machine is slow)."""
        return 4 * self.cpu_budget(size) + self.wall_seconds


DEFAULT_LIMITS = Limits()
