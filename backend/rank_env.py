"""Rank information from either launcher's environment, with no framework imported.

torchrun gives each worker `RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT`;
msrun gives `RANK_ID RANK_SIZE DEVICE_ID MS_SCHED_HOST MS_SCHED_PORT MS_ROLE` and none of the torch
names. Both the msrun worker bootstrap (which exports the torch names) and the backend read ranks
through this one module so the two schemes are mapped in exactly one place.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# torch-style name -> msrun name it is derived from (None: msrun has no equivalent).
TORCH_FROM_MSRUN: dict[str, str | None] = {
    "RANK": "RANK_ID",
    "WORLD_SIZE": "RANK_SIZE",
    "LOCAL_RANK": "DEVICE_ID",
    "MASTER_ADDR": "MS_SCHED_HOST",
    "MASTER_PORT": "MS_SCHED_PORT",
    # msrun does not export the per-node worker count; `mmrun` exports LOCAL_WORLD_SIZE itself.
    "LOCAL_WORLD_SIZE": None,
}


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    scheme: str  # "torchrun", "msrun" or "single" (no launcher)
    role: str  # "worker", or "scheduler" for msrun's MS_SCHED process

    @property
    def is_scheduler(self) -> bool:
        return self.role == "scheduler"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; unset it or give a whole number") from None


def read_rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Ranks from torchrun's variables, else msrun's, else a single process."""
    env = os.environ if environ is None else environ
    role = "scheduler" if env.get("MS_ROLE") == "MS_SCHED" else "worker"
    # msrun first: once the bootstrap has exported torch-style names, MS_ROLE still says who started us.
    if "MS_ROLE" in env or "RANK_ID" in env:
        world = _int(env, "RANK_SIZE", _int(env, "MS_WORKER_NUM", 1))
        return RankInfo(
            rank=_int(env, "RANK_ID", 0),
            local_rank=_int(env, "DEVICE_ID", 0),
            world_size=world,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
            master_addr=env.get("MS_SCHED_HOST", "127.0.0.1"),
            master_port=_int(env, "MS_SCHED_PORT", 8118),
            scheme="msrun",
            role=role,
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE", 1)
        return RankInfo(
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=world,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", 29500),
            scheme="torchrun",
            role=role,
        )
    return RankInfo(0, 0, 1, 1, "127.0.0.1", 29500, scheme="single", role="worker")


def torch_style_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torch-style variables a worker is missing, derived from msrun's ones.

    Variables already present are never overwritten: an explicit setting wins.
    """
    env = os.environ if environ is None else environ
    info = read_rank_info(env)
    derived = {
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "MASTER_ADDR": info.master_addr,
        "MASTER_PORT": str(info.master_port),
    }
    return {name: value for name, value in derived.items() if name not in env}
