"""The analyser over a large real codebase: the installed megatron-core (about 370 files).

megatron-core hard-codes CUDA (about 600 lines in about 110 files, docs/analyse.md): the analyser
must get through all of it without a crash or a parse error, find those places, propose fixes
that still parse, and be idempotent on its own output.
"""
from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

import pytest

from mmrun.analyse.runner import RunConfig, analyse_source, make_index
from mmrun.analyse.sources import discover
from mmrun.analyse.workers import run

# Found on sys.path without importing it (importing megatron.core imports torch): a worktree's venv
# reuses the main venv's packages through a .pth file, so the tree is not in this venv's purelib.
MEGATRON_CORE = next((Path(entry, "megatron", "core") for entry in sys.path
                      if Path(entry, "megatron", "core", "__init__.py").is_file()), Path("megatron-core-not-found"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def megatron_run():
    # The dev extra installs megatron-core: without it the install is broken, which is a failure, not a skip.
    assert MEGATRON_CORE.is_dir(), "megatron-core is missing: install the dev extra (pip install -e '.[dev]')"
    sources = discover([str(MEGATRON_CORE)])
    assert sources.skipped == [] and sources.notes == []
    return sources.files, run(sources.files, RunConfig(target="both", fix=True), jobs=2)


def test_whole_tree_without_errors(megatron_run):
    items, result = megatron_run
    assert len(items) > 300 and len(result.files) == len(items)
    assert result.skipped == []
    findings = result.findings
    counts = collections.Counter(f.code for f in findings)
    # Sane counts (measured: MM101 396, MM106 93, MM105 21 on megatron-core 0.16.1).
    assert 300 <= counts["MM101"] <= 500
    assert counts["MM106"] >= 50 and counts["MM105"] >= 10 and counts["MM212"] >= 50
    cuda_lines = {(f.path, f.line) for f in findings
                  if f.code.startswith("MM1") or f.code in ("MM302", "MM401", "MM404")}
    assert 450 <= len(cuda_lines) <= 800
    assert 80 <= len({path for path, _ in cuda_lines}) <= 150


def test_known_places_are_found(megatron_run):
    _, result = megatron_run
    by_file = collections.defaultdict(set)
    for f in result.findings:
        by_file[Path(f.path).relative_to(MEGATRON_CORE).as_posix()].add((f.line, f.code))
    source = (MEGATRON_CORE / "pipeline_parallel/bridge_communicator.py").read_text().splitlines()
    nccl_lines = [i for i, text in enumerate(source, 1) if "backend='nccl'" in text]
    assert nccl_lines and all((line, "MM302") in by_file["pipeline_parallel/bridge_communicator.py"]
                              for line in nccl_lines)
    # nccl_allocator.py shows backend="nccl" in a docstring example: not code, not reported.
    assert not any(code == "MM302" for _, code in by_file["nccl_allocator.py"])
    source = (MEGATRON_CORE / "parallel_state.py").read_text().splitlines()
    compared = [i for i, text in enumerate(source, 1) if '== "nccl"' in text]
    assert compared and all((line, "MM401") in by_file["parallel_state.py"] for line in compared)
    current = [i for i, text in enumerate(source, 1)
               if "torch.cuda.current_device()" in text and not text.lstrip().startswith("#")]
    assert current and all((line, "MM101") in by_file["parallel_state.py"] for line in current)


def test_fixes_parse_and_are_idempotent(megatron_run):
    _, result = megatron_run
    index = make_index(RunConfig(target="both", fix=True))
    changed = [r for r in result.files if r.new_source is not None]
    assert len(changed) > 80
    for r in changed:
        ast.parse(r.new_source, filename=r.path)
        again = analyse_source(r.new_source, r.path, index, fix=True)
        assert again.new_source is None, f"second --fix changed {r.path}"


def test_fast_resolution_matches_scope_provider():
    # Files where the import table is not enough (shadowed names, function-level imports) and
    # files with many findings: findings, positions and rewrites equal the reference path
    # (LibCST ScopeProvider for every name, PositionProvider for positions).
    names = ["optimizer/__init__.py", "optimizer/distrib_optimizer.py", "fusions/fused_softmax.py",
             "inference/unified_memory.py", "parallel_state.py", "tensor_parallel/random.py",
             "pipeline_parallel/p2p_communication.py", "distributed/param_and_grad_buffer.py"]
    index = make_index(RunConfig(target="both", fix=True))
    for name in names:
        data = (MEGATRON_CORE / name).read_bytes()
        fast = analyse_source(data, name, index, fix=True)
        ref = analyse_source(data, name, index, fix=True, reference=True)
        assert fast.findings, name
        assert (fast.findings, fast.changes, fast.diff) == (ref.findings, ref.changes, ref.diff), name
