"""mmrun.engines: what runs the model for mmrun's training loop (the seam is base.py's `Engine`).

The floor between the models and the training loop: an engine may import the backend (any of it), models,
data and common; engines/torch/ and engines/mindspore/ import their framework (never each other's); nothing
here imports mmrun.training or the launchers. Training and the entries use this registry and base.py only,
and reach one framework's engine code through the facades at the end of this module (tests/test_layers.py).

    engine = engines.create(args, framework, log)    # picks by ENGINES, below
    layout = engine.initialize(args)                  # ... see base.py for the whole sequence

ENGINES lists them, first match wins; adding an engine is one row here and a class implementing base.Engine:

| engine | framework | chosen when | module |
|---|---|---|---|
| torch-fsdp2 | pytorch | --use-torch-fsdp2 (the FSDP2 file: --fsdp2-config-path; docs/fsdp2.md) | engines/torch/fsdp2/engine.py |
| torch-ddp | pytorch | an entry that trains a torch model as it is (models/pretrain_transformers.py sets args.torch_ddp) | engines/torch/fsdp2/engine.py |
| megatron-core | pytorch | --use-mcore-models, or any of: --tensor-/--pipeline-/--context-parallel-size > 1, virtual pipeline stages, --use-distributed-optimizer, --transformer-impl transformer_engine | engines/torch/megatron_core/engine.py |
| mindspore-parallel | mindspore | --use-mcore-models, --tensor-/--pipeline-model-parallel-size > 1 (with or without --sequence-parallel); trains the GPT, or the VLM of models/pretrain_vlm.py (engines/mindspore/parallel/vlm.py); refuses --fp16/--bf16, virtual pipeline stages, --context-parallel-size > 1, Transformer Engine; shards the optimizer for --use-distributed-optimizer | engines/mindspore/parallel/engine.py |
| mmrun | pytorch, mindspore | otherwise (data parallelism; on MindSpore with --use-distributed-optimizer too: backend/mindspore/parallel/zero.py) | engines/portable.py |

A parallel flag without --use-mcore-models turns it on, with one notice: mmrun's GPT does not split layers,
and megatron-core's GPTModel (on MindSpore: the same architecture and names rebuilt in engines/mindspore/parallel/gpt.py)
built from the same arguments starts from the same weights (models/gpt_names.py), so the run trains the
same network on either framework (docs/parallelism.md, docs/parallelism-mindspore.md). Megatron-LM itself
builds mcore models unless --use-legacy-models is given.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mmrun.engines.base import (MODEL_NAMES, ArgumentsError, Engine, ModelConfigError, ParallelLayout,  # noqa: F401
                                ShardState, TrainingError)


@dataclass(frozen=True)
class EngineRow:
    name: str
    frameworks: tuple[str, ...]
    wants_parallelism: bool  # chosen for model/optimizer parallelism and --use-mcore-models
    factory: str  # "module:Class", imported only when chosen
    chosen_by: str | None = None  # an argument that alone chooses this row when true (checked first)


ENGINES: tuple[EngineRow, ...] = (
    EngineRow("torch-fsdp2", ("pytorch",), False, "mmrun.engines.torch.fsdp2.engine:create_fsdp2", "use_torch_fsdp2"),
    EngineRow("torch-ddp", ("pytorch",), False, "mmrun.engines.torch.fsdp2.engine:create_ddp", "torch_ddp"),
    EngineRow("megatron-core", ("pytorch",), True, "mmrun.engines.torch.megatron_core.engine:MegatronCoreEngine"),
    EngineRow("mindspore-parallel", ("mindspore",), True,
              "mmrun.engines.mindspore.parallel:create"),
    EngineRow("mmrun", ("pytorch", "mindspore"), False, "mmrun.engines.portable:PortableEngine"),
)


# What the engines that do not overlap communication do instead, for the notice in create() (megatron-core passes
# --overlap-grad-reduce / --overlap-param-gather to its DDP config; on MindSpore the feature gate says it).
OVERLAP_INSTEAD = {
    "torch-fsdp2": "FSDP2 reduce-scatters each unit's gradients during backward and prefetches its all-gathers by itself",
    "torch-ddp": "torch's DistributedDataParallel all-reduces gradient buckets during backward by itself",
    "mmrun": "mmrun's data-parallel engine all-reduces the gradients after backward, and parameters are never sharded",
}
OVERLAP_FLAGS = (("--overlap-grad-reduce", "overlap_grad_reduce"), ("--overlap-param-gather", "overlap_param_gather"))


# Engines that do not apply --recompute-* to the model's layer loops (models/recompute.py; the mmrun engine does,
# megatron-core through its TransformerConfig), and what they recompute instead, for the notice in create().
RECOMPUTE_INSTEAD = {
    "torch-fsdp2": "the FSDP2 file's recompute_modules choose what this engine recomputes (docs/fsdp2.md); the flags "
                   "are not applied here (same results, memory as without)",
    "torch-ddp": "this engine trains the transformers model as it is and does not apply the flags (same results, "
                 "memory as without)",
    "mindspore-parallel": "mmrun's MindSpore parallel engine recomputes each pipeline stage's forward in backward "
                          "(all but the last stage) and does not apply the flags' per-layer plan (same results)",
}


# What each parallel engine trains, for the notice in create().
GPT_MODEL_OF = {
    "megatron-core": "megatron-core's GPTModel",
    "mindspore-parallel": "megatron-core's GPTModel rebuilt on MindSpore (engines/mindspore/parallel/gpt.py)",
}


# Flags of parallel_flags() that a framework's data-parallel engine implements itself: alone they choose no
# parallel engine there (MindSpore: mmrun's engine shards the optimizer, backend/mindspore/parallel/zero.py).
DATA_PARALLEL_FLAGS: dict[str, tuple[str, ...]] = {"mindspore": ("--use-distributed-optimizer",)}


def parallel_flags(args: argparse.Namespace) -> list[str]:
    """The flags of this run that only the megatron-core engine implements (model parallelism, the
    distributed optimizer, Transformer Engine layers), as given."""
    given = []
    for flag, dest in (("--tensor-model-parallel-size", "tensor_model_parallel_size"),
                       ("--pipeline-model-parallel-size", "pipeline_model_parallel_size"),
                       ("--context-parallel-size", "context_parallel_size")):
        if (getattr(args, dest, 1) or 1) > 1:
            given.append(f"{flag} {getattr(args, dest)}")
    if (getattr(args, "virtual_pipeline_model_parallel_size", None) or 1) > 1:
        given.append(f"--virtual-pipeline-model-parallel-size {args.virtual_pipeline_model_parallel_size}")
    if getattr(args, "use_distributed_optimizer", False):
        given.append("--use-distributed-optimizer")
    if getattr(args, "transformer_impl", "local") == "transformer_engine":
        given.append("--transformer-impl transformer_engine")
    return given


def choose(args: argparse.Namespace, framework: str) -> EngineRow:
    """The engine for this run (first row of ENGINES that fits)."""
    for row in ENGINES:
        if row.chosen_by and getattr(args, row.chosen_by, False) and framework in row.frameworks:
            return row
    own = DATA_PARALLEL_FLAGS.get(framework, ())
    wants = bool(getattr(args, "use_mcore_models", False)) or any(f not in own for f in parallel_flags(args))
    for row in ENGINES:
        if row.chosen_by:
            continue
        if framework in row.frameworks and (wants or not row.wants_parallelism):
            return row
    raise LookupError(f"no training engine runs {'parallel ' if wants else ''}training on {framework}")


def create(args: argparse.Namespace, framework: str, log: Callable[[str], None]) -> Engine:
    """Pick the engine (ENGINES), say why when a flag chose it, and build it (not yet initialised)."""
    row = choose(args, framework)
    if row.chosen_by and parallel_flags(args):
        raise ArgumentsError(f"{', '.join(parallel_flags(args))} cannot be combined with the {row.name} engine "
                             f"(it shards or replicates the whole model over every rank); drop them, or drop "
                             f"--{row.chosen_by.replace('_', '-')}")
    if row.wants_parallelism and not getattr(args, "use_mcore_models", False) and getattr(args, "model_source", None):
        args.use_mcore_models = True  # a model file (--mm-model) names the model: the engine builds that one
    if row.wants_parallelism and not getattr(args, "use_mcore_models", False):
        flags = ", ".join(parallel_flags(args))
        model = GPT_MODEL_OF.get(row.name, "megatron-core's GPTModel")
        log(f"notice: {flags}: mmrun's GPT implements none of this, so this run trains {model} (the same network "
            "and initial weights; checkpoint tensors get megatron-core's names); pass --use-mcore-models to say so")
        args.use_mcore_models = True
    overlap = [flag for flag, dest in OVERLAP_FLAGS if getattr(args, dest, False)]
    if overlap and row.name in OVERLAP_INSTEAD:
        log(f"notice: {', '.join(overlap)}: {OVERLAP_INSTEAD[row.name]} (results identical)")
    asked = [flag for flag, dest in (("--recompute-granularity", "recompute_granularity"),
                                     ("--recompute-activations", "recompute_activations")) if getattr(args, dest, None)]
    if asked and row.name in RECOMPUTE_INSTEAD:
        log(f"notice: {', '.join(asked)}: {RECOMPUTE_INSTEAD[row.name]}")
    module, _, cls = row.factory.partition(":")
    return getattr(importlib.import_module(module), cls)(args, framework, log)


# ------------------------------------------------------------------------------------------------- facades
# What the floors above (training, the entries) need of one framework's engine code, reached through here so that
# they never import mmrun.engines.<framework> or mmrun.backend.<framework> themselves (tests/test_layers.py).

def megatron_core_installed() -> bool:
    """Is megatron-core importable here? (Looked up, not imported: the entries ask before choosing an engine.)"""
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None for name in ("megatron", "megatron.core"))
    except (ImportError, ValueError):  # a broken or hidden `megatron` package
        return False


def core_gpt_model(args: argparse.Namespace, pre_process: bool = True, post_process: bool = True,
                   vp_stage: int | None = None) -> Any:
    """megatron-core's GPTModel for this stage from the run's arguments, starting from mmrun's GPT weights
    (engines/torch/megatron_core/gpt.py). mmrun.training.core_gpt_model passes the run's arguments."""
    if args.ai_framework != "pytorch":
        raise RuntimeError(f"megatron-core's GPTModel is a PyTorch model. Received: --ai-framework {args.ai_framework}; "
                           "on MindSpore the mindspore-parallel engine builds it (engines/mindspore/parallel/gpt.py) "
                           "without calling model_provider")
    from mmrun.engines.torch.megatron_core.gpt import gpt_model

    return gpt_model(args, pre_process, post_process, vp_stage)


