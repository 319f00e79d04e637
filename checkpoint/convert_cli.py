"""`mmrun convert`: MindSpeed-MM's `mm-convert` command lines, as the guides write them.

    mmrun convert Qwen2VLConverter hf_to_mm \\
      --cfg.mm_dir ckpt/mm_path/Qwen2-VL-2B-Instruct \\
      --cfg.hf_config.hf_dir ckpt/hf_path/Qwen2-VL-2B-Instruct \\
      --cfg.parallel_config.llm_pp_layers [[28]] --cfg.parallel_config.vit_pp_layers [[32]] \\
      --cfg.parallel_config.tp_size 1
    mmrun convert Qwen2VLConverter mm_to_hf \\
      --cfg.save_hf_dir ckpt/mm_to_hf/Qwen2-VL-2B-Instruct --cfg.mm_dir save_dir \\
      --cfg.hf_config.hf_dir ckpt/hf_path/Qwen2-VL-2B-Instruct \\
      --cfg.parallel_config.llm_pp_layers [28] --cfg.parallel_config.vit_pp_layers [32] \\
      --cfg.parallel_config.tp_size 1
    mmrun convert Qwen2VLConverter resplit --cfg.source_dir save_dir --cfg.target_dir ckpt/resplit \\
      --cfg.target_parallel_config.llm_pp_layers [14,14] --cfg.target_parallel_config.vit_pp_layers [32,0] \\
      --cfg.target_parallel_config.tp_size 2

Options are mm-convert's (jsonargparse): `--cfg.a.b VALUE` or `--cfg.a.b=VALUE`, values read as JSON where
they parse (lists, numbers, true/false/null) and as text otherwise; `--config FILE.yaml` gives the same
keys as a YAML file (command-line options win). The converters live with their model family
(CONVERTERS below); each takes the nested `cfg` dict.

exit status: 0 done, 2 usage error (bad option or input directory), 1 anything else.
"""
from __future__ import annotations

import importlib
import json
import sys
from typing import Any, Callable

from mmrun.backend.errors import UsageError
from mmrun.common.yaml_tables import TableError
from mmrun.training.checkpoint_layout import CheckpointError

PROG = "mmrun convert"
# MindSpeed-MM converter name -> the module whose SUBCOMMANDS implement it.
CONVERTERS: dict[str, str] = {
    "Qwen2VLConverter": "mmrun.checkpoint.vlm",
    "Qwen2_5_VLConverter": "mmrun.checkpoint.vlm",
    "Qwen3VLMegatronConverter": "mmrun.checkpoint.vlm",  # MindSpeed-MM's mcore Qwen3-VL names
    "Qwen2_5_OmniConverter": "mmrun.checkpoint.vlm",  # Qwen2.5-Omni's thinker (models/qwen2_5_omni/mm_layout.py)
    "WanConverter": "mmrun.checkpoint.wan",
}

USAGE = f"""usage: {PROG} CONVERTER SUBCOMMAND [--cfg.KEY VALUE ...] [--config FILE.yaml]

converters: {', '.join(CONVERTERS)}
subcommands: hf_to_mm (Hugging Face directory -> mmrun checkpoint, split over TP/PP ranks; a MoE model's experts
also over EP ranks: --cfg.parallel_config.ep_size), mm_to_hf (mmrun checkpoint of any split -> Hugging Face
directory), resplit (any tensor/pipeline/expert split -> any other)
WanConverter: mm_to_hf (pretrain_sora.py checkpoint -> diffusers transformer/ directory, LoRA folded in),
lora_to_peft (its LoRA adapters -> PEFT's adapter directory), merge_lora_to_base (diffusers dir + adapter -> merged)

examples:
  {PROG} Qwen2VLConverter hf_to_mm --cfg.mm_dir ckpt/mm --cfg.hf_config.hf_dir ckpt/hf \\
      --cfg.parallel_config.llm_pp_layers [[28]] --cfg.parallel_config.vit_pp_layers [[32]] \\
      --cfg.parallel_config.tp_size 1
  {PROG} Qwen2VLConverter mm_to_hf --cfg.save_hf_dir ckpt/out --cfg.mm_dir save_dir --cfg.hf_config.hf_dir ckpt/hf
  {PROG} Qwen2VLConverter resplit --cfg.source_dir save_dir --cfg.target_dir ckpt/tp2 \\
      --cfg.target_parallel_config.llm_pp_layers [14,14] --cfg.target_parallel_config.vit_pp_layers [32,0] \\
      --cfg.target_parallel_config.tp_size 2
  {PROG} WanConverter mm_to_hf --cfg.source_path save_dir --cfg.target_path out/transformer --cfg.hf_dir ckpt/transformer

Docs: docs/multimodal.md ("Weights"), docs/generation.md (Wan2.1).
exit status: 0 done, 2 usage error, 1 anything else.
"""


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    node = cfg
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UsageError(f"--cfg.{dotted}: {part} was already given a value ({child!r}); it cannot also hold keys")
        node = child
    node[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def parse_options(tokens: list[str]) -> dict[str, Any]:
    """`--cfg.a.b VALUE` / `--cfg.a.b=VALUE` / `--config FILE` -> the nested cfg dict."""
    from mmrun.common.yaml_tables import load_yaml

    cfg: dict[str, Any] = {}
    from_file: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        if name == "--config":
            if not eq:
                i += 1
                if i >= len(tokens):
                    raise UsageError("--config needs a YAML file. Received: nothing after it")
                inline = tokens[i]
            loaded = load_yaml(inline)
            if not isinstance(loaded, dict):
                raise UsageError(f"--config {inline}: must hold a mapping of options. Received: {type(loaded).__name__}")
            _merge(from_file, loaded.get("cfg", loaded))
        elif name.startswith("--cfg."):
            if not eq:
                i += 1
                if i >= len(tokens):
                    raise UsageError(f"{name} needs a value. Received: nothing after it")
                inline = tokens[i]
            _set(cfg, name[len("--cfg."):], _value(inline))
        else:
            raise UsageError(f"unrecognized option {token!r}; options are --cfg.KEY VALUE (mm-convert's) or --config "
                             "FILE.yaml (see mmrun convert --help)")
        i += 1
    return _merge(from_file, cfg)


def main(argv: list[str] | None = None) -> int:
    tokens = list(sys.argv[1:] if argv is None else argv)
    if not tokens or tokens[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if len(tokens) < 2 or tokens[1] in ("-h", "--help"):
        if tokens[0] in CONVERTERS:
            print(USAGE, end="")
            return 0 if len(tokens) > 1 else 2
    name = tokens[0]
    try:
        if name not in CONVERTERS:
            raise UsageError(f"unknown converter {name!r}; mmrun converts {', '.join(CONVERTERS)}")
        subcommands: dict[str, Callable[[str, dict[str, Any]], None]] = importlib.import_module(
            CONVERTERS[name]).SUBCOMMANDS
        sub = tokens[1]
        if sub not in subcommands:
            raise UsageError(f"unknown subcommand {sub!r} of {name}; choose one of {', '.join(subcommands)}")
        subcommands[sub](name, parse_options(tokens[2:]))
    except (UsageError, TableError, CheckpointError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{PROG}: error: {err}; no output written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
