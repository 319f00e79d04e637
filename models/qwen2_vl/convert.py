"""Qwen2VLConverter / Qwen2_5_VLConverter for `mmrun convert` (MindSpeed-MM's mm-convert command lines).

    hf_to_mm   a Hugging Face directory -> an mmrun checkpoint `<mm_dir>/release` (what --load takes, with
               --no-load-optim --no-load-rng as MindSpeed-MM's scripts pass them; or --finetune)
    mm_to_hf   the newest checkpoint of `<mm_dir>` -> a Hugging Face directory `<save_hf_dir>` that transformers
               loads, in the dtype of `<hf_config.hf_dir>` (the original download), with its tokenizer and
               processor files copied
    resplit    change the tensor/pipeline split: nothing to do for one stage (see below)

mmrun's checkpoints keep the Hugging Face parameter names and fp32 values (an exact widening of bf16), so a
round trip HF -> mmrun -> HF gives the original bytes. parallel_config must describe one stage (tp_size 1,
llm_pp_layers [[L]], vit_pp_layers [[V]]): mmrun trains the VLM with data parallelism, whose checkpoints
are one shard; a split the guides use for larger models (e.g. [[1,10,10,7]]) is refused with that reason.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mmrun.backend.errors import UsageError
from mmrun.models.qwen2_vl import hf_checkpoint

CONVERTER_MODEL_TYPES = {"Qwen2VLConverter": "qwen2_vl", "Qwen2_5_VLConverter": "qwen2_5_vl"}


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


def _config(converter: str, hf_dir: str) -> Any:
    try:
        config = hf_checkpoint.load_hf_config(hf_dir)
    except hf_checkpoint.NotAnHFDirectoryError as err:
        raise UsageError(f"--cfg.hf_config.hf_dir: {err}") from None
    wanted = CONVERTER_MODEL_TYPES[converter]
    if config.model_type != wanted:
        other = next(name for name, kind in CONVERTER_MODEL_TYPES.items() if kind == config.model_type)
        raise UsageError(f"{converter} converts model_type {wanted}, but {hf_dir}/config.json says "
                         f"{config.model_type}; use {other}")
    return config


def _stage_layers(value: Any, name: str) -> list[int]:
    """[[28]] (hf_to_mm's form, one list per virtual stage) or [28] (mm_to_hf's) -> the per-stage counts."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if not (isinstance(value, list) and value and all(isinstance(v, int) and v >= 0 for v in value)):
        raise UsageError(f"--cfg.parallel_config.{name} must be a list of layer counts per pipeline stage such as "
                         f"[[28]]. Received: {json.dumps(value)}")
    return value


def _check_one_stage(cfg: dict[str, Any], config: Any) -> None:
    parallel = cfg.get("parallel_config", {})
    tp = parallel.get("tp_size", 1)
    if tp != 1:
        raise UsageError(f"--cfg.parallel_config.tp_size {tp}: mmrun trains Qwen2-VL with data parallelism, whose "
                         "checkpoints are one shard; use tp_size 1")
    for name, total, what in (("llm_pp_layers", config.text.num_hidden_layers, "text decoder"),
                              ("vit_pp_layers", config.vision.depth, "vision encoder")):
        if name not in parallel:
            continue
        stages = _stage_layers(parallel[name], name)
        if sum(stages) != total:
            raise UsageError(f"--cfg.parallel_config.{name} {json.dumps(parallel[name])} sums to {sum(stages)}, but the "
                             f"{what} has {total} layers; they must match (model.json's pipeline_num_layers)")
        if len(stages) != 1:
            raise UsageError(f"--cfg.parallel_config.{name} {json.dumps(parallel[name])} splits the {what} over "
                             f"{len(stages)} pipeline stages, which mmrun's Qwen2-VL training does not use; "
                             f"use [[{total}]]")


def hf_to_mm(converter: str, cfg: dict[str, Any]) -> None:
    from mmrun.training.checkpoint_layout import RELEASE
    from mmrun.training.checkpoint_store import write_checkpoint

    mm_dir, hf_dir = _get(cfg, "mm_dir"), _get(cfg, "hf_config.hf_dir")
    config = _config(converter, hf_dir)
    _check_one_stage(cfg, config)
    print(f"reading {hf_dir} ...", flush=True)
    _, arrays = hf_checkpoint.load_hf_directory(hf_dir)
    model = hf_checkpoint.to_float_arrays(arrays)
    meta = {"iteration": 0, "converted_from": str(Path(hf_dir).resolve()), "model_names": "hf-qwen2-vl",
            "model_type": config.model_type}
    write_checkpoint(mm_dir, RELEASE, model, None, meta, log=lambda message: None)
    print(f"wrote {len(model)} tensors to {Path(mm_dir) / RELEASE} (load it with --load {mm_dir} --no-load-optim "
          "--no-load-rng, or --finetune)", flush=True)


def _saved_dtype(hf_dir: str) -> str | None:
    raw = json.loads((Path(hf_dir) / "config.json").read_text(encoding="utf-8"))
    dtype = raw.get("torch_dtype") or raw.get("dtype") or (raw.get("text_config") or {}).get("torch_dtype")
    return dtype if dtype in ("bfloat16", "float16", "float32") else None


def mm_to_hf(converter: str, cfg: dict[str, Any]) -> None:
    from mmrun.training.checkpoint_store import find_checkpoint, recover_interrupted_saves

    save_dir, mm_dir, hf_dir = _get(cfg, "save_hf_dir"), _get(cfg, "mm_dir"), _get(cfg, "hf_config.hf_dir")
    config = _config(converter, hf_dir)
    _check_one_stage(cfg, config)
    if not Path(mm_dir).is_dir():
        raise UsageError(f"--cfg.mm_dir {mm_dir}: no such directory; pass the --save directory of the training run")
    recover_interrupted_saves(mm_dir)
    ckpt = find_checkpoint(mm_dir, log=lambda message: print(message, flush=True))
    if ckpt is None:
        raise UsageError(f"--cfg.mm_dir {mm_dir} holds no checkpoint (no latest_checkpointed_iteration.txt and no "
                         "iter_* directory); pass the --save directory of the training run")
    dtype = _saved_dtype(hf_dir)
    print(f"converting {ckpt.path} (iteration {ckpt.iteration}) to {save_dir} in {dtype or 'float32'} ...", flush=True)
    try:
        hf_checkpoint.save_hf_directory(save_dir, config, ckpt.model, dtype=dtype, copy_files_from=hf_dir)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"wrote {save_dir} ({len(ckpt.model)} tensors; transformers' from_pretrained loads it)", flush=True)


def resplit(converter: str, cfg: dict[str, Any]) -> None:
    raise UsageError("resplit changes a tensor/pipeline split, and mmrun's Qwen2-VL checkpoints have one stage "
                     "(data parallelism): there is nothing to re-split; --load takes them at any data-parallel size")


SUBCOMMANDS: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "hf_to_mm": hf_to_mm, "mm_to_hf": mm_to_hf, "resplit": resplit,
}