def start_process_group(args: argparse.Namespace, framework: str) -> None:
    """Megatron's initialize_megatron hands --distributed-timeout-minutes to init_process_group: torch only
    (MindSpore's communication has no such timeout; backend.init_distributed starts it there)."""
    if framework == "pytorch":
        from mmrun.backend.torch import process_group

        process_group.start(args.distributed_backend, timeout_minutes=args.distributed_timeout_minutes)


def transformers_model(model_cfg: Mapping[str, Any]) -> Any:
    """The transformers model of MindSpeed-MM's model.json section (engines/torch/transformers_models.py);
    raises ModelConfigError."""
    from mmrun.engines.torch.transformers_models import build_model

    return build_model(model_cfg)


def dcp_state(source: str | Path) -> dict[str, Any]:
    """A --ckpt-format torch_dcp checkpoint read whole in one process, every tensor as numpy (PyTorch reads it)."""
    from mmrun.engines.torch.fsdp2.export import read_numpy

    return read_numpy(source)


def dcp_to_hf(hf_config: dict[str, Any], source: str | Path, out: str | Path) -> Path:
    """A torch_dcp checkpoint's model written by transformers as a Hugging Face directory at `out`."""
    from mmrun.engines.torch.fsdp2.export import save_hf

    return save_hf(hf_config, source, out)


