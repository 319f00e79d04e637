"""Fine-tune a vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), MindSpeed-MM style, on PyTorch or MindSpore.

    mmrun --ai-framework pytorch   --nproc-per-node 2 models/pretrain_vlm.py $GPT_ARGS --mm-model model.json --mm-data data.json
    mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_vlm.py $GPT_ARGS --mm-model model.json --mm-data data.json
    bash scripts/finetune_qwen2vl.sh          # the offline demo (AI_FRAMEWORK=mindspore for MindSpore)

This is MindSpeed-MM's pretrain_vlm.py: the five callbacks of its contract, run by mmrun's shared loop
(`mmrun.training.pretrain`), with MindSpeed-MM's files as they are:

    --mm-model model.json   the model (image_encoder.vision_encoder / vision_projector, text_decoder); it wins
                            over the launch script's model flags, as in MindSpeed-MM (models/qwen2_vl/model_json.py)
    --mm-data data.json     the data (dataset_param.preprocess_parameters / basic_parameters / attr,
                            dataloader_param): mllm_format JSON + images, tokenizer and image processor from
                            preprocess_parameters.model_name_or_path (mmrun.data.multimodal)
    --mm-tool tools.json    accepted (MindSpeed-MM's profiling/memory tools); checked to be JSON, not used
    --load DIR              a Hugging Face Qwen2-VL / Qwen2.5-VL directory as downloaded (config.json +
                            safetensors; detected, no conversion), or mmrun's own checkpoint to resume

    model_provider                       builds Qwen2VLForConditionalGeneration, freezes as model.json says
    train_valid_test_datasets_provider   the mllm_format dataset, epoch after epoch in the seed's order
    get_batch                            the collated numpy batch -> tensors on this process's device
    forward_step                         model(**batch) -> {"loss_dict", "logits"}, and the loss function
    loss_func                            the micro-batch loss (mean over its label tokens, or Megatron's
                                         per-token mean over the global batch: --calculate-per-token-loss)

Data parallelism alone trains the portable model with mmrun's data-parallel engine on both frameworks (the
same weights, batches and losses); on MindSpore the step is compiled (mindspore.jit) on fixed shapes: the text
padded to --seq-length, the ViT's patches to a few buckets with per-frame segment ids (fixed_shape_collate), one
graph per bucket (images and videos, the videos' patches after the images': Qwen2-VL on the data-parallel and the
tensor/pipeline-parallel engine alike, Qwen2.5-VL with its windows as segment ids and Qwen3-VL with its position
taps on the data-parallel engine; Qwen2.5-VL and Qwen3-VL split, Qwen2.5-Omni, Qwen3-VL MoE and --no-ms-jit run in
PyNative).
--tensor-/--pipeline-model-parallel-size > 1 (with --sequence-parallel, the distributed optimizer), or
--use-mcore-models, train the same network from the same weights on megatron-core (PyTorch): ViT and
projector on the first pipeline stage, the decoder layers per stage as model.json's pipeline_num_layers
say, checkpoints with MindSpeed-MM's names per (TP, PP) rank (docs/multimodal-parallel.md).
Qwen3-VL MoE trains unsplit, with --expert-model-parallel-size N splitting its experts over groups of N ranks on
both frameworks (models/qwen3_vl/moe.py: Megatron's allgather token dispatch; docs/qwen3-vl.md); split over TP/PP
(and EP) on megatron-core, its sparse layers megatron-core's MoELayer (engines/torch/megatron_core/qwen3_vl_moe.py),
and on MindSpore's parallel engine (engines/mindspore/parallel/qwen3_moe.py).
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any, Iterator

from mmrun.backend.errors import UsageError
from mmrun.features.entries import TRAINER_ENTRIES
from mmrun.models.vlm import vision_layout
from mmrun.training.entry_io import read_mm_json, say_rank0
from mmrun.training import ModelSource, ModelType, get_args, pretrain, print_rank_0

# Model sizes come from model.json; these fill only what a MindSpeed-MM script never sets on its own.
CPU_DEFAULTS = {"micro_batch_size": 1, "lr": 1.0e-5, "seq_length": 1024}
# Frameworks whose parallel engine builds this model split over tensor/pipeline ranks (elsewhere: data parallel).
# PyTorch: megatron-core (engines/torch/megatron_core/vlm.py, through model_provider); MindSpore: the
# mindspore-parallel engine (engines/mindspore/parallel/vlm.py), which reads model.json itself.
PARALLEL_FRAMEWORKS = ("pytorch", "mindspore")
# ... only when a run splits it: unsplit, the model stays on the data-parallel engine, which ignores (with a
# warning) what MindSpeed-MM's scripts always carry, --use-mcore-models, and shards the optimizer for
# --use-distributed-optimizer (backend/mindspore/parallel/zero.py).
SPLIT_ONLY_FRAMEWORKS = ("mindspore",)
SPLIT_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size")
# Models whose MindSpore step compiles on fixed-shape batches, split (vision_layout.FIXED_SHAPE_MODELS) or not
# (vision_layout.DATA_PARALLEL_FIXED_SHAPE_MODELS: Qwen2.5-VL and Qwen3-VL too).
FIXED_SHAPE_MODELS = vision_layout.FIXED_SHAPE_MODELS
FIRST_BUCKET_MAX = 4096
# Unsplit models MindSpore's data-parallel step does not compile, and why (one notice line).
EAGER_ON_MINDSPORE = {"qwen3_vl_moe": "its experts' GEMMs split the tokens by counts read on the host "
                                      "(models/qwen3_vl/moe.py), which a fixed-shape graph cannot"}
LORA_FLAGS = ("--lora-target-modules", "--lora_target_modules")
# Features this entry implements itself (features/entries.py lists them all for `mmrun features --check`): LoRA on
# Qwen2-VL / Qwen2.5-VL (checkpoint/peft.py), expert parallelism on Qwen3-VL MoE (models/qwen3_vl/moe.py).
ENTRY_FEATURES = TRAINER_ENTRIES["models/pretrain_vlm.py"]
LORA_FEATURES = ("lora",)
MOE_FEATURES = ("expert-parallel", "moe-allgather-dispatcher")
# Frameworks whose parallel engine trains LoRA split (engines/mindspore/parallel/vlm_lora.py: over pipeline stages).
LORA_SPLIT_FRAMEWORKS = ("mindspore",)
_MODEL_JSON: Any = None  # models.vlm.model_json.ModelJson, read once before the arguments are parsed
_FIXED_CONFIG: Any = None  # the model's config object, for fixed_shape_collate's per-model inputs


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """MindSpeed-MM's extra arguments (mm_extra_args_provider) and the VLM's own."""
    # --mm-model, --mm-data, --mm-tool and --calculate-per-token-loss are declared by the feature table
    # (features/catalogue.yaml), which the gate and `mmrun features` read; the entry adds its own options.
    g = parser.add_argument_group("multimodal (MindSpeed-MM's pretrain_vlm.py)")
    g.add_argument("--skip-bad-samples", "--skip_bad_samples", dest="skip_bad_samples", action="store_true",
                   help="skip samples whose images are missing or corrupt (counted and reported) instead of stopping")
    g.add_argument("--variable-seq-lengths", "--variable_seq_lengths", dest="variable_seq_lengths",
                   action="store_true", help="accepted: batches are always padded to their longest sample (x8)")
    return parser


def _model_source(argv: list[str]) -> ModelSource:
    """Read --mm-model before the training arguments are parsed: its sizes replace the network flags."""
    global _MODEL_JSON
    from mmrun.models.vlm.model_json import read_model_json
    from mmrun.models.qwen3_vl import model_json as qwen3_model_json

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--mm-model", "--mm_model", dest="mm_model")
    pre.add_argument("--mm-data", "--mm_data", dest="mm_data")
    pre.add_argument("--no-ms-jit", "--no_ms_jit", dest="no_ms_jit", action="store_true")
    for flag in (*SPLIT_FLAGS, "--expert-model-parallel-size"):  # as text: the training arguments' parser judges them
        pre.add_argument(flag, flag.replace("-", "_").replace("__", "--"), dest=flag[2:].replace("-", "_"))
    known, _ = pre.parse_known_args(argv)
    if known.mm_model is None:
        raise UsageError("--mm-model is required: pass MindSpeed-MM's model.json (the demo writes one: "
                         "scripts/finetune_qwen2vl.sh)")
    raw = read_mm_json(known.mm_model, "--mm-model")
    lora = any(token.split("=")[0] in LORA_FLAGS for token in argv)
    from mmrun.models.qwen2_5_omni import model_json as omni_model_json
    if omni_model_json.is_omni_model_json(raw):  # Qwen2.5-Omni's thinker: unsplit or split
        _MODEL_JSON = omni_model_json.parse_model_json(raw, known.mm_model)
        split = {flag: getattr(known, flag[2:].replace("-", "_")) for flag in SPLIT_FLAGS}
        omni_model_json.check_split(_MODEL_JSON, {flag: value for flag, value in split.items()
                                                  if value not in (None, "1")}, lora)
        omni_model_json.warn_all(_MODEL_JSON, partial(say_rank0, "warning"))
        return ModelSource(flag="--mm-model", sizes=_MODEL_JSON.sizes, data_flag="--mm-data",
                           data_parallel_only=all(value in (None, "1") for value in split.values()))
    if qwen3_model_json.is_qwen3_model_json(raw):
        if lora:
            raise UsageError(f"--lora-target-modules: LoRA is built for Qwen2-VL / Qwen2.5-VL, not yet for "
                             f"Qwen3-VL ({known.mm_model}); drop the LoRA flags")
        # Qwen3-VL: unsplit on the data-parallel engine; split (TP/PP) on megatron-core or MindSpore's parallel engine
        _MODEL_JSON = qwen3_model_json.parse_model_json(raw, known.mm_model)
        split = any(getattr(known, flag[2:].replace("-", "_")) not in (None, "1") for flag in SPLIT_FLAGS)
        from mmrun.backend.selection import resolve

        qwen3_model_json.check_split(_MODEL_JSON, resolve(argv).framework, split)
        from mmrun.backend.rank_env import read_rank_info

        for line in qwen3_model_json.check_experts(_MODEL_JSON, known.expert_model_parallel_size, argv,
                                                   read_rank_info().world_size,
                                                   megatron_core=split and resolve(argv).framework == "pytorch"):
            say_rank0("notice", line)
        for line in _MODEL_JSON.warnings:
            say_rank0("warning", line)
        moe = _MODEL_JSON.hf_config["model_type"] == "qwen3_vl_moe"
        return ModelSource(flag="--mm-model", sizes=_MODEL_JSON.sizes, data_flag="--mm-data",
                           data_parallel_only=not split, shards_optimizer=resolve(argv).framework == "mindspore",
                           features=MOE_FEATURES if moe else (),
                           ms_jit=_compiles(resolve(argv).framework, split, known))
    _MODEL_JSON = read_model_json(known.mm_model, warn=partial(say_rank0, "warning"))
    from mmrun.backend.selection import resolve

    framework = resolve(argv).framework
    split = any(getattr(known, flag[2:].replace("-", "_")) not in (None, "1") for flag in SPLIT_FLAGS)
    if lora and split and framework not in LORA_SPLIT_FRAMEWORKS:
        raise UsageError(f"--lora-target-modules with --tensor-/--pipeline-model-parallel-size > 1: LoRA on "
                         f"Qwen2-VL trains split on {', '.join(LORA_SPLIT_FRAMEWORKS)} only (--framework), unsplit "
                         "(data parallel, any number of ranks) elsewhere; drop the split or the LoRA flags")
    # `pip install -e ".[torch]"` (the README's quick start) has no megatron-core: an unsplit model trains on
    # the data-parallel engine there (the same network, as on MindSpore), said once; a split one still needs it.
    without_mcore = framework == "pytorch" and not split and not lora and not _megatron_core_installed()
    if without_mcore:
        say_rank0("warning", "megatron-core is not installed: this run trains the model on mmrun's data-parallel "
                  "engine (the same network and initial weights); pip install megatron-core (the [megatron] extra) "
                  "to train it on megatron-core as --use-mcore-models asks")
    return ModelSource(flag="--mm-model", sizes=_MODEL_JSON.sizes, data_flag="--mm-data",
                       data_parallel_only=framework not in PARALLEL_FRAMEWORKS
                       or (framework in SPLIT_ONLY_FRAMEWORKS and not split) or without_mcore
                       or (lora and not split),
                       ms_jit=_compiles(framework, split, known), features=LORA_FEATURES,
                       shards_optimizer=framework == "mindspore")


def _compiles(framework: str, split: bool, known: argparse.Namespace) -> bool:
    """Whether MindSpore compiles the step on fixed-shape batches (vision_layout.pads_to_fixed_shapes), images and
    videos alike (fixed_shape_collate)."""
    eager = EAGER_ON_MINDSPORE.get(_MODEL_JSON.hf_config["model_type"])
    if framework == "mindspore" and eager and not split and not known.no_ms_jit:
        say_rank0("notice", f"MindSpore's train step runs PyNative for this model: {eager}")
    return framework == "mindspore" and vision_layout.pads_to_fixed_shapes(_MODEL_JSON.hf_config["model_type"], split)


def _megatron_core_installed() -> bool:
    from mmrun import engines

    return engines.megatron_core_installed()


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: Any = None) -> Any:
    """Build Qwen2-VL / Qwen2.5-VL from model.json, start from --load's Hugging Face weights when it is an
    HF directory (else from the seed's weights, the same on both frameworks), and freeze as model.json says."""
    from mmrun.backend import tensors
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.qwen2_vl.modeling import Qwen2VLForConditionalGeneration
    from mmrun.models.vlm.blocks import init_weights

    args = get_args()
    args.recompute_sections = _MODEL_JSON.recompute  # model.json's per-module recompute keys (engines/portable.py)
    if _MODEL_JSON.hf_config["model_type"] == "qwen2_5_omni_thinker":
        if args.use_mcore_models:  # a split run on PyTorch: megatron-core (engines/torch/megatron_core/omni_vlm.py)
            from mmrun.models.qwen2_5_omni.configuration import OmniConfig

            return _core_model(OmniConfig.from_hf_config(_MODEL_JSON.hf_config), pre_process, post_process, vp_stage)
        return _omni_model(args)
    if _MODEL_JSON.hf_config["model_type"] in ("qwen3_vl", "qwen3_vl_moe"):  # unsplit: _model_source checked it
        from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
        from mmrun.models.qwen3_vl.modeling import Qwen3VLForConditionalGeneration

        config = Qwen3VLConfig.from_hf_config(_MODEL_JSON.hf_config)
        model_class = Qwen3VLForConditionalGeneration
        if args.use_mcore_models:  # a split run on PyTorch: megatron-core (engines/torch/megatron_core/qwen3_vlm.py)
            return _core_model(config, pre_process, post_process, vp_stage)
    else:
        config = Qwen2VLConfig.from_hf_config(_MODEL_JSON.hf_config)
        model_class = Qwen2VLForConditionalGeneration
        if args.use_mcore_models:
            return _core_model(config, pre_process, post_process, vp_stage)
        from mmrun.models.vlm.mm_layout import VLMLayout

        VLMLayout.build(config, vit_pp_layers=_MODEL_JSON.pipeline_layers.get("vit"),
                        llm_pp_layers=_MODEL_JSON.pipeline_layers.get("llm"))  # model.json's stage lists fit one stage
    print_rank_0(f"building {config.model_type} model from {_MODEL_JSON.path} ...")
    model = model_class(config)
    init_weights(model, args.seed, args.init_method_std)
    weights = _hf_weights(config)
    if weights is not None:
        model.load_state_dict(tensors.state_dict_from_numpy({name: weights.read_float(name) for name in weights}))
        _loaded_hf(len(weights))
    if args.lora_target_modules:  # Qwen2-VL / Qwen2.5-VL (_model_source refused it for Qwen3-VL)
        # PEFT's rule, as MindSpeed-MM's get_peft_model: adapters on every matching Linear, everything else frozen
        from mmrun.models import lora
        from mmrun.checkpoint.peft import LORA_TARGETS

        lora.apply_from_args(model, args, LORA_TARGETS, print_rank_0)
        return model
    freeze = _MODEL_JSON.freeze
    model.freeze(vision_encoder=freeze["vision_encoder"], vision_projector=freeze["vision_projector"],
                 text_decoder=freeze["text_decoder"])
    frozen = [name for name, on in freeze.items() if on]
    print_rank_0(f" > frozen (no gradients, no optimizer state): {', '.join(frozen) or 'nothing'}")
    if config.model_type == "qwen3_vl_moe" and (args.expert_model_parallel_size or 1) > 1:
        _shard_experts(model, args.expert_model_parallel_size)
    return model


def _shard_experts(model: Any, ep: int) -> None:
    """Expert parallelism on the data-parallel engine: each rank keeps num_experts / EP experts of the weights
    every rank built alike (the seed's or --load's), dispatches tokens over its expert-parallel group, and tells
    the train step that those gradients are reduced over the expert-data-parallel group only."""
    from mmrun import backend
    from mmrun.backend.train_step_shared import LocalGradients
    from mmrun.models.qwen3_vl import model_json as qwen3_model_json
    from mmrun.models.qwen3_vl.moe import ExpertShards, shard_experts

    dist = backend.distributed
    world = dist.get_world_size()
    ep_groups, edp_groups = qwen3_model_json.expert_groups(world, ep)
    group = dist.subgroup(ep_groups)
    replicas = dist.subgroup(edp_groups)
    kept = shard_experts(model, group)
    names = frozenset(name for name, _ in model.named_parameters() if ".mlp.experts." in name)
    object.__setattr__(model, "local_gradients", LocalGradients(names, replicas, replicas.size,
                                                                ExpertShards(group, names)))
    print_rank_0(f" > expert parallelism: {ep} ranks per expert-parallel group, {kept} experts per rank and layer "
                 f"(megatron-core's numbering: EP rank r holds experts r*{kept} .. r*{kept}+{kept - 1}), "
                 f"{world // ep} data-parallel replica(s) of each")


def _omni_model(args: Any) -> Any:
    """Qwen2.5-Omni's thinker from model.json, --load's Hugging Face weights (a thinker or a whole Omni directory)
    when it is one, frozen as model.json says (audio encoder included)."""
    from mmrun.models.qwen2_5_omni import hf_checkpoint
    from mmrun.models.qwen2_5_omni.configuration import OmniConfig, network_dict
    from mmrun.models.vlm.hf_checkpoint import config_difference
    from mmrun.models.qwen2_5_omni.modeling import (Qwen2_5OmniThinkerForConditionalGeneration, init_weights,
                                                     load_hf_weights)

    config = OmniConfig.from_hf_config(_MODEL_JSON.hf_config)
    print_rank_0(f"building qwen2_5_omni_thinker model from {_MODEL_JSON.path} ...")
    model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    init_weights(model, args.seed, args.init_method_std)
    if args.load and hf_checkpoint.is_hf_directory(args.load):
        loaded, arrays = hf_checkpoint.load_hf_directory(args.load)
        difference = config_difference(network_dict(loaded), network_dict(config))
        if difference:
            raise UsageError(f"--load {args.load}: its config.json describes another model than {_MODEL_JSON.path} "
                             f"({difference}); make model.json match the checkpoint")
        load_hf_weights(model, arrays)
        _loaded_hf(len(arrays))
    frozen = model.freeze(**_MODEL_JSON.freeze)
    print_rank_0(f" > frozen (no gradients, no optimizer state): {', '.join(k for k, n in frozen.items() if n) or 'nothing'}")
    return model


def _hf_weights(config: Any) -> Any:
    """--load's weights when it is a Hugging Face directory describing model.json's network (read lazily, one
    tensor at a time: a split run's rank reads only its shard), else None."""
    from mmrun.models.qwen2_vl import hf_checkpoint
    from mmrun.models.qwen3_vl import hf_checkpoint as qwen3_checkpoint

    args = get_args()
    if config.model_type in ("qwen3_vl", "qwen3_vl_moe"):
        hf_checkpoint = qwen3_checkpoint
    if config.model_type == "qwen2_5_omni_thinker":
        from mmrun.models.qwen2_5_omni import hf_checkpoint
    if not (args.load and hf_checkpoint.is_hf_directory(args.load)):
        return None
    return hf_checkpoint.open_for_model(args.load, config, str(_MODEL_JSON.path))


def _loaded_hf(count: int) -> None:
    args = get_args()
    print_rank_0(f" > loaded Hugging Face weights from {args.load} ({count} tensors); training starts at iteration 0")
    args.load = None  # nothing of the loop's own checkpoint layout to resume from


def _core_model(config: Any, pre_process: bool, post_process: bool, vp_stage: Any) -> Any:
    """This pipeline stage on megatron-core (the registry's core_vlm_model), from --load's HF weights sharded
    for this (TP, PP) rank, or from the seed's weights (the one-process run's), frozen as model.json says."""
    from mmrun.training import core_vlm_model

    args = get_args()
    print_rank_0(f"building {config.model_type} model from {_MODEL_JSON.path} on megatron-core ...")
    weights = _hf_weights(config)
    model = core_vlm_model(config, _MODEL_JSON.pipeline_layers, pre_process, post_process, vp_stage,
                           read_hf=None if weights is None else weights.read_float, frozen=_MODEL_JSON.freeze)
    last_chunk = vp_stage is None or vp_stage == (args.virtual_pipeline_model_parallel_size or 1) - 1
    if weights is not None and last_chunk:  # every virtual stage's chunk reads its share first
        _loaded_hf(len(weights))
    frozen = [name for name, on in _MODEL_JSON.freeze.items() if on]
    print_rank_0(f" > frozen (no gradients, no optimizer state): {', '.join(frozen) or 'nothing'}")
    return model


def get_batch(data_iterator: Iterator) -> dict[str, Any]:
    """The next collated micro-batch as tensors on this process's device: integer arrays as they are,
    floating ones (pixel values) in the model's compute dtype, as MindSpeed-MM's move_to_device does."""
    return _to_tensors(next(data_iterator))


def _to_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    from mmrun.backend import tensors

    args = get_args()
    compute = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    return {key: tensors.from_numpy(value, dtype=compute if value.dtype.kind == "f" and compute else None)
            for key, value in batch.items()}


def loss_func(output_tensor: dict[str, Any], token_weight: Any = None) -> tuple[Any, ...]:
    """The micro-batch loss: by default the model's mean over its label tokens (MindSpeed-MM's default);
    with --calculate-per-token-loss the sum of its token losses times `token_weight` (see forward_step),
    so that the step's loss is the mean over every label token of the global batch."""
    loss_dict = output_tensor["loss_dict"]
    if token_weight is None:
        return loss_dict["loss"], {"lm loss": loss_dict["loss"]}
    return loss_dict["loss"] * token_weight, {"lm loss": (loss_dict["loss"], loss_dict["num_tokens"])}


class _GlobalTokenCount:
    """--calculate-per-token-loss: Megatron divides the summed token losses of a step by the number of label
    tokens of the whole global batch (every micro-batch, every data-parallel rank). mmrun's train step
    averages micro-batch losses over micro-batches and ranks, so each micro-batch loss is its token-loss sum
    times num_micro x dp / tokens_in_global_batch: the average is then exactly Megatron's per-token mean,
    for the gradients and for the logged loss. The count needs every micro-batch of the step, so the first
    forward_step of a step reads them all ahead (its own iterator's; evaluation has its own) and all-reduces
    the count once."""

    def __init__(self) -> None:
        self._ahead: dict[int, list[tuple[dict[str, Any], Any]]] = {}

    def next(self, data_iterator: Iterator) -> tuple[dict[str, Any], Any]:
        import numpy as np

        from mmrun import backend
        from mmrun.backend import tensors

        queue = self._ahead.setdefault(id(data_iterator), [])
        if not queue:
            args = get_args()
            batches = [next(data_iterator) for _ in range(args.num_micro_batches)]
            local = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
            total = float(tensors.to_numpy(backend.distributed.all_reduce(
                tensors.from_numpy(np.array([local], dtype=np.float32)), op="sum"))[0])
            weight = args.num_micro_batches * args.data_parallel_size / max(total, 1.0)
            queue.extend((batch, tensors.from_numpy(np.float32(weight))) for batch in batches)
        return queue.pop(0)


IGNORE_INDEX = -100  # label of tokens that carry no loss (prompt, padding, vision tokens)
_TOKEN_COUNT = _GlobalTokenCount()


def token_sum_loss(output_tensor: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """--calculate-per-token-loss on megatron-core: Megatron's (sum of token losses, token count, report);
    its schedule adds the counts of the global batch and divides the gradients by them (finalize_model_grads)."""
    loss_dict = output_tensor["loss_dict"]
    return loss_dict["loss"], loss_dict["num_tokens"], {"lm loss": (loss_dict["loss"], loss_dict["num_tokens"])}


def forward_step(data_iterator: Iterator, model: Any) -> tuple[Any, Any]:
    """model(**batch) -> {"loss_dict", "logits"}, and the loss function to reduce it."""
    args = get_args()
    if not args.calculate_per_token_loss:
        # partial, as Megatron's: MindSpore compiles the loss only then (engines/forward_plan.py)
        return model(**get_batch(data_iterator)), partial(loss_func)
    if args.use_mcore_models:
        return model(**get_batch(data_iterator), calculate_per_token_loss=True), token_sum_loss
    batch, weight = _TOKEN_COUNT.next(data_iterator)
    output = model(**_to_tensors(batch), calculate_per_token_loss=True)
    return output, partial(loss_func, token_weight=weight)


def train_valid_test_datasets_provider(train_val_test_num_samples: tuple[int, int, int]) -> tuple[Any, None, None]:
    """The mllm_format dataset of data.json, repeated over epochs in the seed's order (shuffle as
    dataloader_param says); collated with right padding and Qwen2-VL's multimodal position ids."""
    from mmrun.data.epochs import EpochView
    from mmrun.data.multimodal import mllm_dataset
    from mmrun.data.multimodal.collate import collate as collate_batch

    args = get_args()
    if args.mm_tool:
        read_mm_json(args.mm_tool, "--mm-tool")
    data = read_mm_json(args.mm_data, "--mm-data")
    if not isinstance(data, dict) or not isinstance(data.get("dataset_param"), dict):
        raise UsageError(f"--mm-data {args.mm_data}: needs a dataset_param object (MindSpeed-MM's data.json). "
                         f"Received keys: {', '.join(sorted(data)) if isinstance(data, dict) else type(data).__name__}")
    unknown = sorted(set(data) - {"dataset_param", "dataloader_param"})
    if unknown:
        say_rank0("warning", f"{args.mm_data}: unknown top-level key(s) {', '.join(unknown)} "
                  "(mmrun does not read them)")
    from mmrun.features.mindspeed_keys import check_values  # what features/mindspeed_mm_keys.yaml refuses

    refused = check_values("vlm_data", data, args.mm_data)
    if refused:
        raise UsageError(refused[0])
    loader = data.get("dataloader_param") or {}
    print_rank_0("> building the multimodal dataset ...")
    dataset = mllm_dataset.MultimodalDataset(data["dataset_param"], seq_length=args.seq_length,
                                             skip_bad_samples=args.skip_bad_samples)
    # megatron-core's interleaved (VPP) schedule cannot send variable shapes: with two stages a rank's next and
    # previous stage are one rank, and its shape messages of consecutive calls cross and deadlock. Its batches are
    # padded to --seq-length (right padding: the causal model and the loss are unchanged).
    # MindSpore's compiled step (mindspore.jit) pads the same way, and the ViT's patches to a few buckets
    # (fixed_shape_collate): one graph per bucket instead of one per batch.
    compiled = _fixed_shapes(args)
    fixed = (args.virtual_pipeline_model_parallel_size or 1) > 1 or compiled
    collate = partial(collate_batch, pad_token_id=dataset.token_ids["pad"], rope_config=_rope_config(dataset),
                      max_length=args.seq_length, pad_to_multiple_of=args.seq_length if fixed else 8)
    if compiled:
        collate = partial(fixed_shape_collate, collate=collate, smallest=_first_bucket(dataset, args.micro_batch_size),
                          model_json=_MODEL_JSON)
    train = EpochView(dataset, train_val_test_num_samples[0], seed=args.seed,
                      shuffle=bool(loader.get("shuffle", True)), collate=collate)
    print_rank_0(f" > {len(dataset)} samples, {train.num_samples} to read "
                 f"({'shuffled' if train.shuffle else 'in file order'} each epoch, seed {args.seed})")
    return train, None, None


def _fixed_shapes(args: Any) -> bool:
    """Whether batches are padded to fixed shapes: MindSpore's data-parallel engine compiling the step."""
    from mmrun.backend import selection

    split = (args.tensor_model_parallel_size or 1) > 1 or (args.pipeline_model_parallel_size or 1) > 1
    return selection.framework() == "mindspore" and not args.no_ms_jit and \
        vision_layout.pads_to_fixed_shapes(_MODEL_JSON.hf_config["model_type"], split)


def _first_bucket(dataset: Any, micro_batch_size: int) -> int:
    """The smallest patch bucket: a micro-batch of one largest image per sample (the image limits of data.json
    and the processor), so that most runs compile one graph; at most FIRST_BUCKET_MAX (the ViT's mask grows
    with the square of the bucket)."""
    vision = _MODEL_JSON.hf_config["vision_config"]
    pixels = min(int(dataset.config.preprocess["image_max_pixels"]), int(dataset.image_config.max_pixels))
    unit = int(vision.get("spatial_merge_size", 2)) ** 2
    per_image = -(-pixels // int(vision.get("patch_size", 14)) ** 2 // unit) * unit
    return max(unit, min(micro_batch_size * per_image, FIRST_BUCKET_MAX))


def fixed_shape_collate(samples: Any, collate: Any, smallest: int = 64, model_json: Any = None) -> dict[str, Any]:
    """`collate` (padded to --seq-length), then the images' and videos' patches (images first, the order
    place_fixed_features takes them in) padded to vision_layout.patch_bucket with their segment ids and rotary
    positions (vision_layout.fixed_layout) in place of image_grid_thw / video_grid_thw: every shape of the batch is
    then one of a few, whatever the pictures' sizes and the clips' lengths. The M-RoPE positions (videos' time
    steps, Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's frames) are collate's, on the host. Checks on the host what
    the model checks on a variable-shape batch (vision tokens against features). `model_json`: the main process's,
    for a --num-workers process (spawned), which has read none."""
    import numpy as np

    from mmrun.models.vlm import vision_layout
    from mmrun.models.vlm.blocks import TRUNCATION_HINT

    global _MODEL_JSON
    if _MODEL_JSON is None:  # a --num-workers process (spawned): the model.json the main process read
        _MODEL_JSON = model_json
    batch = collate(samples)
    config = _MODEL_JSON.hf_config
    vision = config["vision_config"]
    merge, dim = int(vision.get("spatial_merge_size", 2)), _patch_dim(vision)
    batch.pop("second_per_grid_ts", None)  # read by collate's position_ids only
    grids, pixels = [], []
    for name, token, values, grid_key in (("image", config["image_token_id"], "pixel_values", "image_grid_thw"),
                                          ("video", config["video_token_id"], "pixel_values_videos",
                                           "video_grid_thw")):
        grid = batch.pop(grid_key, None)
        values = batch.pop(values, np.zeros((0, dim), np.float32))
        total = 0 if grid is None else int(vision_layout.patch_counts(grid).sum())
        found = int((batch["input_ids"] == token).sum())
        if values.shape[0] != total or found != total // (merge * merge):
            raise ValueError(f"{name} tokens and features do not match: input_ids hold {found} {name} tokens, the "
                             f"pixel values {values.shape[0]} patches (grid: {total}); {TRUNCATION_HINT}")
        grids += [] if grid is None else [grid]
        pixels.append(values)
    grid = np.concatenate(grids) if grids else None
    total = sum(p.shape[0] for p in pixels)
    patches = vision_layout.patch_bucket(total, smallest)
    batch["pixel_values"] = np.concatenate([*pixels, np.zeros((patches - total, dim), pixels[0].dtype)])
    batch["pixel_segment_ids"], batch["pixel_position_ids"] = vision_layout.fixed_layout(grid, merge, patches)
    batch.update(_fixed_inputs(grid, patches))
    return batch


def _fixed_inputs(grid: Any, patches: int) -> dict[str, Any]:
    """A model's own fixed-shape inputs (Qwen2.5-VL's window ids, Qwen3-VL's position taps: its family's
    fixed_vision_inputs), from its config object (built once)."""
    from mmrun.models import families

    global _FIXED_CONFIG
    family = families.by_model_type(_MODEL_JSON.hf_config["model_type"])
    if _FIXED_CONFIG is None:
        _FIXED_CONFIG = families.config_class(family).from_hf_config(_MODEL_JSON.hf_config)
    return families.part(family, "fixed_vision_inputs")(_FIXED_CONFIG, grid, patches)


def _patch_dim(vision: dict[str, Any]) -> int:
    return (int(vision.get("in_chans", 3)) * int(vision.get("temporal_patch_size", 2))
            * int(vision.get("patch_size", 14)) ** 2)


def _rope_config(dataset: Any) -> Any:
    """Multimodal RoPE as model.json's model computes it (Qwen2.5-VL's time scale included), after checking that
    model.json's vision token ids are the tokenizer's: a mismatch would put image features on text tokens."""
    from mmrun.data.multimodal.rope_index import RopeConfig

    config = _MODEL_JSON.hf_config
    if config["model_type"] == "qwen2_5_omni_thinker":
        from mmrun.models.qwen2_5_omni.model_json import check_token_ids
        return check_token_ids(_MODEL_JSON, dataset)
    rope = RopeConfig.from_model_config(config)
    ids = dataset.token_ids
    pairs = (("img_context_token_id", rope.image_token_id, "<|image_pad|>", ids["image_pad"]),
             ("video_token_id", rope.video_token_id, "<|video_pad|>", ids["video_pad"]),
             ("vision_start_token_id", rope.vision_start_token_id, "<|vision_start|>", ids["vision_start"]))
    for key, ours, token, theirs in pairs:
        if ours != theirs:
            raise UsageError(f"{_MODEL_JSON.path}: {key} is {ours} but the tokenizer of --mm-data gives {token} the "
                             f"id {theirs}; set {key} to {theirs} (model.json and tokenizer.json must agree)")
    vocab, ours = dataset.tokenizer.vocab_size, config.get("vocab_size") or config["text_config"]["vocab_size"]
    if vocab > ours:
        raise UsageError(f"{_MODEL_JSON.path}: text_decoder.vocab_size {ours} is smaller than the "
                         f"tokenizer's {vocab} tokens; raise it to at least {vocab}")
    return rope


def main(argv: list[str] | None = None) -> Any:
    tokens = list(sys.argv[1:] if argv is None else argv)
    try:
        source = _model_source(tokens)
    except UsageError as err:
        say_rank0("error", str(err))
        raise SystemExit(2) from None
    return pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step,
                    args_defaults=CPU_DEFAULTS, extra_args_provider=extra_args_provider, argv=tokens,
                    model_source=source)



if __name__ == "__main__":
    main()
