"""The parallel VLM's checkpoints on disk, read and written one tensor at a time (`mmrun convert`, and
loading a VLM checkpoint into a run of another layout: checkpoint_reshard_vlm.py).

A checkpoint in MindSpeed-MM's names (model_names "mindspeed-mm", as both parallel engines and `mmrun convert`
write it) has one rank directory per (tensor, pipeline) rank, named as the training loop names them
(training/checkpoint_layout.rank_dir_name), each holding that rank's tensors as mm_layout's
`rank_shapes(tp_rank, pp_rank)` names and shapes them, in fp32 (mmrun's checkpoint dtype; bf16 widens exactly):

    <root>/release/mp_rank_01_000/model.safetensors   text_decoder.decoder.layers.0.self_attention.linear_qkv.weight ...
    <root>/release/mp_rank_01_000/meta.json           format, iteration, model_names, parallel {tp, pp, tp_rank,
                                                      pp_rank}, hf_config (the model's config.json), checksums
    <root>/latest_checkpointed_iteration.txt          "release"

Its split is read back from the files: the tensor and pipeline sizes from the rank directories, the layers per
stage from the tensor names of each stage. A data-parallel checkpoint of the one-process VLM (one `mp_rank_00`
with the Hugging Face names) reads the same way, as a source.

Memory: reading takes one tensor's shards from the files by their offsets (SafetensorsFile); writing sends each
whole tensor's shards to the rank files as it comes (SafetensorsWriter); so a conversion holds a few copies of
the largest tensor, never the model. The iteration directory is built under a temporary name and swapped in
whole, then the tracker moves (training/checkpoint_store.write_iteration): an interrupted conversion leaves
the previous checkpoint, or nothing.
"""
from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from mmrun.backend import checkpoint_io
from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import fsync_dir
from mmrun.models.vlm import mm_layout
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.checkpoint.formats.safetensors import SafetensorsFile, SafetensorsWriter, bf16_bits_to_float32
from mmrun.models.vlm.mm_layout import TEXT_LAYERS, VISION_LAYERS, VLMLayout
from mmrun.training.checkpoint_layout import (RELEASE, CheckpointError, iteration_dir, rank_dir_name, read_tracker,
                                              saved_iterations)
from mmrun.training.checkpoint_store import tensor_digest, write_iteration

MM_NAMES = "mindspeed-mm"  # MindSpeed-MM's names, one rank directory per (TP, PP) rank
HF_NAMES = "hf-qwen2-vl"  # Hugging Face names, one shard: the data-parallel VLM's checkpoints
CHECKPOINT_DTYPE = np.dtype(np.float32)
PROGRESS_MIN_BYTES = 1 << 30  # progress lines for conversions of at least this many bytes
_RANK_DIR = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?")  # tp[, pp][, expert-parallel rank]
_CHUNK_PREFIX = re.compile(r"model(\d+)\.")  # a virtual pipeline chunk's tensors (mm_layout.chunk_prefix)


