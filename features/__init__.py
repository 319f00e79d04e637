"""The feature table: which Megatron/MindSpeed training flags work on which framework x device, in two layers.

Layer (a), the framework STACK (`stack.yaml`): what a training script can use on torch + torch_npu +
MindSpeed, torch + Megatron-LM, MindSpore + MSAdapter + MindSpeed, MindSpore alone; every verdict
cites a public source, and what none states is `unknown`. Layer (b), mmrun's TRAINER
(`trainer.yaml`): what `models/pretrain_gpt.py` + `training/` implement. The features themselves
(titles, flags, companions) are defined once, in `catalogue.yaml`.

Why a top-level folder (`mmrun.features`) and not `backend/`: three rooms use the table, none owns it:
the training entry's startup gate (both layers), `mmrun translate` (the stack, plus the trainer for
mmrun's own entry) and the `mmrun features` command; and it imports no framework, while `backend/`
is the one place that does. One module per job:

    table.py      the table in memory (features, layers, cells, sources)
    loader.py     YAML -> Tables, validated (through mmrun.common.yaml_tables)
    decisions.py  one layer's verdict on one flag, and its one-line message
    gate.py       the training entry's gate on parsed arguments (FeatureGateError, exit 2)
    tokens.py     the same verdicts on a script's shell words, with token spans (translate)
    entries.py    which layers judge a script (is its entry mmrun's trainer?)
    render.py     the table as text, JSON and markdown (docs/features.md)
    cli.py        `mmrun features`

    >>> from mmrun.features import check_flags
    >>> [d.status for d in check_flags(["--tensor-model-parallel-size", "8"], "mindspore", "npu")]
    ['supported']
    >>> [d.layer for d in check_flags(["--tensor-model-parallel-size", "8"], "mindspore", "npu",
    ...                               layers=("stack", "trainer"))]
    ['stack', 'trainer']
"""
from __future__ import annotations

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.features.decisions import Decision
from mmrun.features.entries import entry_features, is_mmrun_trainer, layers_for_scripts
from mmrun.features.gate import POLICIES, FeatureGateError, GateResult, add_gate_arguments, decide_args, gate
from mmrun.features.loader import FeatureTableError, load_tables
from mmrun.features.table import LAYERS, STACK, STATUSES, TRAINER, Cell, Feature, LayerView, Source, Tables, Trigger
from mmrun.features.tokens import check_flags


def trainer_table() -> LayerView:
    """The features mmrun's trainer judges, with their flags (what its argument parser declares)."""
    return load_tables().view(TRAINER)


__all__ = [
    "DEVICES", "FRAMEWORKS", "LAYERS", "POLICIES", "STACK", "STATUSES", "TRAINER",
    "Cell", "Decision", "Feature", "FeatureGateError", "FeatureTableError", "GateResult", "LayerView", "Source",
    "Tables", "Trigger",
    "add_gate_arguments", "check_flags", "decide_args", "entry_features", "gate", "is_mmrun_trainer",
    "layers_for_scripts",
    "load_tables", "trainer_table",
]