def mindspore_gpt_step(args: argparse.Namespace, jit: bool | None = None) -> Any:
    """megatron-core's GPT rebuilt on MindSpore for this rank with its AdamW and 1F1B train step
    (engines/mindspore/parallel/gpt.py build_engine); call after mmrun.backend.init_distributed()."""
    from mmrun.engines.mindspore.parallel.gpt import build_engine

    return build_engine(args, jit=jit)


def core_vlm_model(args: argparse.Namespace, config: Any, pipeline_layers: Mapping[str, Any] | None = None,
                   pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None,
                   read_hf: Callable | None = None, frozen: Mapping[str, bool] | None = None) -> Any:
    """This pipeline stage of Qwen2-VL / Qwen2.5-VL (a models.qwen2_vl Qwen2VLConfig) on megatron-core, with
    MindSpeed-MM's names per (TP, PP) rank, starting from the one-process run's weights for --seed, or from
    an HF model's tensors (`read_hf(hf name) -> array`) when given (engines/torch/megatron_core/vlm.py).
    `pipeline_layers`: model.json's pipeline_num_layers per module ({"vit": [...], "llm": [...]}, flat or one
    list per virtual chunk; None = the layout's default split); `vp_stage`: the model chunk (virtual stage);
    `frozen`: model.json's freeze switches (no gradients, no optimizer state).
    mmrun.training.core_vlm_model passes the run's arguments."""
    if args.ai_framework != "pytorch":
        raise RuntimeError(f"the megatron-core VLM is a PyTorch model. Received: --ai-framework {args.ai_framework}")
    from mmrun.engines.torch.megatron_core import vlm, vlm_stages

    layers = pipeline_layers or {}
    layout = vlm.build_layout(args, config, layers.get("vit"), layers.get("llm"))
    model = vlm_stages.vlm_model(args, layout, pre_process, post_process, read_hf=read_hf, vp_stage=vp_stage)
    vlm.freeze(model, **(frozen or {}))
    return model
