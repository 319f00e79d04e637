"""Megatron-LM's training arguments: the same names, spellings and meanings, checked before any work.

A Megatron launch script's GPT_ARGS / DATA_ARGS / OUTPUT_ARGS parse unchanged. Flags fall in four sets:

- implemented here (model size, batch sizes, learning-rate schedule, data, checkpoints, logging);
- feature flags whose support depends on framework and device (`--bf16`, `--tensor-model-parallel-size`,
  `--ckpt-format`, ...): declared from the feature table (features/) and judged by the feature gate;
- Megatron flags mmrun ignores (a warning) or refuses (a usage error): megatron_flags.yaml;
- anything else: an "unrecognized argument" usage error that suggests the closest known flag.

Every multi-word flag also takes the underscore spelling (`--micro_batch_size`). Errors are one line
and raise `ArgumentsError` (exit code 2); `pretrain()` prints them and exits.

    args = parse_args(["--num-layers", "2", ...], world_size=2)
    args.num_micro_batches   # global batch / (micro batch x data-parallel size)
"""
from __future__ import annotations

import argparse
import difflib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from mmrun.backend import rank_env
from mmrun.backend.dropout_hash import DROPOUT_IMPLS
from mmrun.features import add_gate_arguments, trainer_table as load_table  # the trainer layer's flags
from mmrun.backend.errors import UsageError
from mmrun.backend.vocabulary import FRAMEWORKS, framework_name
from mmrun.common.yaml_tables import check_keys, load_yaml
from mmrun.data.tokenizers import TOKENIZER_BUILDERS
from mmrun.engines.base import ArgumentsError  # one definition, below the engines that raise it too

PROG = "pretrain_gpt.py"
FLAGS_TABLE = Path(__file__).with_name("megatron_flags.yaml")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")
# What mmrun's GPT builds is the first of each; the rest are accepted where a model file (ModelSource) gives the model.
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "mrope")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
CKPT_FORMATS = ("safetensors", "torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")
DEFAULT_SPLIT = "969, 30, 1"  # Megatron's default when --split is not given
MOCK_VOCAB_SIZE = 512  # NullTokenizer size for --mock-data when no --vocab-size is given

EPILOG = """\
examples:
  # a tiny GPT on synthetic tokens, one process (CPU-sized defaults for the model)
  python models/pretrain_gpt.py --mock-data --train-iters 20 --log-interval 1

  # the same dropout masks on PyTorch and MindSpore (to compare or resume across them)
  mmrun --ai-framework mindspore models/pretrain_gpt.py --mock-data --train-iters 20 --dropout-impl hash

  # Megatron's pretrain_single.sh arguments, through mmrun on MindSpore with 2 processes
  # the same masks on both frameworks (for comparing or resuming across them)
  mmrun --ai-framework mindspore models/pretrain_gpt.py --mock-data --train-iters 20 --dropout-impl hash

  mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_gpt.py \\
      --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \\
      --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 \\
      --lr 0.00015 --train-iters 20 --lr-decay-style cosine --min-lr 1.0e-5 \\
      --weight-decay 1e-2 --lr-warmup-fraction .01 --clip-grad 1.0 \\
      --data-path out/demo_text_document --vocab-file data/corpus/gpt2-vocab.json \\
      --merge-file data/corpus/gpt2-merges.txt --split 949,50,1 \\
      --log-interval 1 --save-interval 10 --eval-interval 10 --eval-iters 2 --save ckpt

exit status: 0 done, 2 usage error (bad or unsupported argument), 1 anything else.
Docs: docs/training.md (flags mmrun ignores or refuses are listed there).
"""



class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the whole usage block and exit
        raise ArgumentsError(f"{message} (see {self.prog} --help)")


# ----------------------------------------------------------------------------------- flag spellings

def spellings(flag: str) -> list[str]:
    """`--foo-bar` -> [`--foo-bar`, `--foo_bar`]: every multi-word flag takes both, as the house rule says."""
    alt = "--" + flag[2:].replace("-", "_")
    return [flag] if alt == flag else [flag, alt]


