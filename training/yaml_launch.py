"""MindSpeed-MM's single-YAML launch form: `pretrain_transformers.py job.yaml` instead of Megatron flags.

    gpt_args:   Megatron's arguments in snake_case (`micro_batch_size: 1`, `use_torch_fsdp2: true`,
                `fsdp2_config_path: ...`), any of mmrun's own too (`metrics_file: m.jsonl`)
    data:       what --mm-data's data.json holds
    model:      what --mm-model's model.json holds (`init_from_hf_path`, ...)

YAML anchors and aliases work (MindSpeed-MM's examples/qwen3vl/qwen3vl_full_sft_8B.yaml defines paths
once at the top: `HF_MODEL_LOAD_PATH: &HF_MODEL_LOAD_PATH ./ckpt/...` and uses `*HF_MODEL_LOAD_PATH`).
Other top-level keys are those anchors' holders and are ignored. Framework-free: the launcher reads
`gpt_args` to check the FSDP2 file before any worker starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mmrun.common.yaml_tables import TableError, load_yaml
from mmrun.engines.base import ArgumentsError
from mmrun.engines.fsdp2_config import FSDP2Config, check_with_training_args, given_from_argv, load_fsdp2_config

SECTIONS = ("gpt_args", "data", "model")


@dataclass
class YamlLaunch:
    argv: list[str]  # Megatron flags, dashed
    data: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)


def _read(path: str | Path) -> dict[str, Any]:
    try:
        data = load_yaml(path)
    except TableError as err:
        raise ArgumentsError(str(err).splitlines()[0]) from None
    if not isinstance(data, dict) or not isinstance(data.get("gpt_args"), dict):
        raise ArgumentsError(f"{path}: a single-YAML launch needs a gpt_args mapping (Megatron's arguments in "
                             "snake_case) beside data and model; see docs/fsdp2.md")
    return data


def gpt_args_of(path: str | Path) -> dict[str, Any]:
    return dict(_read(path)["gpt_args"])


def to_argv(gpt_args: dict[str, Any]) -> list[str]:
    """snake_case keys -> `--dashed-flags`: true -> the bare flag, false/null -> left out, a list -> its
    values after one flag (Megatron's nargs='+')."""
    argv: list[str] = []
    for key, value in gpt_args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def read_yaml_launch(path: str | Path) -> YamlLaunch:
    data = _read(path)
    for section in ("data", "model"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise ArgumentsError(f"{path}: {section} must be a mapping (what {section}.json holds). "
                                 f"Received: {type(data[section]).__name__}")
    return YamlLaunch(to_argv(data["gpt_args"]), dict(data.get("data") or {}), dict(data.get("model") or {}))


def check_launch(script_args: Sequence[str]) -> FSDP2Config | None:
    """What the launcher checks before it starts any worker: the FSDP2 file of `--use-torch-fsdp2
    --fsdp2-config-path F` (Megatron flags), or of `gpt_args.fsdp2_config_path` in a single YAML given
    as the entry's first argument. None when the job uses no FSDP2 file."""
    given = given_from_argv(script_args)
    if script_args and str(script_args[0]).endswith((".yaml", ".yml")) and Path(script_args[0]).is_file():
        given = {**gpt_args_of(script_args[0]), **given}  # the single-YAML form
    path = given.get("fsdp2_config_path")
    if not given.get("use_torch_fsdp2") or not path:
        return None
    config = load_fsdp2_config(path)
    check_with_training_args(config, given)
    return config
