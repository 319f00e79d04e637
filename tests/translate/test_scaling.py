"""Time grows linearly with the script: 8x the input must cost well under 8x^2 the time.

Ratios of CPU time within one run, best of three (the machine is shared); never a wall-clock target. The
figures themselves are measured by benchmarks/translate_scaling.py.
"""
from __future__ import annotations

from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmrun.benchmarks.translate_scaling import cpu_best, translate
from mmrun.launchers.translate.line_diff import changed_blocks

GROWTH = 8
BOUND = 24  # 8x input: linear is 8, quadratic 64; 24 leaves room for noise and cache effects


def cpu_seconds(work: Callable[[], object]) -> float:
    return cpu_best(work, repeat=3)


def growth(make: Callable[[int], bytes], n: int, target: str = "msrun") -> float:
    small, large = make(n), make(n * GROWTH)
    translate(small, target)()  # warm up (parser, imports)
    return cpu_seconds(translate(large, target)) / max(cpu_seconds(translate(small, target)), 1e-3)


SHAPES: dict[str, tuple[Callable[[int], bytes], int]] = {
    # The undo record of a script of repeated lines (difflib: 17 s at 55 KB, over 60 s at 5 MB).
    "repeated lines": (lambda n: b"torchrun --nproc-per-node=2 train.py\n" + b"echo hi\n" * n, 2000),
    # Nested $( ): depth^3 before (depth 400: 19 s).
    "nested substitutions": (lambda n: b"torchrun --nproc_per_node 2 train.py " + b"$(echo " * n + b"x" + b")" * n + b"\n", 250),
    "nested ifs": (lambda n: b"if a; then\n" * n + b"torchrun --nproc_per_node 2 train.py\n" + b"fi\n" * n, 250),
    "one long launch line": (lambda n: b"torchrun --nproc_per_node 2 train.py" + b" --a $B --fp16" * n + b"\n", 400),
    "many launch lines": (lambda n: b'A="--nproc_per_node 2"\n' + b"torchrun $A train.py --fp16\n" * n, 100),
    "many conditional definitions": (lambda n: b"if c; then A=--nproc_per_node; fi\n" * n + b"torchrun $A 2 train.py" + b" $A" * n + b"\n", 400),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_translation_time_is_linear(shape: str) -> None:
    make, n = SHAPES[shape]
    assert growth(make, n) < BOUND


@pytest.mark.slow
def test_the_way_back_is_linear_too() -> None:
    make = lambda n: b"msrun --local_worker_num 2 --worker_num 2 train.py\n" + b"echo hi\n" * n  # noqa: E731
    assert growth(make, 2000, target="torchrun") < BOUND


def test_line_diff_is_linear_on_repeated_lines() -> None:
    def lines(n: int) -> tuple[list[bytes], list[bytes]]:
        a = [b"x\n"] * n
        b = a[: n // 3] + [b"y\n"] + a[n // 3:] + [b"z\n"]
        return a, b

    small, large = lines(20_000), lines(20_000 * GROWTH)
    ratio = cpu_seconds(lambda: changed_blocks(*large)) / max(cpu_seconds(lambda: changed_blocks(*small)), 1e-3)
    assert ratio < BOUND
    assert changed_blocks(*small) == [(20_000 // 3, 20_000 // 3, 20_000 // 3, 20_000 // 3 + 1), (20_000, 20_000, 20_001, 20_002)]


def _apply(a: list[bytes], b: list[bytes], blocks: list[tuple[int, int, int, int]]) -> list[bytes]:
    out = list(a)
    for i1, i2, j1, j2 in reversed(blocks):
        out[i1:i2] = b[j1:j2]
    return out


@given(st.lists(st.sampled_from([b"a", b"b", b"c", b"\n"]), max_size=60), st.data())
def test_line_diff_blocks_turn_one_version_into_the_other(a: list[bytes], data) -> None:
    b = data.draw(st.lists(st.sampled_from([b"a", b"b", b"d", b"\n"]), max_size=60) | st.just(a[::-1]) | st.just(a[1:] + a[:1]))
    blocks = changed_blocks(a, b)
    assert _apply(a, b, blocks) == b
    assert all(i2 <= k1 and j2 <= l1 for (_, i2, _, j2), (k1, _, l1, _) in zip(blocks, blocks[1:]))  # in order, apart
    assert all(i1 != i2 or j1 != j2 for i1, i2, j1, j2 in blocks)  # no empty block
