"""Qwen2VLConverter / Qwen2_5_VLConverter for `mmrun convert` (MindSpeed-MM's mm-convert command lines).

    hf_to_mm   a Hugging Face directory -> `<mm_dir>/release`, one rank directory per (TP, PP) rank in
               MindSpeed-MM's names (training/checkpoint_vlm.py), split as --cfg.parallel_config says
               (tp_size, vit_pp_layers, llm_pp_layers: model.json's pipeline_num_layers, one list per virtual
               pipeline chunk for VPP: [[2,0],[0,0]], chunk-major); what --load takes
               (with --no-load-optim --no-load-rng as MindSpeed-MM's scripts pass them, or --finetune)
    mm_to_hf   the newest checkpoint of `<mm_dir>` (any split, or a data-parallel run's checkpoint in Hugging Face
               names) -> a Hugging Face directory `<save_hf_dir>` that transformers loads, in the dtype of
               `<hf_config.hf_dir>` (the original download), with its tokenizer and processor files copied
    resplit    the newest checkpoint of `<source_dir>` -> `<target_dir>/release` split as
               --cfg.target_parallel_config says (mm-convert's options)
    lora_to_peft         the LoRA adapters of a pretrain_vlm.py --lora-target-modules run (--cfg.source_path: its
                         --save) -> --cfg.target_path in PEFT's layout for transformers' model (peft loads it)
    merge_lora_to_base   a Hugging Face directory (--cfg.source_path) + a PEFT adapter (--cfg.lora_path) -> the
                         merged Hugging Face directory (--cfg.target_path; W + B A lora_alpha/r, the source's dtype)

The source's split is read from its files; a --cfg.parallel_config (mm_to_hf) or --cfg.source_parallel_config
(resplit) that the guides pass is checked against them. Every conversion streams tensor by tensor (memory: a few
copies of the largest tensor), prints `[i/n] tensors, x GB` lines on large models, and replaces its output
directory in one step only when complete. Weights are fp32 in mmrun's checkpoints (an exact widening of bf16),
so HF -> mmrun (any split) -> resplit -> HF gives the original bytes back.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mmrun.backend.errors import UsageError
from mmrun.checkpoint.formats import safetensors
from mmrun.checkpoint.formats.hf_directory import NotAnHFDirectoryError
from mmrun.models import families
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.vlm import hf_checkpoint, mm_layout
from mmrun.models.vlm.mm_layout import LayoutError, VLMLayout, stages_given, virtual_chunks
from mmrun.training import checkpoint_vlm
from mmrun.training.checkpoint_layout import CheckpointError

# converter -> the model_types it converts (MindSpeed-MM's Qwen3VLMegatronConverter takes dense and MoE alike)
CONVERTER_MODEL_TYPES = {"Qwen2VLConverter": ("qwen2_vl",), "Qwen2_5_VLConverter": ("qwen2_5_vl",),
                         "Qwen3VLMegatronConverter": ("qwen3_vl", "qwen3_vl_moe"),
                         "Qwen2_5_OmniConverter": ("qwen2_5_omni_thinker",)}
LOAD_HINT = "--no-load-optim --no-load-rng, or --finetune"


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise UsageError(f"--cfg.{dotted} is required. Received: {_given(cfg)}")
        node = node[part]
    return node


def _given(cfg: dict[str, Any], prefix: str = "") -> str:
    keys = []
    for key, value in cfg.items():
        keys.extend([_given(value, f"{prefix}{key}.")] if isinstance(value, dict) else [f"--cfg.{prefix}{key}"])
    return ", ".join(k for k in keys if k) or "no --cfg options"


def _check_model_type(converter: str, config: Qwen2VLConfig, where: str) -> Qwen2VLConfig:
    wanted = CONVERTER_MODEL_TYPES[converter]
    if config.model_type not in wanted:
        other = next(name for name, kinds in CONVERTER_MODEL_TYPES.items() if config.model_type in kinds)
        raise UsageError(f"{converter} converts model_type {' or '.join(wanted)}, but {where} says {config.model_type}; "
                         f"use {other}")
    return config


def _checkpoints(converter: str) -> Any:
    """The module reading this converter's Hugging Face directories: its family's (models/families.py)."""
    return families.part(families.by_model_type(CONVERTER_MODEL_TYPES[converter][0]), "hf_checkpoint")


def _config(converter: str, hf_dir: str) -> Qwen2VLConfig:
    try:
        config = _checkpoints(converter).load_hf_config(hf_dir)
    except NotAnHFDirectoryError as err:
        raise UsageError(f"--cfg.hf_config.hf_dir: {err}") from None
    return _check_model_type(converter, config, f"{hf_dir}/config.json")


def _stage_layers(value: Any, option: str) -> list[Any]:
    """[[12,16]] (hf_to_mm's form: one list per virtual pipeline chunk) or [12,16] (mm_to_hf's) -> per-stage
    counts; two or more chunks ([[6,7],[7,8]]: virtual pipeline stages, chunk-major) stay a list per chunk."""
    def counts(values: Any) -> bool:
        return isinstance(values, list) and bool(values) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)

    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        if all(counts(chunk) for chunk in value) and len({len(chunk) for chunk in value}) == 1:
            return value[0] if len(value) == 1 else value
    elif counts(value):
        return value
    raise UsageError(f"--cfg.{option} must be a list of layer counts per pipeline stage such as [[12,16]] (one "
                     f"list per virtual pipeline chunk, each as long as the others). Received: {json.dumps(value)}")


def _layout(cfg: dict[str, Any], key: str, config: Qwen2VLConfig) -> VLMLayout:
    """The split that --cfg.<key> (mm-convert's parallel_config) describes, checked against the model. Missing
    keys: tp_size 1, the ViT on the first stage, the decoder layers split evenly."""
    parallel = cfg.get(key, {})
    if not isinstance(parallel, dict):
        raise UsageError(f"--cfg.{key} must hold tp_size, vit_pp_layers and llm_pp_layers. Received: "
                         f"{json.dumps(parallel)}")
    tp = parallel.get("tp_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise UsageError(f"--cfg.{key}.tp_size must be a positive integer. Received: {json.dumps(tp)}")
    given = {name: _stage_layers(parallel[name], f"{key}.{name}") for name in ("vit_pp_layers", "llm_pp_layers")
             if name in parallel}
    for name, total, what in (("vit_pp_layers", config.vision.depth, "vision encoder"),
                              ("llm_pp_layers", config.text.num_hidden_layers, "text decoder")):
        held = sum(_flat(given[name])) if name in given else total
        if held != total:
            raise LayoutError(f"--cfg.{key}.{name} {json.dumps(parallel[name])} sums to {held}, but the "
                              f"{what} has {total} layers; they must match (model.json's pipeline_num_layers)")
    shapes = {(stages_given(v), virtual_chunks(v)) for v in given.values()}
    if len(shapes) > 1:
        raise LayoutError(f"--cfg.{key}.vit_pp_layers {json.dumps(parallel['vit_pp_layers'])} and llm_pp_layers "
                          f"{json.dumps(parallel['llm_pp_layers'])} give different numbers of pipeline stages or "
                          "virtual chunks; give both one entry per stage and the same number of chunks")
    pp = shapes.pop()[0] if shapes else 1
    if "audio_pp_layers" in parallel:
        _check_audio_stages(parallel["audio_pp_layers"], f"{key}.audio_pp_layers", config, pp)
    try:
        return VLMLayout.build(config, tp, pp, given.get("vit_pp_layers"), given.get("llm_pp_layers"))
    except LayoutError as err:
        raise LayoutError(f"--cfg.{key} (tp_size {tp}, {pp} pipeline stage{'s' if pp > 1 else ''}) does not fit this "
                          f"{config.model_type} model: {err}") from None


def _check_audio_stages(value: Any, option: str, config: Any, pp: int) -> None:
    """mm-convert's audio_pp_layers (Qwen2.5-Omni): mmrun keeps the whole audio encoder on the first stage, beside
    the ViT, as MindSpeed-MM's example does ([[32,0]])."""
    audio = getattr(config, "audio", None)
    if audio is None:
        raise UsageError(f"--cfg.{option}: a {config.model_type} model has no audio encoder; leave the option out")
    layers = _stage_layers(value, option)
    chunks = virtual_chunks(layers)
    flat = _flat(layers)
    wanted = [audio.num_layers] + [0] * (max(pp, 1) * chunks - 1)
    if flat != wanted:
        shown = [wanted[c * pp:(c + 1) * pp] for c in range(chunks)]
        raise LayoutError(f"--cfg.{option} {json.dumps(value)}: mmrun keeps the whole audio encoder "
                          f"({audio.num_layers} layers) on the first pipeline stage; give {json.dumps(shown)}")


def _ep_size(cfg: dict[str, Any], key: str) -> int:
    """--cfg.<key>.ep_size (mm-convert's expert-parallel size: each rank directory holds num_experts / ep_size
    experts); 1 when left out."""
    ep = (cfg.get(key) or {}).get("ep_size", 1) if isinstance(cfg.get(key), dict) else 1
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise UsageError(f"--cfg.{key}.ep_size must be a positive integer. Received: {json.dumps(ep)}")
    return ep


def _flat(layers: list[Any]) -> list[int]:
    return [n for chunk in layers for n in chunk] if virtual_chunks(layers) > 1 else list(layers)


def _describe(layout: VLMLayout, ep: int = 1) -> str:
    return (f"tp_size {layout.tp}, vit_pp_layers {layout.pipeline_num_layers('vit')}, llm_pp_layers "
            f"{layout.pipeline_num_layers('llm')}" + (f", ep_size {ep}" if ep > 1 else ""))


def _check_given_split(cfg: dict[str, Any], key: str, source: checkpoint_vlm.Source) -> None:
    """What a --cfg.<key> the user passed says (tp_size, vit_pp_layers, llm_pp_layers: those given) must be the
    split the source's files hold."""
    if key not in cfg:
        return
    given = _layout(cfg, key, source.config)
    held = VLMLayout.build(source.config) if source.names == checkpoint_vlm.HF_NAMES else source.layout
    keys = [name for name in ("tp_size", "vit_pp_layers", "llm_pp_layers") if name in cfg[key]]
    fields = {"tp_size": lambda lay: lay.tp, "vit_pp_layers": lambda lay: lay.pipeline_num_layers("vit"),
              "llm_pp_layers": lambda lay: lay.pipeline_num_layers("llm")}
    ep = _ep_size(cfg, key)
    if "ep_size" in cfg[key] and ep != source.ep:
        raise UsageError(f"--cfg.{key}.ep_size {ep} does not match the checkpoint in {source.path}, whose experts are "
                         f"split over {source.ep} expert-parallel rank{'s' if source.ep > 1 else ''}; pass ep_size "
                         f"{source.ep} (or leave it out: mmrun reads the split from the files)")
    if any(fields[name](given) != fields[name](held) for name in keys):
        what = "data-parallel checkpoint" if source.names == checkpoint_vlm.HF_NAMES else "checkpoint"
        raise UsageError(f"--cfg.{key} ({_describe(given)}) does not match the {what} in {source.path}, which holds "
                         f"{_describe(held)}; pass those (or leave --cfg.{key} out: mmrun reads the split from the "
                         "files)")


def _open(converter: str, root: str, option: str, config: Qwen2VLConfig | None) -> checkpoint_vlm.Source:
    from mmrun.training.checkpoint_store import recover_interrupted_saves

    if not Path(root).is_dir():
        raise UsageError(f"--cfg.{option} {root}: no such directory; pass the --save directory of the training run "
                         "or the --cfg.mm_dir of a conversion")
    recover_interrupted_saves(root)
    source = checkpoint_vlm.open_checkpoint(root, config)
    _check_model_type(converter, source.config, f"the checkpoint in {source.path}")
    return source


def _progress(tensors: int, total_bytes: int) -> checkpoint_vlm.Progress:
    return checkpoint_vlm.Progress(tensors, total_bytes)


def hf_to_mm(converter: str, cfg: dict[str, Any]) -> None:
    mm_dir, hf_dir = _get(cfg, "mm_dir"), _get(cfg, "hf_config.hf_dir")
    config = _config(converter, hf_dir)
    layout = _layout(cfg, "parallel_config", config)
    ep = _ep_size(cfg, "parallel_config")
    checkpoint_vlm.check_expert_split(layout, ep)
    try:
        weights = _checkpoints(converter).HFWeights(hf_dir)
    except ValueError as err:  # NotAnHFDirectoryError, wrong tensor names
        raise UsageError(f"--cfg.hf_config.hf_dir: {err}") from None
    total = sum(weights.nbytes(name) for name in weights)
    print(f"converting {hf_dir} ({len(weights)} tensors, {total / 1e6:.1f} MB) to {_describe(layout, ep)} ...",
          flush=True)
    tensors = _progress(len(layout.full_shapes()), total)(mm_layout.hf_to_mm(config, weights.__getitem__))
    meta = {"iteration": 0, "converted_from": str(Path(hf_dir).resolve()), "model_type": config.model_type}
    written = checkpoint_vlm.write_checkpoint(mm_dir, layout, tensors, meta, ep=ep)
    print(f"wrote {layout.tp * layout.pp * ep} rank directories to {written} (load it with --load {mm_dir} "
          f"{LOAD_HINT})", flush=True)


def _saved_dtype(hf_dir: str) -> str | None:
    raw = json.loads((Path(hf_dir) / "config.json").read_text(encoding="utf-8"))
    dtype = raw.get("torch_dtype") or raw.get("dtype") or (raw.get("text_config") or {}).get("torch_dtype")
    return dtype if dtype in ("bfloat16", "float16", "float32") else None


def mm_to_hf(converter: str, cfg: dict[str, Any]) -> None:
    save_dir, mm_dir, hf_dir = _get(cfg, "save_hf_dir"), _get(cfg, "mm_dir"), _get(cfg, "hf_config.hf_dir")
    config = _config(converter, hf_dir)
    try:
        source = _open(converter, mm_dir, "mm_dir", config)
    except (UsageError, CheckpointError) as err:
        if ".lora_A.weight" not in str(err):
            raise
        raise UsageError(f"--cfg.mm_dir {mm_dir} is a LoRA run's checkpoint (the base and its adapters): write the "
                         f"adapter with lora_to_peft --cfg.source_path {mm_dir} --cfg.target_path ADAPTER, then "
                         "merge_lora_to_base it into the base's Hugging Face directory") from None
    _check_given_split(cfg, "parallel_config", source)
    dtype = _saved_dtype(hf_dir)
    print(f"converting {source.path} ({source.describe()}) to {save_dir} in "
          f"{dtype or 'float32'} ...", flush=True)
    shapes = mm_layout.hf_shapes(config)
    stored = source.dtype()
    try:
        hf_checkpoint.write_hf_directory(save_dir, config,
                                         _progress(len(shapes), source.total_bytes())(source.hf_tensors()),
                                         {name: stored for name in shapes}, dtype=dtype, copy_files_from=hf_dir)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"wrote {save_dir} ({len(shapes)} tensors; transformers' from_pretrained loads it)", flush=True)