def dest_of(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _add(group, flag: str, *aliases: str, **kwargs: Any) -> None:
    names = list(dict.fromkeys([n for f in (flag, *aliases) for n in spellings(f)]))
    kwargs.setdefault("dest", dest_of(flag))
    group.add_argument(*names, **kwargs)


# ------------------------------------------------------------------ ignored / refused Megatron flags

@dataclass(frozen=True)
class ForeignFlag:
    """A Megatron flag mmrun does not implement: ignored (warning) or refused (usage error)."""

    flag: str
    takes: int | str
    action: str  # "ignored" | "refused"
    reason: str
    hint: str | None
    model_structure: bool = False  # ignored, not refused, where the model comes from a file (ModelSource)


@dataclass(frozen=True)
class ModelSource:
    """An entry whose model is described by a file, not by the network-size flags (MindSpeed-MM's
    pretrain_vlm.py: `--mm-model model.json`). As in MindSpeed-MM, the file wins: `sizes` (dest -> value,
    read from the file) replace the launch script's network-size flags, and the model-structure flags of
    megatron_flags.yaml are ignored with a warning instead of refused. `data_flag` names the option
    that gives the data (so --data-path is not required)."""

    flag: str  # e.g. "--mm-model"
    sizes: Mapping[str, Any]
    data_flag: str | None = None
    data_parallel_only: bool = True  # no tensor/pipeline split of the model on this framework: data parallelism only
    # Inputs whose shapes change from batch to batch (images of any size) would rebuild a compiled
    # MindSpore graph for every new shape: such a model's step runs in PyNative unless this is True.
    ms_jit: bool = False
    # Feature-table features (catalogue names) the entry implements itself, such as "lora": the table's trainer
    # layer speaks for mmrun's GPT, so its verdict on these is left to the entry (the stack layer still applies).
    features: tuple[str, ...] = ()
    # The data-parallel engine shards the optimizer on this framework (MindSpore: backend/mindspore/parallel/zero.py), so
    # --use-distributed-optimizer stays on rather than being ignored (DATA_PARALLEL_ONLY_OFF).
    shards_optimizer: bool = False


# Flags a data-parallel-only model (ModelSource) turns off, and why that changes no number of the run.
DATA_PARALLEL_ONLY_OFF = {
    "use_mcore_models": ("--use-mcore-models", "the model file gives the model; it trains on mmrun's data-parallel "
                         "engine (the same network on PyTorch and MindSpore)"),
    "use_distributed_optimizer": ("--use-distributed-optimizer", "each data-parallel rank keeps the whole optimizer "
                                  "state (the same updates, more memory per rank)"),
}

# The same flags under --use-torch-fsdp2 (torch's FSDP2 engine trains the model data-parallel too).
FSDP2_OFF_REASON = {
    "use_distributed_optimizer": "--use-torch-fsdp2 already shards the parameters, gradients and optimizer state "
                                 "over the ranks (the FSDP2 file's sharding_size)",
    "use_mcore_models": "the model file gives the model; --use-torch-fsdp2 shards that model as it is",
}


@functools.lru_cache(maxsize=1)
def foreign_flags() -> tuple[ForeignFlag, ...]:
    """megatron_flags.yaml, flattened and checked."""
    raw = check_keys(str(FLAGS_TABLE), load_yaml(FLAGS_TABLE), required=("ignored", "refused"))
    found: list[ForeignFlag] = []
    for action in ("ignored", "refused"):
        for i, group in enumerate(raw[action]):
            check_keys(f"{FLAGS_TABLE}: {action}[{i}]", group, required=("flags", "reason"),
                       optional=("hint", "model_structure"))
            for flag, takes in group["flags"].items():
                if takes not in (0, 1, "+"):
                    raise ValueError(f"{FLAGS_TABLE}: {flag} takes must be 0, 1 or '+'. Received: {takes!r}")
                found.append(ForeignFlag(flag, takes, action, group["reason"], group.get("hint"),
                                         bool(group.get("model_structure", False))))
    return tuple(found)


def _add_by_takes(group, flag: str, takes: int | str, default: Any, help_text: str) -> None:
    if takes == 0:
        _add(group, flag, action="store_true", default=default, help=help_text)
    elif takes == "+":
        _add(group, flag, nargs="+", default=default, help=help_text)
    else:
        value_type = int if isinstance(default, int) and not isinstance(default, bool) else None
        _add(group, flag, type=value_type, default=default, help=help_text, metavar="VALUE")


def _framework_arg(value: str) -> str:
    try:
        return framework_name(value)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# Sentinel default of ignored/refused flags, so that "given on the command line" is unambiguous.
_NOT_GIVEN = None


# --------------------------------------------------------------------------------------- the parser

def build_parser(extra_args_provider: Callable[[argparse.ArgumentParser], argparse.ArgumentParser] | None = None,
                 prog: str = PROG) -> argparse.ArgumentParser:
    """The training parser: Megatron's groups and defaults; feature and foreign flags from the tables."""
    p = _Parser(prog=prog, allow_abbrev=False, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                usage="%(prog)s [Megatron-LM training arguments, listed below by group]",
                description="Megatron-style GPT pretraining on PyTorch or MindSpore (Megatron-LM's arguments).")
    declared: set[str] = set()

    def add(group, flag, *aliases, **kw):
        declared.add(flag)
        _add(group, flag, *aliases, **kw)

    g = p.add_argument_group("network size")
    add(g, "--num-layers", type=int, default=None, help="transformer layers")
    add(g, "--hidden-size", type=int, default=None, help="transformer hidden size")
    add(g, "--ffn-hidden-size", type=int, default=None, help="MLP hidden size (default 4 x --hidden-size)")
    add(g, "--num-attention-heads", type=int, default=None, help="attention heads")
    add(g, "--max-position-embeddings", type=int, default=None,
        help="position embedding rows (default --seq-length)")
    add(g, "--position-embedding-type", choices=list(POSITION_EMBEDDINGS), default="learned_absolute",
        help="position embeddings (mmrun's GPT: learned_absolute; the others come from a model file)")
    add(g, "--make-vocab-size-divisible-by", type=int, default=128,
        help="pad the vocabulary to a multiple of this (default 128)")
    add(g, "--normalization", choices=list(NORMALIZATIONS), default="LayerNorm",
        help="normalization layer (mmrun's GPT: LayerNorm; RMSNorm comes from a model file)")
    add(g, "--norm-epsilon", "--layernorm-epsilon", type=float, default=1e-5, help="LayerNorm epsilon (1e-5)")
    add(g, "--untie-embeddings-and-output-weights", action="store_true",
        help="a separate output layer instead of the word embeddings")

    g = p.add_argument_group("regularization")
    add(g, "--attention-dropout", type=float, default=0.1, help="attention-probability dropout (0.1)")
    add(g, "--hidden-dropout", type=float, default=0.1, help="hidden-state dropout (0.1)")
    add(g, "--weight-decay", type=float, default=0.01, help="AdamW decoupled weight decay (0.01)")
    add(g, "--clip-grad", type=float, default=1.0, help="clip the global gradient L2 norm to this (0: off)")
    add(g, "--adam-beta1", type=float, default=0.9, help="AdamW beta1 (0.9)")
    add(g, "--adam-beta2", type=float, default=0.999, help="AdamW beta2 (0.999)")
    add(g, "--adam-eps", type=float, default=1e-8, help="AdamW epsilon (1e-8)")

    g = p.add_argument_group("training")
    add(g, "--micro-batch-size", type=int, default=None, help="samples per forward/backward on one rank")
    add(g, "--global-batch-size", type=int, default=None,
        help="samples per optimizer step over all ranks (= micro batch x data-parallel size x accumulation)")
    add(g, "--train-iters", type=int, default=None, help="optimizer steps to train for")
    add(g, "--exit-interval", type=int, default=None,
        help="save (with --save) and exit when the iteration is a multiple of this")
    add(g, "--exit-duration-in-mins", type=float, default=None, help="save (with --save) and exit after this long")
    add(g, "--optimizer", choices=["adam"], default="adam", help="optimizer (adam = AdamW, as in Megatron)")
    add(g, "--dataloader-type", choices=["single"], default="single",
        help="Megatron's sequential sampler over the shuffled sample order")
    add(g, "--transformer-impl", choices=["local", "transformer_engine"], default="local",
        help="layer implementation (mmrun's portable layers: local)")

    g = p.add_argument_group("initialization")
    add(g, "--seed", type=int, default=1234, help="random seed for weights and data order (1234)")
    add(g, "--init-method-std", type=float, default=0.02, help="std of the normal weight init (0.02)")

    g = p.add_argument_group("learning rate")
    add(g, "--lr", type=float, default=None, help="peak learning rate")
    add(g, "--lr-decay-style", choices=LR_DECAY_STYLES, default="linear", help="decay after warmup (linear)")
    add(g, "--lr-decay-iters", type=int, default=None, help="iterations to decay over (default --train-iters)")
    add(g, "--lr-warmup-fraction", type=float, default=None, help="warmup as a fraction of --lr-decay-iters")
    add(g, "--lr-warmup-iters", type=int, default=0, help="warmup iterations (0)")
    add(g, "--lr-warmup-init", type=float, default=0.0, help="learning rate at the start of warmup (0)")
    add(g, "--min-lr", type=float, default=0.0, help="learning rate floor after decay (0)")
    add(g, "--override-opt-param-scheduler", "--override-opt_param-scheduler", action="store_true",
        help="on --load, take the schedule from these arguments, not the checkpoint")
    add(g, "--use-checkpoint-opt-param-scheduler", "--use-checkpoint-opt_param-scheduler", action="store_true",
        help="on --load, take the schedule from the checkpoint (the default when neither is given)")

    g = p.add_argument_group("checkpointing")
    add(g, "--save", default=None, help="directory to save checkpoints in")
    add(g, "--save-interval", type=int, default=None, help="iterations between checkpoints")
    add(g, "--no-save-optim", action="store_true", help="leave the optimizer state out of checkpoints")
    add(g, "--no-save-rng", action="store_true", help="leave the RNG state out of checkpoints")
    add(g, "--load", default=None, help="directory to resume from (its latest_checkpointed_iteration.txt)")
    add(g, "--no-load-optim", action="store_true", help="do not load the optimizer state")
    add(g, "--no-load-rng", action="store_true", help="do not load the RNG state")
    add(g, "--finetune", action="store_true",
        help="load weights only and start at iteration 0 (no optimizer, RNG or schedule state)")
    add(g, "--ckpt-step", type=int, default=None, help="load this iteration instead of the latest")
    add(g, "--exit-on-missing-checkpoint", action="store_true",
        help="with --load: stop (exit 2) when there is no checkpoint instead of starting fresh")
    add(g, "--ckpt-format", choices=CKPT_FORMATS, default="safetensors",
        help="checkpoint format (mmrun writes safetensors + JSON; others fall back to it with a notice)")

    g = p.add_argument_group("mixed precision")
    add(g, "--fp16", action="store_true", help="fp16 training")
    add(g, "--bf16", action="store_true", help="bf16 training")
    add(g, "--loss-scale", type=float, default=None, help="static loss scale (default: dynamic for --fp16)")
    add(g, "--initial-loss-scale", type=float, default=2.0**32, help="first dynamic loss scale (2^32)")
    add(g, "--min-loss-scale", type=float, default=1.0, help="smallest dynamic loss scale (1)")
    add(g, "--loss-scale-window", type=int, default=1000, help="steps without overflow before the scale grows")
    add(g, "--hysteresis", type=int, default=2, help="overflows tolerated before the scale shrinks")

    g = p.add_argument_group("distributed")
    add(g, "--distributed-backend", default=None,
        help="nccl|gloo|hccl|mccl; replaced by the one that works on this device, with a notice")
    add(g, "--distributed-timeout-minutes", type=int, default=10,
        help="how long a collective waits for a missing rank before it fails (PyTorch: the process group's "
             "timeout; MindSpore: msrun's --cluster_time_out, set by mmrun's launcher); default 10")
    add(g, "--tensor-model-parallel-size", type=int, default=1,
        help="split each layer over this many ranks (PyTorch: megatron-core; docs/parallelism.md)")
    add(g, "--pipeline-model-parallel-size", type=int, default=1,
        help="split the layers into this many pipeline stages (PyTorch: megatron-core)")
    add(g, "--virtual-pipeline-model-parallel-size", type=int, default=None,
        help="virtual stages per pipeline rank: the interleaved 1F1B schedule")
    add(g, "--num-layers-per-virtual-pipeline-stage", type=int, default=None,
        help="layers per virtual stage (the other way to ask for virtual stages)")
    add(g, "--context-parallel-size", type=int, default=1,
        help="split each sequence over this many ranks (PyTorch: megatron-core)")
    add(g, "--sequence-parallel", action="store_true",
        help="split LayerNorm and dropout activations over the tensor-parallel ranks")
    add(g, "--use-distributed-optimizer", action="store_true",
        help="shard AdamW state and fp32 gradients over the data-parallel ranks (PyTorch: megatron-core)")
    add(g, "--use-mcore-models", action="store_true",
        help="train megatron-core's GPTModel (PyTorch; the same network and initial weights as mmrun's GPT)")

    g = p.add_argument_group("validation")
    add(g, "--eval-iters", type=int, default=100, help="validation iterations per evaluation (100)")
    add(g, "--eval-interval", type=int, default=1000, help="iterations between evaluations (1000)")

    g = p.add_argument_group("data and dataloader")
    add(g, "--data-path", nargs="*", default=None, help="<prefix> of <prefix>.bin/.idx (one prefix)")
    add(g, "--split", default=None, help=f"train,valid,test weights (default {DEFAULT_SPLIT!r})")
    add(g, "--mock-data", action="store_true", help="synthetic tokens instead of --data-path")
    add(g, "--seq-length", type=int, default=None, help="tokens per sample")
    add(g, "--tokenizer-type", choices=list(TOKENIZER_BUILDERS), default=None,
        help="default GPT2BPETokenizer with --vocab-file, NullTokenizer with --mock-data")
    add(g, "--vocab-file", default=None, help="GPT-2 vocab.json")
    add(g, "--merge-file", default=None, help="GPT-2 merges.txt")
    add(g, "--vocab-size", type=int, default=None,
        help=f"NullTokenizer vocabulary size (with --mock-data: {MOCK_VOCAB_SIZE})")
    add(g, "--tokenizer-model", default=None, help="HuggingFaceTokenizer: a local tokenizer.json or directory")
    add(g, "--num-workers", type=int, default=0,
        help="processes that decode samples ahead of training (0: in the training process); used by datasets "
             "worth it (images: models/pretrain_vlm.py); Megatron's token datasets read in place")
    add(g, "--eod-mask-loss", action="store_true", help="no loss on predictions made from end-of-document")
    add(g, "--reset-position-ids", action="store_true", help="restart position ids after end-of-document")

    g = p.add_argument_group("logging")
    add(g, "--log-interval", type=int, default=100, help="iterations between log lines (100)")

    g = p.add_argument_group("mmrun")
    add(g, "--ai-framework", type=_framework_arg, metavar="{" + ",".join(FRAMEWORKS) + "}", default=None,
        help="pytorch or mindspore (the mmrun launcher appends it; default $MMRUN_AI_FRAMEWORK, else pytorch)")
    add_gate_arguments(g)
    declared.add("--on-unsupported")
    add(g, "--metrics-file", default=None,
        help="also write every iteration's metrics at full precision as JSON lines (rank 0)")
    add(g, "--dropout-impl", choices=DROPOUT_IMPLS, default="auto",
        help="dropout masks: hash = the same masks on PyTorch and MindSpore (attention dropout then runs the "
             "explicit attention), native = the framework's own dropout and fused attention, auto = hash on "
             "CPU, native on GPU/NPU (docs/training.md)")
    add(g, "--no-ms-jit", action="store_true",
        help="MindSpore: run the train step in PyNative instead of compiling it with mindspore.jit (the default)")
    add(g, "--ms-compile-cache", default=None, metavar="DIR",
        help="MindSpore: keep the compiled train step's graphs under DIR, one folder per job (a digest of its "
             "arguments, files, code and batch shapes), so a rerun of the same job loads them instead of "
             "compiling (seconds instead of a minute on CPU; docs/multimodal.md)")

    from mmrun.precision.arguments import add_arguments as add_precision_arguments
    from mmrun.precision.arguments import add_monitoring_arguments

    add_precision_arguments(p.add_argument_group("precision and performance (docs/precision-and-performance.md)"), add)
    add_monitoring_arguments(p.add_argument_group("monitoring, profiling, determinism (docs/precision-and-performance.md)"), add)
    _add_feature_flags(p.add_argument_group("features judged by the feature gate (docs/features.md)"), declared)
    _add_foreign_flags(p.add_argument_group("Megatron flags mmrun ignores or refuses (docs/training.md)"), declared)
    if extra_args_provider is not None:
        p = extra_args_provider(p) or p
    return p


def _add_feature_flags(group, declared: set[str]) -> None:
    """Every trigger and companion flag of the feature table this parser does not declare itself,
    so that the gate (not argparse) answers `--tensor-model-parallel-size 2` or `--use-flash-attn`."""
    table = load_table()
    for entry in table.entries:
        for trig in entry.triggers:
            if trig.flag not in declared:
                declared.add(trig.flag)
                _add_by_takes(group, trig.flag, trig.takes, trig.off, entry.title)
    for flag, owners in table.companion_flags().items():
        if flag not in declared:
            declared.add(flag)
            _add_by_takes(group, flag, owners[0][1].takes, False if owners[0][1].takes == 0 else None,
                          f"configures {owners[0][0].title}")


def _add_foreign_flags(group, declared: set[str]) -> None:
    for f in foreign_flags():
        if f.flag in declared:
            raise ValueError(f"{FLAGS_TABLE}: {f.flag} is also implemented or in the feature table; list it once")
        declared.add(f.flag)
        _add_by_takes(group, f.flag, f.takes, _NOT_GIVEN, f"{f.action} by mmrun: {f.reason}")


# ------------------------------------------------------------------------------------------ parsing

def _drop_stray_backslashes(argv: Sequence[str]) -> list[str]:
    """A lone `\\` token comes from a script line ending in `\\ ` (backslash, space) inside a quoted
    GPT_ARGS string: bash keeps the backslash as an argument. The seed scripts have one after
    `--hidden-size 1024`; Megatron would refuse it, mmrun drops it with a warning."""
    kept = [a for a in argv if a != "\\"]
    if len(kept) != len(argv):
        _warn(f"dropped {len(argv) - len(kept)} lone '\\' argument(s): a line of the launch script ends in "
              "'\\ ' (backslash then space), which bash passes on as an argument; remove the space")
    return kept


def _warn(message: str) -> None:
    if rank_env.read_rank_info().rank == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _known_flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})