class Progress:
    """`[i/n] tensors, x GB` lines at every tenth of the bytes, for conversions of PROGRESS_MIN_BYTES or more."""

    def __init__(self, tensors: int, total_bytes: int, min_bytes: int | None = None,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.tensors, self.total, self.log = tensors, total_bytes, log
        self.on = total_bytes >= (PROGRESS_MIN_BYTES if min_bytes is None else min_bytes)
        self.done = self.bytes = self.next_tenth = 0

    def __call__(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in items:
            yield name, array
            self.done += 1
            self.bytes += array.nbytes
            if self.on and (self.bytes * 10 >= self.total * (self.next_tenth + 1) or self.done == self.tensors):
                self.next_tenth = min(10, self.bytes * 10 // max(self.total, 1))
                self.log(f"[{self.done}/{self.tensors}] tensors, {self.bytes / 1e9:.2f} GB")


def as_checkpoint_dtype(array: np.ndarray) -> np.ndarray:
    """fp32, as mmrun's checkpoints hold weights: bf16 bits (uint16) and fp16 widen exactly."""
    if array.dtype == np.uint16:
        return bf16_bits_to_float32(array)
    return array.astype(CHECKPOINT_DTYPE, copy=False)


# ------------------------------------------------------------------------------------------ reading

@dataclass
class _Rank:
    path: Path
    meta: dict[str, Any]
    model: SafetensorsFile
    optimizer: SafetensorsFile | None
    parts: tuple["_Rank", ...] = ()  # expert-parallel ranks joined into this one (model: _ExpertRanks)


def _read_rank(path: Path) -> _Rank:
    meta_file, model_file = path / checkpoint_io.META_FILE, path / checkpoint_io.MODEL_FILE
    if not meta_file.is_file() or not model_file.is_file():
        raise CheckpointError(f"{path} is incomplete (it needs {checkpoint_io.MODEL_FILE} and "
                              f"{checkpoint_io.META_FILE}); pass a checkpoint that mmrun wrote")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        model = SafetensorsFile(model_file)
        optimizer_file = path / checkpoint_io.OPTIMIZER_FILE
        optimizer = SafetensorsFile(optimizer_file) if "optimizer" in meta and optimizer_file.is_file() else None
    except (ValueError, OSError, struct.error) as err:
        raise CheckpointError(f"{path} is corrupt or truncated ({err}); use another checkpoint") from None
    return _Rank(path, meta, model, optimizer)



def _verify(rank: _Rank) -> None:
    """The rank's tensors against the checksum recorded when it was saved, one tensor at a time."""
    if rank.parts:
        for part in rank.parts:
            _verify(part)
        return
    checksums = rank.meta.get("checksums") or {}
    for part, file in (("model", rank.model), ("optimizer", rank.optimizer)):
        if file is not None and part in checksums and tensor_digest(file) != checksums[part]:
            raise CheckpointError(f"{file.path} is corrupt: its tensors do not match the checksum recorded when it "
                                  "was saved; use another checkpoint")


def _expert_rank_of(child: Path, match: re.Match) -> tuple[int, int, int]:
    """(tp, pp, expert-parallel rank) of a rank directory: `mp_rank_00_001` is pipeline stage 1, or expert rank 1
    when its meta.json says the checkpoint is split over experts alone (ep > 1, pp 1), as megatron-core names it."""
    tp, second, third = int(match.group(1)), match.group(2), match.group(3)
    if third is not None:
        return tp, int(second), int(third)
    if second is not None:
        try:
            parallel = json.loads((child / checkpoint_io.META_FILE).read_text(encoding="utf-8")).get("parallel", {})
        except (OSError, ValueError):
            parallel = {}
        if parallel.get("ep", 1) > 1 and parallel.get("pp", 1) == 1:
            return tp, 0, int(second)
    return tp, int(second or 0), 0


def _rank_grid(path: Path) -> dict[tuple[int, int], list[Path]]:
    """(tp_rank, pp_rank) -> its rank directories (one per expert-parallel rank, in rank order) of one iteration
    directory; one naming form only."""
    found: dict[tuple[int, int], list[Path]] = {}
    forms = set()
    experts: dict[tuple[int, int], dict[int, Path]] = {}
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        match = _RANK_DIR.fullmatch(child.name)
        if match and child.is_dir():
            forms.add(match.group(2) is None)
            t, p, e = _expert_rank_of(child, match)
            experts.setdefault((t, p), {})[e] = child
    for key, by_rank in experts.items():
        if sorted(by_rank) != list(range(len(by_rank))) or len({len(r) for r in experts.values()}) > 1:
            raise CheckpointError(f"{path} is missing expert-parallel rank directories (found "
                                  f"{', '.join(p.name for r in experts.values() for p in r.values())}); copy the "
                                  "whole checkpoint directory")
        found[key] = [by_rank[e] for e in sorted(by_rank)]
    if not found:
        raise CheckpointError(f"{path} holds no mp_rank_* directory; pass the --save directory of a training run "
                              "or the --cfg.mm_dir of a conversion")
    if len(forms) > 1:
        raise CheckpointError(f"{path} mixes rank directories with and without a pipeline stage "
                              f"({', '.join(p.name for p in found.values())}); it holds two checkpoints: keep one")
    tp = 1 + max(t for t, _ in found)
    pp = 1 + max(p for _, p in found)
    missing = [rank_dir_name(t, p, pp) for p in range(pp) for t in range(tp) if (t, p) not in found]
    if missing:
        raise CheckpointError(f"{path} is missing rank directories {', '.join(missing[:4])} for tensor-parallel "
                              f"size {tp} x pipeline size {pp}; copy the whole checkpoint directory")
    return found


def _stage_layers(names: Iterable[str], prefix: str) -> int:
    return len({name[len(prefix):].split(".", 1)[0] for name in names if name.startswith(prefix)})


def config_class(hf_config: Mapping[str, Any]) -> Any:
    """The config class of a config.json's family (the family table, models/families.py)."""
    from mmrun.models import families

    return families.config_class(families.by_model_type(hf_config.get("model_type")))


def _config_of(meta: Mapping[str, Any], given: Qwen2VLConfig | None) -> Qwen2VLConfig:
    if given is not None:
        return given
    if isinstance(meta.get("hf_config"), dict):
        return config_class(meta["hf_config"]).from_hf_config(meta["hf_config"])
    model_json = (meta.get("args") or {}).get("mm_model")
    if model_json and Path(model_json).is_file():
        from mmrun.models.vlm.model_json import read_model_json

        spec = read_model_json(model_json)
        return config_class(spec.hf_config).from_hf_config(spec.hf_config)
    raise UsageError("the checkpoint does not record its model's config (no hf_config in its meta.json, and its "
                     f"--mm-model {model_json or '(none)'} is not here); pass --cfg.hf_config.hf_dir, the model's "
                     "Hugging Face directory")


class _ExpertRanks(Mapping[str, np.ndarray]):
    """The model files of one (tp, pp) rank's expert-parallel ranks read as one, experts in global numbers
    (rank r's local expert k is expert r * per_rank + k; every other tensor is rank 0's)."""

    def __init__(self, files: list[SafetensorsFile]) -> None:
        local = [int(m.group(1)) for name in files[0] for m in [mm_layout._EXPERT.search(name)] if m]
        experts = (1 + max(local, default=0)) * len(files)
        self.where: dict[str, tuple[SafetensorsFile, str]] = {}
        for r, file in enumerate(files):
            for name in file:
                whole = mm_layout.expert_global_name(name, experts, len(files), r)
                if r == 0 or whole != name:
                    self.where[whole] = (file, name)
        self.path = files[0].path

    def __getitem__(self, name: str) -> np.ndarray:
        file, local = self.where[name]
        return file[local]

    def shape(self, name: str) -> tuple[int, ...]:
        file, local = self.where[name]
        return file.shape(local)

    def dtype(self, name: str) -> np.dtype:
        file, local = self.where[name]
        return file.dtype(local)

    def nbytes(self, name: str) -> int:
        file, local = self.where[name]
        return file.nbytes(local)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def _join_expert_ranks(parts: list[_Rank]) -> _Rank:
    """One (tp, pp) rank's expert-parallel ranks as one _Rank: model weights and optimizer state (where every
    rank saved it), experts in global numbers."""
    if len(parts) == 1:
        return parts[0]
    optimizer = None if any(p.optimizer is None for p in parts) else _ExpertRanks([p.optimizer for p in parts])
    return _Rank(parts[0].path, parts[0].meta, _ExpertRanks([p.model for p in parts]), optimizer, tuple(parts))


class _Suffixed(Mapping[str, np.ndarray]):
    """The `<param>.<key>` tensors of an optimizer file, named `<param>` (one state key, e.g. exp_avg)."""

    def __init__(self, file: SafetensorsFile, key: str) -> None:
        self.file, self.suffix = file, "." + key
        self._names = [n[:-len(self.suffix)] for n in file if n.endswith(self.suffix)]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.file[name + self.suffix]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.shape(name + self.suffix)

    def dtype(self, name: str) -> np.dtype:
        return self.file.dtype(name + self.suffix)

    def nbytes(self, name: str) -> int:
        return self.file.nbytes(name + self.suffix)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class Source:
    """One checkpoint opened for reading whole tensors one at a time, in either names (module docstring).
    `files` maps (tp_rank, pp_rank) to that rank's tensors (its model file, or one key of its optimizer state,
    which may lack frozen parameters)."""

    def __init__(self, path: Path, iteration: int | str, ranks: dict[tuple[int, int], _Rank], config: Qwen2VLConfig,
                 names: str, layout: VLMLayout, files: Mapping[tuple[int, int], Any] | None = None) -> None:
        self.path, self.iteration, self.ranks = path, iteration, ranks
        self.config, self.names, self.layout = config, names, layout
        self.files = files if files is not None else {key: rank.model for key, rank in ranks.items()}
        self.meta = ranks[(0, 0)].meta

    @property
    def ep(self) -> int:
        """The expert-parallel ranks each (tp, pp) rank's experts are split over (1: one directory each)."""
        return max(len(self.ranks[(0, 0)].parts), 1)

    def describe(self) -> str:
        """`iteration 10; <names and split>` for the progress lines."""
        lay = self.layout
        where = f"iteration {self.iteration}" if isinstance(self.iteration, int) else str(self.iteration)
        if self.names == HF_NAMES:
            return f"{where}; Hugging Face names, one data-parallel shard"
        return (f"{where}; MindSpeed-MM names, tp_size {lay.tp}, vit_pp_layers {lay.pipeline_num_layers('vit')}, "
                f"llm_pp_layers {lay.pipeline_num_layers('llm')}" + (f", ep_size {self.ep}" if self.ep > 1 else ""))

    # ------------------------------------------------------------------ optimizer state

    def optimizer_keys(self) -> list[str] | None:
        """The optimizer state keys every rank saved (exp_avg, exp_avg_sq, main_param), None without state."""
        if any(rank.optimizer is None for rank in self.ranks.values()):
            return None
        return sorted({name.rpartition(".")[2] for rank in self.ranks.values() for name in rank.optimizer})

    def optimizer_state(self, key: str) -> "Source":
        """The same checkpoint's optimizer state for one key, read as tensors named after their parameters."""
        files = {k: _Suffixed(rank.optimizer, key) for k, rank in self.ranks.items()}
        return Source(self.path, self.iteration, self.ranks, self.config, self.names, self.layout, files)

    # ------------------------------------------------------------------ reading

    def read_hf(self, name: str) -> np.ndarray:
        return self.files[(0, 0)][name]

    def has_mm(self, name: str) -> bool:
        """Whether the checkpoint holds the tensor of this global MindSpeed-MM name (optimizer state: frozen
        parameters have none)."""
        if self.names == HF_NAMES:
            return all(s in self.files[(0, 0)] for s in mm_layout.hf_sources(self.config)[name])
        stage, local = self.layout.locate(name)[0]
        return local in self.files[(0, stage)]

    def read_mm(self, name: str) -> np.ndarray:
        """A whole tensor in global MindSpeed-MM names, joined from its tensor-parallel shards."""
        if self.names == HF_NAMES:
            return mm_layout.mm_reader(self.config, self.read_hf)(name)
        stage, local = self.layout.locate(name)[0]
        return self.layout.join(local, [self.files[(t, stage)][local] for t in range(self.layout.tp)])

    def mm_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """The whole model (what it holds of it) in global MindSpeed-MM names and order, one tensor at a time."""
        return ((name, self.read_mm(name)) for name in self.layout.full_shapes() if self.has_mm(name))

    def hf_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """The whole model (what it holds of it) in Hugging Face names (mmrun's layout), one tensor at a time."""
        if self.names == HF_NAMES:
            held = self.files[(0, 0)]
            return ((name, held[name]) for name in mm_layout.hf_shapes(self.config) if name in held)
        return mm_layout.hf_stream(self.config, self.mm_tensors())

    def rank_tensors(self, target: VLMLayout, tp_rank: int, pp_rank: int) -> dict[str, np.ndarray]:
        """What rank (tp_rank, pp_rank) of `target` holds (what the checkpoint holds of it), in its local names."""
        out = {}
        for local in target.rank_shapes(tp_rank, pp_rank):
            inner = target.split_chunk(local)[1]
            name = (mm_layout.WORD_EMBEDDINGS if inner == mm_layout.OUTPUT_LAYER and target.ties_output_copy
                    else target.global_name(pp_rank, local))
            if self.has_mm(name):
                out[local] = target.shard(local, self.read_mm(name), tp_rank)
        return out

    def dtype(self) -> np.dtype:
        dtypes = {file.dtype(name) for file in self.files.values() for name in file}
        if len(dtypes) != 1:
            raise CheckpointError(f"{self.path} holds tensors of several dtypes ({sorted(map(str, dtypes))}); "
                                  "mmrun's checkpoints hold one")
        return dtypes.pop()

    def total_bytes(self) -> int:
        return sum(file.nbytes(name) for (t, _), file in self.files.items() for name in file
                   if t == 0 or self.layout.partition_dim(name) is not None)


def find_iteration(root: str | os.PathLike) -> tuple[Path, int | str]:
    """The iteration directory `--load root` would take: the tracker's, else the newest one there."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory; pass the --save directory of the training run or the "
                         "--cfg.mm_dir of a conversion")
    iteration = read_tracker(root)
    if iteration is None:
        found = saved_iterations(root)
        if not found:
            raise UsageError(f"{root} holds no checkpoint (no latest_checkpointed_iteration.txt and no iter_* or "
                             "release directory); pass the --save directory of the training run")
        iteration = found[0]
    path = iteration_dir(root, iteration)
    if not path.is_dir():
        raise CheckpointError(f"{root}'s tracker names iteration {iteration}, but {path} does not exist; fix "
                              "latest_checkpointed_iteration.txt")
    return path, iteration


def open_checkpoint(root: str | os.PathLike, config: Qwen2VLConfig | None = None,
                    verify: bool = True) -> Source:
    """The checkpoint `--load root` would take, its split read from its files and checked against the model's
    shapes (`config`: the model's; None reads it from the checkpoint's meta.json). `verify` checks every rank's
    checksums (one more read of each tensor)."""
    return open_iteration(*find_iteration(root), config=config, verify=verify)


def open_iteration(path: Path, iteration: int | str, config: Qwen2VLConfig | None = None,
                   verify: bool = True) -> Source:
    """open_checkpoint for one iteration directory (`<root>/iter_0000010`, `<root>/release`)."""
    ranks = {key: _join_expert_ranks([_read_rank(p) for p in paths]) for key, paths in _rank_grid(path).items()}
    first = ranks[(0, 0)]
    config = _config_of(first.meta, config)
    names = _names_of(first, config)
    if names == HF_NAMES:
        if len(ranks) > 1:
            raise CheckpointError(f"{path} holds Hugging Face names in {len(ranks)} rank directories; a checkpoint in "
                                  "these names has one shard")
        layout = VLMLayout.build(config)
        _check_tensors(first, mm_layout.hf_shapes(config), "the Hugging Face names")
    else:
        layout = _layout_from_files(path, ranks, config)
    source = Source(path, iteration, ranks, config, names, layout)
    if verify:
        for rank in ranks.values():
            _verify(rank)
    return source


def _names_of(rank: _Rank, config: Qwen2VLConfig) -> str:
    inner = [_CHUNK_PREFIX.sub("", n, count=1) if _CHUNK_PREFIX.match(n) else n for n in rank.model]
    if any(n.startswith(("image_encoder.", "text_decoder.")) for n in inner):
        return MM_NAMES
    hf_starts = ("visual.", "model.visual.", "model.language_model.")  # Qwen2-VL's hub names, Qwen3-VL's
    if "model.embed_tokens.weight" in rank.model or any(n.startswith(hf_starts) for n in rank.model):
        return HF_NAMES
    raise CheckpointError(f"{rank.path} holds no {config.model_type} tensors (model_names "
                          f"{rank.meta.get('model_names', 'unknown')!r}, e.g. {next(iter(rank.model), 'none')}); "
                          "pass a Qwen2-VL checkpoint")


def _layout_from_files(path: Path, ranks: Mapping[tuple[int, int], _Rank], config: Qwen2VLConfig) -> VLMLayout:
    tp = 1 + max(t for t, _ in ranks)
    pp = 1 + max(p for _, p in ranks)
    # virtual pipeline chunks: the engine's `model{v}.` name prefixes (none: one chunk per stage)
    chunks = 1 + max((int(m.group(1)) for rank in ranks.values() for name in rank.model
                      for m in [_CHUNK_PREFIX.match(name)] if m), default=-1)
    vit, llm = ([[0] * pp for _ in range(max(chunks, 1))] for _ in range(2))
    for p in range(pp):
        names = set(ranks[(0, p)].model)
        for t in range(1, tp):
            if set(ranks[(t, p)].model) != names:
                differ = sorted(names ^ set(ranks[(t, p)].model))
                raise CheckpointError(f"{ranks[(t, p)].path} and {ranks[(0, p)].path} hold different tensors "
                                      f"({', '.join(differ[:3])}); the rank directories come from different "
                                      "splits: copy one checkpoint's directories only")
        for v in range(max(chunks, 1)):
            prefix = mm_layout.chunk_prefix(v, chunks)
            vit[v][p] = _stage_layers(names, prefix + VISION_LAYERS)
            llm[v][p] = _stage_layers(names, prefix + TEXT_LAYERS)
    if chunks <= 1:
        vit, llm = vit[0], llm[0]
    try:
        layout = VLMLayout.build(config, tp, pp, vit, llm)
    except mm_layout.LayoutError as err:
        raise CheckpointError(f"{path} does not hold a split of this {config.model_type} model (tp {tp}, vit layers "
                              f"per stage {vit}, llm layers per stage {llm}): {err}") from None
    for (t, p), rank in sorted(ranks.items()):
        _check_tensors(rank, layout.rank_shapes(t, p), f"rank ({t}, {p}) of tp {tp} x pp {pp}")
    return layout


def _check_tensors(rank: _Rank, expected: Mapping[str, tuple[int, ...]], what: str) -> None:
    held = {name: rank.model.shape(name) for name in rank.model}
    missing = [n for n in expected if n not in held]
    unexpected = [n for n in held if n not in expected]
    wrong = [f"{n} {held[n]} (model {tuple(expected[n])})" for n in expected if n in held
             and held[n] != tuple(expected[n])]
    problems = [f"{label} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                for label, keys in (("shape", wrong), ("missing", missing), ("unexpected", unexpected)) if keys]
    if problems:
        raise CheckpointError(f"{rank.path} does not hold {what} of the config's model ({'; '.join(problems)}); "
                              "pass the config it was saved with (--cfg.hf_config.hf_dir)")


# ------------------------------------------------------------------------------------------ writing

def write_checkpoint(root: str | os.PathLike, layout: VLMLayout, tensors: Iterable[tuple[str, np.ndarray]],
                     meta: Mapping[str, Any], iteration: int | str = RELEASE, ep: int = 1) -> Path:
    """`<root>/<iteration>/mp_rank_*` in MindSpeed-MM names for `layout`, from whole tensors in global names
    (`tensors`, each yielded once, any dtype mmrun reads), written as they come; then the tracker. Returns the
    iteration directory. `meta` goes into every rank's meta.json (with model_names, parallel, hf_config,
    checksums added). `ep` > 1 splits a MoE model's experts over that many expert-parallel ranks
    (`mp_rank_TT[_PPP]_EEE`, megatron-core's names: each holds its num_experts / ep experts numbered from 0 and
    every other tensor of its (tp, pp) rank)."""
    experts = check_expert_split(layout, ep)
    ranks = [(t, p, e) for p in range(layout.pp) for t in range(layout.tp) for e in range(ep)]

    def rank_dir(directory: Path, t: int, p: int, e: int) -> Path:
        return directory / rank_dir_name(t, p, layout.pp, e if ep > 1 else None)

    def places(local: str) -> list[tuple[int, str]]:
        place = mm_layout.expert_place(local, experts, ep) if ep > 1 else None
        return [place] if place is not None else [(e, local) for e in range(ep)]

    def fill(directory: Path) -> None:
        writers: dict[tuple[int, int, int], SafetensorsWriter] = {}
        try:
            for t, p, e in ranks:
                path = rank_dir(directory, t, p, e)
                path.mkdir()
                shapes = {there: shape for name, shape in layout.rank_shapes(t, p).items()
                          for r, there in places(name) if r == e}
                writers[(t, p, e)] = SafetensorsWriter(
                    path / checkpoint_io.MODEL_FILE, {name: (CHECKPOINT_DTYPE, shape) for name, shape in shapes.items()},
                    metadata={"format": checkpoint_io.FORMAT})
            for name, array in tensors:
                whole = as_checkpoint_dtype(array)
                for stage, local in layout.locate(name):
                    for t in range(layout.tp):
                        shard = layout.shard(local, whole, t)
                        for e, there in places(local):
                            writers[(t, stage, e)].write(there, shard)
            for writer in writers.values():
                writer.close()
        except BaseException:
            for writer in writers.values():
                writer.abort()
            raise
        for t, p, e in ranks:
            path = rank_dir(directory, t, p, e)
            digest = tensor_digest(SafetensorsFile(path / checkpoint_io.MODEL_FILE))
            parallel = {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": 1, "dp": 1, "tp_rank": t,
                        "pp_rank": p, **({"ep": ep, "ep_rank": e} if ep > 1 else {})}
            info = {"format": checkpoint_io.FORMAT, "version": checkpoint_io.VERSION, **meta,
                    "iteration": meta.get("iteration", 0), "model_names": MM_NAMES, "parallel": parallel,
                    "hf_config": layout.config.to_hf_config(), "checksums": {"model": digest}}
            with open(path / checkpoint_io.META_FILE, "w", encoding="utf-8") as f:
                f.write(json.dumps(info, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(path)

    return write_iteration(root, iteration, fill)


def check_expert_split(layout: VLMLayout, ep: int) -> int:
    """The model's experts per MoE layer, checked against `ep` (one line, exit 2, when they do not split)."""
    moe = getattr(layout.config.text, "moe", None)
    experts = moe.num_experts if moe is not None else 0
    if ep == 1:
        return experts
    if not experts:
        raise mm_layout.LayoutError(f"expert-parallel size {ep} for a {layout.config.model_type} model, which has no "
                                    "experts; use ep_size 1")
    if experts % ep:
        raise mm_layout.LayoutError(f"expert-parallel size {ep} does not divide the model's {experts} experts; use "
                                    f"a divisor of {experts}")
    return experts