def resplit(converter: str, cfg: dict[str, Any]) -> None:
    source_dir, target_dir = _get(cfg, "source_dir"), _get(cfg, "target_dir")
    hf_dir = (cfg.get("hf_config") or {}).get("hf_dir")
    config = _config(converter, hf_dir) if hf_dir else None
    source = _open(converter, source_dir, "source_dir", config)
    _check_given_split(cfg, "source_parallel_config", source)
    layout = _layout(cfg, "target_parallel_config", source.config)
    ep = _ep_size(cfg, "target_parallel_config")
    checkpoint_vlm.check_expert_split(layout, ep)
    print(f"resplitting {source.path} ({source.describe()}) to {_describe(layout, ep)} ...",
          flush=True)
    iteration = source.meta.get("iteration", 0)
    meta = {"iteration": iteration if isinstance(iteration, int) else 0, "converted_from": str(source.path.resolve()),
            "model_type": source.config.model_type}
    tensors = _progress(len(layout.full_shapes()), source.total_bytes())(source.mm_tensors())
    written = checkpoint_vlm.write_checkpoint(target_dir, layout, tensors, meta, ep=ep)
    print(f"wrote {layout.tp * layout.pp * ep} rank directories to {written} (load it with --load {target_dir} "
          f"{LOAD_HINT})", flush=True)


