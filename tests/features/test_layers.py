"""The two layers checked against each other, against their sources, and against the backends' own tables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmrun import features as ft
from mmrun.features.render import docs_page

REPO = Path(__file__).resolve().parents[2]
TABLES = ft.load_tables()
STACK, TRAINER = TABLES.layer("stack"), TABLES.layer("trainer")
COLUMNS = [(fw, dev) for fw in ft.FRAMEWORKS for dev in ft.DEVICES]


def test_nothing_the_trainer_supports_is_lacking_in_the_stack():
    """mmrun's trainer runs on a framework stack: where the stack lacks a feature, the trainer cannot have it."""
    conflicts = [
        f"{name} {fw}/{dev}: trainer supported, stack {STACK.cell(name, fw, dev).status}"
        for name in TRAINER.cells if STACK.lists(name) for fw, dev in COLUMNS
        if TRAINER.cell(name, fw, dev).status == "supported" and STACK.cell(name, fw, dev).status in ("unsupported", "fallback")
    ]
    assert conflicts == []


def test_every_stack_verdict_cites_a_source_and_every_source_is_used():
    uncited = [f"{name} {fw}/{dev}" for name in STACK.cells for fw, dev in COLUMNS
               if STACK.cell(name, fw, dev).status != "unknown" and not STACK.cell(name, fw, dev).sources]
    assert uncited == []
    used = {s.key for name in STACK.cells for fw, dev in COLUMNS for s in STACK.cell(name, fw, dev).sources}
    assert set(TABLES.sources) == used, f"sources nobody cites: {sorted(set(TABLES.sources) - used)}"


def test_every_source_is_public_or_a_measurement_this_repository_re_runs():
    for source in TABLES.sources.values():
        if source.url:
            assert source.url.startswith("https://") and source.check is None
        else:
            assert (REPO / source.check).is_file(), f"{source.key}: {source.check} does not exist"


def test_the_stack_describes_every_column():
    assert set(STACK.columns) == set(COLUMNS)


def test_the_mindspeed_mindspore_features_of_issue_13_are_supported_by_the_stack():
    """MindSpeed-MM / MindSpeed-LLM train on the MindSpore backend with these (their MindSpore docs and examples)."""
    for name in ("tensor-parallel", "pipeline-parallel", "virtual-pipeline", "context-parallel", "expert-parallel",
                 "sequence-parallel", "distributed-optimizer", "recompute", "flash-attention", "fused-rmsnorm",
                 "fused-swiglu", "fused-rotary-pos-emb", "lora", "overlap-grad-reduce", "overlap-param-gather"):
        assert STACK.cell(name, "mindspore", "npu").status == "supported", name


def test_internal_references_never_reach_users():
    """Reasons, hints, titles and docs name public sources, never this project's notes ("seed 003") or tests."""
    texts = [f.title for f in TABLES.features]
    for layer in (STACK, TRAINER):
        for name in layer.cells:
            for fw, dev in COLUMNS:
                cell = layer.cell(name, fw, dev)
                texts += [cell.reason, cell.hint or ""]
    texts += [s.title + (s.section or "") for s in TABLES.sources.values()]
    for text in texts:
        assert not re.search(r"\bseeds?\b|/work/|shared/notes", text, re.I), text
    assert not re.search(r"\bseeds?\b", docs_page(), re.I)


def test_no_stale_precision_words():
    """mmrun trains in fp32, fp16 and bf16; no hint may say it trains in fp32 only."""
    for name in TRAINER.cells:
        for fw, dev in COLUMNS:
            assert "mmrun trains in fp32" not in (TRAINER.cell(name, fw, dev).hint or "")


# ------------------------------------------------------------------ the backends' own tables agree with the trainer

BACKENDS = ("nccl", "hccl", "gloo", "mccl")


@pytest.mark.parametrize("fw, dev", COLUMNS)
def test_working_dist_backends_agree_with_the_trainer_layer(fw, dev):
    """backend/checks.py's WORKING_DIST_BACKENDS: supported where listed, else substituted by its default."""
    from mmrun.backend.checks import WORKING_DIST_BACKENDS

    working = WORKING_DIST_BACKENDS[fw][dev]
    for name in BACKENDS:
        cell = TRAINER.cell(f"backend-{name}", fw, dev)
        if name in working:
            assert cell.status == "supported", f"{name} works with {fw} on {dev} (checks.py) but the trainer says {cell.status}"
        else:
            assert (cell.status, cell.substitute) == ("fallback", working[0]), f"{name} with {fw} on {dev}"
    per_device = TRAINER.cell("backend-per-device", fw, dev)
    assert (per_device.status, per_device.substitute) == ("fallback", working[0])


@pytest.mark.parametrize("fw", ft.FRAMEWORKS)
@pytest.mark.parametrize("dev", ft.DEVICES)
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.filterwarnings("ignore")  # the backend's own replacement notice
def test_backend_choice_agrees_with_the_backends_own_check(fw, dev, name):
    """The gate and mmrun.backend.checks (used by init_distributed) pick the same backend."""
    from mmrun.backend import checks

    (decision,) = ft.check_flags(["--distributed-backend", name], fw, dev, layers=("trainer",))
    chosen = name if decision.status == "supported" else decision.substitute
    assert checks.dist_backend(fw, dev, name) == chosen


@pytest.mark.parametrize("fw", ft.FRAMEWORKS)
@pytest.mark.parametrize("dev", ft.DEVICES)
@pytest.mark.parametrize("flag, dtype", [("fp16", "fp16"), ("bf16", "bf16")])
def test_compute_dtypes_agree_with_the_trainer_layer(fw, dev, flag, dtype):
    """The backends' compute-dtype tables (backend/*/tensors.py) and the trainer's precision cells say the same."""
    if fw == "pytorch":
        from mmrun.backend.torch import tensors
    else:
        from mmrun.backend.mindspore import tensors
    computes = tensors.supports_compute_dtype(dtype, dev)
    status = TRAINER.cell(flag, fw, dev).status
    assert (status == "supported") == computes, f"--{flag} with {fw} on {dev}: tensors.py says {computes}, trainer says {status}"