def _unknown_error(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> ArgumentsError:
    first = next((u for u in unknown if u.startswith("-")), unknown[0])
    name = first.split("=", 1)[0]
    close = difflib.get_close_matches(name, _known_flags(parser), n=1, cutoff=0.75)
    hint = (f"did you mean {close[0]}?" if close
            else "remove it, or see --help and docs/training.md for the flags mmrun knows")
    return ArgumentsError(f"unrecognized argument {first!r} "
                          f"(received: {' '.join(unknown)}); {hint}")


def parse_args(argv: Sequence[str] | None = None, *, args_defaults: Mapping[str, Any] | None = None,
               extra_args_provider: Callable | None = None, world_size: int | None = None,
               prog: str = PROG, model_source: ModelSource | None = None) -> argparse.Namespace:
    """Parse and validate Megatron-style training arguments (sys.argv[1:] by default).

    `args_defaults` fills arguments left at None (Megatron's mechanism: an entry script supplies
    defaults such as a tokenizer or model size). `world_size` defaults to the launcher's
    (WORLD_SIZE / RANK_SIZE, 1 without a launcher). `model_source`: the entry's model comes from a file
    (see ModelSource). Raises ArgumentsError on any usage error.
    """
    parser = build_parser(extra_args_provider, prog=prog)
    tokens = _drop_stray_backslashes(list(sys.argv[1:] if argv is None else argv))
    args, unknown = parser.parse_known_args(tokens)
    if unknown:
        raise _unknown_error(parser, unknown)
    for key, value in (args_defaults or {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    _check_foreign(args, model_source)
    if model_source is None:
        _check_gpt_structure(args)
    else:
        _apply_model_source(args, parser, model_source)
    info = rank_env.read_rank_info()
    return validate_args(args, info.world_size if world_size is None else world_size, rank=info.rank,
                         data_flag=None if model_source is None else model_source.data_flag)


def _given_foreign(args: argparse.Namespace) -> list[ForeignFlag]:
    given = []
    for f in foreign_flags():
        value = getattr(args, dest_of(f.flag))
        if value is not _NOT_GIVEN and value is not False:
            given.append(f)
    return given


def _check_foreign(args: argparse.Namespace, model_source: ModelSource | None = None) -> None:
    given = _given_foreign(args)
    if model_source is not None:
        reason = (f"the model's structure comes from {model_source.flag} (MindSpeed-MM's rule: the model file wins "
                  "over the launch script's model flags)")
        given = [ForeignFlag(f.flag, f.takes, "ignored", reason, None) if f.model_structure else f for f in given]
    refused = [f for f in given if f.action == "refused"]
    if refused:
        f = refused[0]
        others = f" (also refused: {', '.join(r.flag for r in refused[1:])})" if len(refused) > 1 else ""
        raise ArgumentsError(f"{f.flag} is not supported by mmrun: {f.reason}. Hint: {f.hint}.{others}")
    by_reason: dict[str, list[str]] = {}
    for f in given:
        by_reason.setdefault(f.reason, []).append(f.flag)
    for reason, flags in by_reason.items():
        _warn(f"ignoring {', '.join(flags)}: {reason}")


def _check_gpt_structure(args: argparse.Namespace) -> None:
    """mmrun's GPT builds only the first choice of --normalization and --position-embedding-type."""
    for flag, value, built in (("--normalization", args.normalization, NORMALIZATIONS[0]),
                               ("--position-embedding-type", args.position_embedding_type, POSITION_EMBEDDINGS[0])):
        if value != built:
            raise ArgumentsError(f"{flag} {value} is not supported by mmrun's GPT, which uses {built}. Hint: drop "
                                 f"the flag; models with other blocks need their own model_provider "
                                 "(models/pretrain_vlm.py builds Qwen2-VL from --mm-model)")


def _apply_model_source(args: argparse.Namespace, parser: argparse.ArgumentParser, source: ModelSource) -> None:
    """The model file's sizes replace the network-size flags; flags given with other values are named once."""
    args.model_source = source.flag
    args.entry_features = tuple(source.features)
    overridden = []
    for dest, value in source.sizes.items():
        given = getattr(args, dest, None)
        if given is not None and given != parser.get_default(dest) and given != value:
            overridden.append(f"--{dest.replace('_', '-')} {given}")
        setattr(args, dest, value)
    if overridden:
        _warn(f"ignoring {', '.join(overridden)}: the model's structure comes from {source.flag} "
              "(MindSpeed-MM's rule: the model file wins over the launch script's model flags)")
    if not source.ms_jit:
        if getattr(args, "ms_jit", False):
            raise ArgumentsError(f"--ms-jit cannot compile this entry's model (its input shapes change from batch "
                                 f"to batch, so a compiled graph would be rebuilt for each). Received: --ms-jit; "
                                 "drop it (the step runs in PyNative)")
        args.no_ms_jit = True
    fsdp2 = bool(getattr(args, "use_torch_fsdp2", False))
    if not source.data_parallel_only and not fsdp2:
        return  # the megatron-core engine builds this model split (FSDP2 shards it data-parallel instead)
    split = [f"--{dest.replace('_', '-')} {getattr(args, dest)}" for dest in
             ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
             if (getattr(args, dest) or 1) > 1]
    if split:
        raise ArgumentsError(f"this entry's model trains with data parallelism only (tensor, pipeline and context "
                             f"splits of it are not built yet). Received: {', '.join(split)}; set them to 1 and "
                             "use the processes for data parallelism" + (" (FSDP2 shards the model over them)"
                                                                          if fsdp2 else ""))
    for dest, (flag, reason) in DATA_PARALLEL_ONLY_OFF.items():
        if dest == "use_distributed_optimizer" and source.shards_optimizer and not fsdp2:
            continue
        if getattr(args, dest, False):
            setattr(args, dest, False)
            # FSDP2 is a data-parallel engine of its own: it shards what the distributed optimizer would.
            _warn(f"ignoring {flag}: {FSDP2_OFF_REASON.get(dest, reason) if fsdp2 else reason}")


def _require(args: argparse.Namespace, names: Iterable[str]) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is None]
    if missing:
        raise ArgumentsError(f"the following arguments are required: {', '.join(missing)} "
                             "(see --help; models/pretrain_gpt.py supplies CPU-sized defaults for the model)")


def _positive(args: argparse.Namespace, names: Iterable[str], allow_zero: bool = False) -> None:
    for n in names:
        value = getattr(args, n)
        if value is not None and (value < 0 or (value == 0 and not allow_zero)):
            floor = "0 or more" if allow_zero else "positive"
            raise ArgumentsError(f"--{n.replace('_', '-')} must be {floor}. Received: {value}")


def validate_args(args: argparse.Namespace, world_size: int = 1, rank: int = 0,
                  data_flag: str | None = None) -> argparse.Namespace:
    """Megatron's validate_args for what mmrun implements: fill derived values, refuse contradictions."""
    _require(args, ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                    "train_iters", "lr"))
    _positive(args, ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                     "global_batch_size", "train_iters", "log_interval", "eval_interval", "save_interval",
                     "exit_interval", "ffn_hidden_size", "make_vocab_size_divisible_by", "distributed_timeout_minutes"))
    _positive(args, ("eval_iters", "num_workers", "lr", "min_lr", "weight_decay", "clip_grad", "lr_warmup_iters",
                     "hidden_dropout", "attention_dropout"), allow_zero=True)
    if args.fp16 and args.bf16:
        raise ArgumentsError("--fp16 and --bf16 cannot both be given. Received: both; keep one")
    if getattr(args, "ms_jit", False) and args.no_ms_jit:
        raise ArgumentsError("--ms-jit and --no-ms-jit cannot both be given. Received: both; keep one "
                             "(MindSpore compiles the step by default)")
    if args.hidden_size % args.num_attention_heads:
        raise ArgumentsError(f"--hidden-size must be divisible by --num-attention-heads. Received: "
                             f"{args.hidden_size} and {args.num_attention_heads}")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size  # Megatron's default
    if args.seq_length > args.max_position_embeddings:
        raise ArgumentsError(f"--seq-length must not exceed --max-position-embeddings. Received: "
                             f"{args.seq_length} > {args.max_position_embeddings}; raise --max-position-embeddings")
    for name in ("hidden_dropout", "attention_dropout"):
        if getattr(args, name) >= 1.0:
            raise ArgumentsError(f"--{name.replace('_', '-')} must be below 1. Received: {getattr(args, name)}")

    # Batch sizes: global = micro x data-parallel size x accumulation steps (Megatron's rule).
    if world_size < 1:
        raise ArgumentsError(f"the world size must be at least 1. Received: {world_size}")
    args.world_size = world_size
    args.rank = rank
    _validate_parallel_sizes(args, world_size)
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    if args.global_batch_size % per_step:
        lower = max(per_step, args.global_batch_size // per_step * per_step)
        raise ArgumentsError(
            f"--global-batch-size must be a multiple of --micro-batch-size x data-parallel size "
            f"({args.micro_batch_size} x {args.data_parallel_size} = {per_step}). Received: "
            f"--global-batch-size {args.global_batch_size}; use {lower} or {lower + per_step}")
    args.num_micro_batches = args.global_batch_size // per_step
    vpp = args.virtual_pipeline_model_parallel_size or 1
    if vpp > 1 and args.num_micro_batches % args.pipeline_model_parallel_size:
        raise ArgumentsError(
            f"the interleaved pipeline schedule needs a multiple of --pipeline-model-parallel-size "
            f"({args.pipeline_model_parallel_size}) micro-batches per step. Received: {args.num_micro_batches} "
            f"(--global-batch-size {args.global_batch_size} / (--micro-batch-size {args.micro_batch_size} x "
            f"data-parallel size {args.data_parallel_size})); raise --global-batch-size")

    # Learning-rate schedule (Megatron's rules for the iteration-based schedule).
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    if args.lr_warmup_fraction is not None:
        if args.lr_warmup_iters:
            raise ArgumentsError("--lr-warmup-fraction and --lr-warmup-iters cannot both be given. Received: "
                                 f"{args.lr_warmup_fraction} and {args.lr_warmup_iters}; keep one")
        if not 0.0 <= args.lr_warmup_fraction <= 1.0:
            raise ArgumentsError(f"--lr-warmup-fraction must be between 0 and 1. Received: {args.lr_warmup_fraction}")
    if args.min_lr > args.lr:
        raise ArgumentsError(f"--min-lr must not exceed --lr. Received: --min-lr {args.min_lr} > --lr {args.lr}")
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise ArgumentsError("--override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler cannot "
                             "both be given. Received: both; keep one")

    # Data and tokenizer.
    if args.split is None:
        args.split = DEFAULT_SPLIT
    if data_flag is not None and not getattr(args, data_flag[2:].replace("-", "_"), None):
        raise ArgumentsError(f"{data_flag} is required by this entry. Received: none; pass the data.json that "
                             "describes the dataset (docs/multimodal.md)")
    if data_flag is not None:
        if args.tokenizer_type is None:
            args.tokenizer_type = "NullTokenizer"  # the tokenizer comes with the data file; as MindSpeed-MM's scripts
    elif not args.mock_data and not args.data_path and not getattr(args, "mm_data", None):  # --mm-data: data.json
        raise ArgumentsError("--data-path is required unless --mock-data is given. Received: neither; "
                             "preprocess a corpus with `mmrun preprocess-data` or pass --mock-data")
    if args.tokenizer_type is None:
        if args.vocab_file:
            args.tokenizer_type = "GPT2BPETokenizer"
        elif args.mock_data:
            args.tokenizer_type = "NullTokenizer"
        else:
            raise ArgumentsError("--tokenizer-type is required with --data-path when no --vocab-file is given. "
                                 "Received: neither; for example --tokenizer-type GPT2BPETokenizer --vocab-file "
                                 "gpt2-vocab.json --merge-file gpt2-merges.txt")
    if args.tokenizer_type == "NullTokenizer" and args.vocab_size is None and args.mock_data:
        args.vocab_size = MOCK_VOCAB_SIZE

    if args.finetune and not args.load:
        raise ArgumentsError("--finetune needs --load. Received: --finetune without --load")
    if args.exit_on_missing_checkpoint and not args.load:
        raise ArgumentsError("--exit-on-missing-checkpoint needs --load. Received: no --load")
    return args


def _validate_parallel_sizes(args: argparse.Namespace, world_size: int) -> None:
    """Megatron's rules for tensor, pipeline (virtual), context and data parallel sizes; fills
    args.data_parallel_size and args.virtual_pipeline_model_parallel_size."""
    _positive(args, ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage"))
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ArgumentsError(
            f"the world size ({world_size}) must be a multiple of --tensor-model-parallel-size x "
            f"--pipeline-model-parallel-size x --context-parallel-size ({tp} x {pp} x {cp} = {model_parallel}). "
            f"Received: {world_size} processes; start {model_parallel} x N processes or change the sizes")
    args.data_parallel_size = world_size // model_parallel
    if args.num_layers % pp:
        raise ArgumentsError(f"--num-layers ({args.num_layers}) must be divisible by --pipeline-model-parallel-size "
                             f"({pp}) (megatron-core splits layers evenly over the stages)")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if args.virtual_pipeline_model_parallel_size is not None:
            raise ArgumentsError("--num-layers-per-virtual-pipeline-stage and --virtual-pipeline-model-parallel-size "
                                 "cannot both be given. Received: both; keep one")
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ArgumentsError(
                f"the {per_stage} layers of each pipeline stage cannot be split into virtual stages of "
                f"{args.num_layers_per_virtual_pipeline_stage}. Received: --num-layers-per-virtual-pipeline-stage "
                f"{args.num_layers_per_virtual_pipeline_stage}; pick a divisor of {per_stage}")
        args.virtual_pipeline_model_parallel_size = per_stage // args.num_layers_per_virtual_pipeline_stage
    vpp = args.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1:
        if pp == 1:
            raise ArgumentsError(f"virtual pipeline stages need --pipeline-model-parallel-size above 1. Received: "
                                 f"--pipeline-model-parallel-size 1 with {vpp} virtual stages")
        if args.num_layers % (pp * vpp):
            raise ArgumentsError(f"--num-layers ({args.num_layers}) must be divisible by pipeline stages x virtual "
                                 f"stages ({pp} x {vpp})")
    elif vpp == 1:
        args.virtual_pipeline_model_parallel_size = None  # Megatron: one virtual stage is no interleaving
    for name, value in (("--num-attention-heads", args.num_attention_heads),
                        ("--ffn-hidden-size", args.ffn_hidden_size)):
        if value % tp:
            raise ArgumentsError(f"{name} ({value}) must be divisible by --tensor-model-parallel-size ({tp})")
    if args.sequence_parallel and tp == 1:
        args.sequence_parallel = False  # Megatron's validate_args: nothing to split over one tensor-parallel rank
        _warn("--sequence-parallel is off: it splits activations over tensor-parallel ranks, and "
              "--tensor-model-parallel-size is 1 (Megatron does the same)")
    if cp > 1 and args.seq_length % (2 * cp):
        raise ArgumentsError(f"--seq-length ({args.seq_length}) must be a multiple of 2 x --context-parallel-size "
                             f"({2 * cp}): context parallelism cuts each sequence into 2 x cp chunks")
    if args.sequence_parallel and (args.seq_length // cp) % tp:
        raise ArgumentsError(f"with --sequence-parallel, --seq-length / --context-parallel-size "
                             f"({args.seq_length // cp}) must be divisible by --tensor-model-parallel-size ({tp})")


def ignored_and_refused_markdown() -> str:
    """The docs table of megatron_flags.yaml, one row per group (docs/training.md embeds it)."""
    rows = ["| flags | mmrun | why | instead |", "|---|---|---|---|"]
    groups: dict[tuple[str, str, str | None], list[str]] = {}
    for f in foreign_flags():
        groups.setdefault((f.action, f.reason, f.hint), []).append(f"`{f.flag}`")
    for (action, reason, hint), flags in groups.items():
        rows.append(f"| {' '.join(flags)} | {action} | {reason} | {hint or 'nothing: drop them when convenient'} |")
    return "\n".join(rows)