def lora_to_peft(converter: str, cfg: dict[str, Any]) -> None:
    from mmrun.models import lora
    from mmrun.checkpoint.peft import adapter_to_peft
    from mmrun.training.checkpoint_store import open_save_directory

    target = _get(cfg, "target_path")
    ckpt = open_save_directory(_get(cfg, "source_path"), "pretrain_vlm.py LoRA")
    _, adapter = lora.split_adapter(ckpt.model)
    if not adapter and any(".lora_A." in name for name in ckpt.model):  # engines/mindspore/parallel/vlm_lora.py's
        raise UsageError(f"{ckpt.path} is a LoRA run split over tensor/pipeline ranks (its adapters in each rank's "
                         "shard, on the fused layers): lora_to_peft reads an unsplit run's checkpoint only yet; train "
                         "the LoRA unsplit (--tensor-/--pipeline-model-parallel-size 1) to export it")
    if not adapter:
        raise UsageError(f"{ckpt.path} holds no LoRA adapters (no *.lora_A.weight); it is a full fine-tune: use "
                         "mm_to_hf")
    config = lora.checkpoint_adapter_config(ckpt.meta, adapter)
    peft = adapter_to_peft(adapter)
    config["target_modules"] = sorted({name[: -len(lora.LORA_SUFFIXES[0])] for name in peft
                                       if name.endswith(lora.LORA_SUFFIXES[0])})
    out = lora.write_adapter(target, config, peft, base_model=cfg.get("hf_dir"))
    print(f"wrote {out} ({len(config['target_modules'])} adapted layers, r {config['r']}, "
          f"alpha {config['lora_alpha']:g}) from {ckpt.path}")


def merge_lora_to_base(converter: str, cfg: dict[str, Any]) -> None:
    from mmrun.models import lora
    from mmrun.checkpoint.peft import adapter_from_peft

    source, target = _get(cfg, "source_path"), _get(cfg, "target_path")
    config = _config(converter, source)
    lora_config, adapter = lora.read_adapter(_get(cfg, "lora_path"))
    _, base = _checkpoints(converter).load_hf_directory(source)
    merged = lora.merged_weights(safetensors.to_float_arrays(base), lora_config, adapter_from_peft(adapter))
    try:
        out = hf_checkpoint.save_hf_directory(target, config, merged, dtype=_saved_dtype(source),
                                              copy_files_from=source)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"wrote {out}: {source} with the adapter of {cfg['lora_path']} merged")


SUBCOMMANDS: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "hf_to_mm": hf_to_mm, "mm_to_hf": mm_to_hf, "resplit": resplit, "lora_to_peft": lora_to_peft,
    "merge_lora_to_base": merge_lora_to_base,
}
