"""Which lines differ between two versions of a script, in time linear in their length.

The undo record stores the lines of the original script that the reverse rules do not give back. Those
differences are few and local (a renamed option, an added export), but a script can be megabytes of
near-identical lines, where `difflib.SequenceMatcher(autojunk=False)` is quadratic. Here:

1. the common head and tail are skipped;
2. lines that occur exactly once on each side anchor the rest (patience diff): they split the middle
   into gaps, in order;
3. each gap gets Myers' O((N+M)D) diff with a work budget proportional to its size; a gap whose
   differences exceed the budget (a megabyte of repeated lines, each changed) becomes one block.

The blocks are always correct (applying them gives the second version exactly); only in that last
case are they larger than the smallest possible.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from typing import Sequence

Block = tuple[int, int, int, int]  # a[i1:i2] becomes b[j1:j2]
WORK_PER_LINE = 64  # Myers steps a gap may take per line it holds before it becomes one block


def changed_blocks(a: Sequence[bytes], b: Sequence[bytes]) -> list[Block]:
    """[(i1, i2, j1, j2), ...] in order: replacing each a[i1:i2] with b[j1:j2] turns `a` into `b`."""
    head, tail = _common_ends(a, 0, len(a), b, 0, len(b))
    a_end, b_end = len(a) - tail, len(b) - tail
    blocks: list[Block] = []
    i, j = head, head
    for anchor_i, anchor_j in _anchors(a, head, a_end, b, head, b_end):
        _gap(a, i, anchor_i, b, j, anchor_j, blocks)
        i, j = anchor_i + 1, anchor_j + 1
    _gap(a, i, a_end, b, j, b_end, blocks)
    return blocks


def _common_ends(a: Sequence[bytes], a0: int, a1: int, b: Sequence[bytes], b0: int, b1: int) -> tuple[int, int]:
    """(lines equal at the start, lines equal at the end) of a[a0:a1] and b[b0:b1], not overlapping."""
    head = 0
    while a0 + head < a1 and b0 + head < b1 and a[a0 + head] == b[b0 + head]:
        head += 1
    tail = 0
    while a1 - tail > a0 + head and b1 - tail > b0 + head and a[a1 - tail - 1] == b[b1 - tail - 1]:
        tail += 1
    return head, tail


def _anchors(a: Sequence[bytes], a0: int, a1: int, b: Sequence[bytes], b0: int, b1: int) -> list[tuple[int, int]]:
    """Pairs (i, j) of lines unique in both ranges, the longest run that is in order on both sides."""
    count_a = Counter(a[a0:a1])
    count_b = Counter(b[b0:b1])
    where_b = {line: j for j, line in enumerate(b[b0:b1], b0) if count_b[line] == 1 and count_a[line] == 1}
    pairs = [(i, where_b[line]) for i, line in enumerate(a[a0:a1], a0) if line in where_b]
    # Longest increasing subsequence of the j's (patience sorting), O(k log k).
    tops: list[int] = []  # tops[n]: smallest j ending an increasing run of n + 1 pairs
    top_index: list[int] = []  # the pair holding tops[n]
    previous: list[int] = []  # for each pair: the pair before it in its best run
    for index, (_, j) in enumerate(pairs):
        n = bisect_left(tops, j)
        if n == len(tops):
            tops.append(j)
            top_index.append(index)
        else:
            tops[n] = j
            top_index[n] = index
        previous.append(top_index[n - 1] if n else -1)
    chain = []
    index = top_index[-1] if top_index else -1
    while index >= 0:
        chain.append(pairs[index])
        index = previous[index]
    return chain[::-1]


def _gap(a: Sequence[bytes], a0: int, a1: int, b: Sequence[bytes], b0: int, b1: int, blocks: list[Block]) -> None:
    head, tail = _common_ends(a, a0, a1, b, b0, b1)
    a0, b0, a1, b1 = a0 + head, b0 + head, a1 - tail, b1 - tail
    if a0 == a1 and b0 == b1:
        return
    if a0 == a1 or b0 == b1:
        blocks.append((a0, a1, b0, b1))
        return
    matches = _myers(a, a0, a1, b, b0, b1, WORK_PER_LINE * (a1 - a0 + b1 - b0))
    if matches is None:
        blocks.append((a0, a1, b0, b1))
        return
    i, j = a0, b0
    for x, y, length in matches + [(a1, b1, 0)]:
        if (i, j) != (x, y):
            blocks.append((i, x, j, y))
        i, j = x + length, y + length


def _myers(a: Sequence[bytes], a0: int, a1: int, b: Sequence[bytes], b0: int, b1: int, budget: int) -> list[tuple[int, int, int]] | None:
    """Myers' greedy shortest edit script on a[a0:a1], b[b0:b1] as matching runs (i, j, length); None past `budget` steps."""
    n, m = a1 - a0, b1 - b0
    offset = n + m + 1
    v = [0] * (2 * offset + 1)  # v[offset + k]: furthest x on diagonal k = x - y
    trace: list[list[int]] = []
    work = 0
    for d in range(n + m + 1):
        low, high = offset - d - 1, offset + d + 2
        trace.append(v[low:high])  # the diagonals step d reads, as they were before it
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # down: a line of b inserted
            else:
                x = v[offset + k - 1] + 1  # right: a line of a deleted
            y = x - k
            start = x
            while x < n and y < m and a[a0 + x] == b[b0 + y]:
                x += 1
                y += 1
            v[offset + k] = x
            work += 1 + x - start
            if x >= n and y >= m:
                return _matches(trace, d, n, m, a0, b0)
        if work > budget:
            return None
    return None  # unreachable: d = n + m always reaches the end


def _matches(trace: list[list[int]], depth: int, n: int, m: int, a0: int, b0: int) -> list[tuple[int, int, int]]:
    """Walk the recorded frontiers back from (n, m): the diagonal runs of the shortest edit script, in order."""
    runs = []
    x, y = n, m
    for d in range(depth, 0, -1):
        saved = trace[d]  # saved[0] is diagonal -d - 1

        def furthest(k: int, saved: list[int] = saved, d: int = d) -> int:
            return saved[k + d + 1]

        k = x - y
        down = k == -d or (k != d and furthest(k - 1) < furthest(k + 1))
        previous_k = k + 1 if down else k - 1
        previous_x = furthest(previous_k)
        previous_y = previous_x - previous_k
        step_x, step_y = (previous_x, previous_y + 1) if down else (previous_x + 1, previous_y)
        if x > step_x:
            runs.append((a0 + step_x, b0 + step_y, x - step_x))
        x, y = previous_x, previous_y
    if x > 0:
        runs.append((a0, b0, x))
    return runs[::-1]
