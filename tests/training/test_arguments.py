"""Megatron's training arguments: the seed scripts' GPT_ARGS/DATA_ARGS/OUTPUT_ARGS, spellings, usage errors.

No framework is imported: parsing and validation are pure Python.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from mmrun.training.arguments import (ArgumentsError, build_parser, foreign_flags, ignored_and_refused_markdown,
                                      parse_args)

# The seed's pretrain_single.sh blocks as written (including the `\ ` after --hidden-size, which bash
# turns into a lone backslash argument), with sizes shrunk for a CPU.
SEED_SCRIPT = r'''
DATA_PATH=./gpt_pretrain_data/alpaca_text_document
VOCAB_FILE=./gpt-tokenizer/gpt2-vocab.json
MERGE_FILE=./gpt-tokenizer/gpt2-merges.txt
CHECKPOINT_PATH=./ckpt
GPT_ARGS="
    --num-layers 2 \
    --hidden-size 64 \ 
    --num-attention-heads 4 \
    --seq-length 32 \
    --max-position-embeddings 32 \
    --micro-batch-size 4 \
    --global-batch-size 16 \
    --lr 0.00015 \
    --train-iters 20 \
    --lr-decay-iters 320000 \
    --lr-decay-style cosine \
    --min-lr 1.0e-5 \
    --weight-decay 1e-2 \
    --lr-warmup-fraction .01 \
    --clip-grad 1.0 \
    --fp16 \
    --transformer-impl local \
"
DATA_ARGS="
    --data-path $DATA_PATH \
    --vocab-file $VOCAB_FILE \
    --merge-file $MERGE_FILE \
    --split 949,50,1 \
"
OUTPUT_ARGS="
    --log-interval 100 \
    --save-interval 100 \
    --eval-interval 1000 \
    --eval-iters 10 \
"
printf '%s\n' $GPT_ARGS $DATA_ARGS $OUTPUT_ARGS --distributed-backend nccl --save $CHECKPOINT_PATH --ckpt-format torch
'''

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "4", "--train-iters", "20", "--lr", "1e-3", "--mock-data"]


def seed_tokens() -> list[str]:
    """The argument list bash builds from the seed script (word splitting, as torchrun receives it)."""
    out = subprocess.run(["bash", "-c", SEED_SCRIPT], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_seed_script_arguments_parse_with_megatron_meanings(capsys):
    tokens = seed_tokens()
    assert "\\" in tokens  # the seed's stray backslash really reaches the script
    args = parse_args(tokens, world_size=2)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (2, 64, 4)
    assert (args.seq_length, args.max_position_embeddings) == (32, 32)
    assert (args.micro_batch_size, args.global_batch_size, args.data_parallel_size) == (4, 16, 2)
    assert args.num_micro_batches == 2  # 16 = 4 x 2 ranks x 2 accumulation steps
    assert args.lr == 0.00015 and args.min_lr == 1e-5 and args.lr_decay_style == "cosine"
    assert args.lr_decay_iters == 320000 and args.lr_warmup_fraction == 0.01
    assert args.weight_decay == 0.01 and args.clip_grad == 1.0 and args.fp16 is True
    assert args.data_path == ["./gpt_pretrain_data/alpaca_text_document"] and args.split == "949,50,1"
    assert args.tokenizer_type == "GPT2BPETokenizer"  # implied by --vocab-file
    assert (args.log_interval, args.save_interval, args.eval_interval, args.eval_iters) == (100, 100, 1000, 10)
    assert args.save == "./ckpt" and args.ckpt_format == "torch" and args.distributed_backend == "nccl"
    # feature flags the seed does not use are present at their "off" values for the feature gate
    assert args.tensor_model_parallel_size == 1 and args.use_flash_attn is False
    assert "lone '\\'" in capsys.readouterr().err


def test_underscore_spellings_are_accepted_everywhere():
    dashed = parse_args(TINY + ["--global-batch-size", "8", "--lr-warmup-iters", "2"], world_size=1)
    underscored = parse_args(["--" + t[2:].replace("-", "_") if t.startswith("--") else t for t in TINY]
                             + ["--global_batch_size", "8", "--lr_warmup_iters", "2"], world_size=1)
    assert vars(dashed) == vars(underscored)
    # every multi-word option of the parser, feature and foreign flags included, has both spellings
    for action in build_parser()._actions:
        for name in action.option_strings:
            if name.startswith("--") and "-" in name[2:]:
                assert "--" + name[2:].replace("-", "_") in action.option_strings, name


def test_unknown_flag_is_a_one_line_error_with_a_suggestion():
    with pytest.raises(ArgumentsError) as err:
        parse_args(TINY + ["--hiden-size", "64"], world_size=1)
    message = str(err.value)
    assert "\n" not in message and "'--hiden-size'" in message and "did you mean --hidden-size?" in message
    assert err.value.exit_code == 2


@pytest.mark.parametrize("world, micro, global_batch, expected", [
    (2, 4, 12, "(4 x 2 = 8). Received: --global-batch-size 12; use 8 or 16"),
    (1, 3, 10, "(3 x 1 = 3). Received: --global-batch-size 10; use 9 or 12"),
])
def test_global_batch_must_be_micro_batch_times_data_parallel_times_accumulation(world, micro, global_batch,
                                                                                  expected):
    argv = TINY + ["--micro-batch-size", str(micro), "--global-batch-size", str(global_batch)]
    with pytest.raises(ArgumentsError, match=r"multiple of --micro-batch-size x data-parallel size") as err:
        parse_args(argv, world_size=world)
    assert expected in str(err.value)


def test_global_batch_defaults_to_micro_batch_times_data_parallel_size():
    args = parse_args(TINY, world_size=2)
    assert args.global_batch_size == 8 and args.num_micro_batches == 1


def test_ignored_megatron_flags_warn_once_per_reason(capsys):
    args = parse_args(TINY + ["--log-params-norm", "--logging-level", "20", "--no-bias-gelu-fusion",
                              "--data_cache_path", "cache"], world_size=1)
    err = capsys.readouterr().err
    assert "ignoring --log-params-norm, --logging-level: mmrun computes neither of these norms" in err
    assert "ignoring --no-bias-gelu-fusion: mmrun's GPT has none of these fused kernels" in err
    assert "ignoring --data-cache-path: mmrun rebuilds its sample indices in memory" in err
    assert args.logging_level == "20"  # still readable by a callback that wants it


def test_the_fsdp2_flags_warning_names_no_single_example_file(capsys):
    """--optimizer-selection and --init-model-with-meta-device come with every Qwen3-VL single-YAML job of
    MindSpeed-MM (8B, 30B, 32B, 235B): the warning names them all, not the 8B file for the 30B one (issue 37)."""
    parse_args(TINY + ["--optimizer-selection", "fused_torch_adamw", "--init-model-with-meta-device"], world_size=1)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "--init-model-with-meta-device" in line]
    assert "examples/qwen3vl/qwen3vl_*.yaml" in line and "8B" not in line


@pytest.mark.parametrize("flags, names", [
    (["--train-samples", "1000"], "--train-samples is not supported by mmrun: mmrun trains for a number of iterations"),
    (["--swiglu"], "--swiglu is not supported by mmrun: mmrun's GPT is GPT-2 style"),
    (["--rampup-batch-size", "4", "4", "100"], "--rampup-batch-size is not supported"),
])
def test_refused_megatron_flags_are_usage_errors_with_a_hint(flags, names):
    with pytest.raises(ArgumentsError) as err:
        parse_args(TINY + flags, world_size=1)
    assert names in str(err.value) and "Hint:" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("extra, fragment", [
    (["--fp16", "--bf16"], "--fp16 and --bf16 cannot both be given"),
    (["--hidden-size", "60", "--num-attention-heads", "8"], "--hidden-size must be divisible by --num-attention-heads"),
    (["--max-position-embeddings", "16"], "--seq-length must not exceed --max-position-embeddings"),
    (["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "3"], "cannot both be given"),
    (["--min-lr", "1"], "--min-lr must not exceed --lr"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be positive. Received: 0"),
    (["--finetune"], "--finetune needs --load"),
])
def test_contradictions_are_one_line_usage_errors(extra, fragment):
    with pytest.raises(ArgumentsError, match=fragment.replace("(", r"\(")):
        parse_args(TINY + extra, world_size=1)


def test_missing_model_sizes_are_named():
    with pytest.raises(ArgumentsError, match=r"required: --num-layers, --hidden-size, --num-attention-heads"):
        parse_args(["--mock-data", "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1",
                    "--lr", "1"], world_size=1)


def test_args_defaults_fill_only_what_is_missing():
    args = parse_args(["--mock-data", "--train-iters", "5", "--hidden-size", "32"], world_size=1,
                      args_defaults={"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                     "seq_length": 16, "micro_batch_size": 2, "lr": 1e-3})
    assert (args.num_layers, args.hidden_size, args.seq_length) == (2, 32, 16)
    assert args.tokenizer_type == "NullTokenizer" and args.vocab_size == 512  # --mock-data without vocab files


def test_data_is_required_without_mock_data():
    argv = [t for t in TINY if t != "--mock-data"]
    with pytest.raises(ArgumentsError, match="--data-path is required unless --mock-data"):
        parse_args(argv, world_size=1)


def test_every_foreign_flag_is_listed_once_and_in_the_docs_table():
    flags = [f.flag for f in foreign_flags()]
    assert len(flags) == len(set(flags))
    table = ignored_and_refused_markdown()
    assert all(f"`{flag}`" in table for flag in flags)


def test_help_shows_examples_and_exits_0():
    out = subprocess.run([sys.executable, "-c", "from mmrun.training.arguments import parse_args; "
                          "parse_args(['--help'])"], capture_output=True, text=True)
    assert out.returncode == 0 and "examples:" in out.stdout and "--global-batch-size" in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys; from mmrun.training.arguments import parse_args; "
                            "parse_args(['--mock-data', '--num-layers', '1', '--hidden-size', '8', "
                            "'--num-attention-heads', '2', '--seq-length', '8', '--micro-batch-size', '1', "
                            "'--train-iters', '1', '--lr', '1']); "
                            "print('torch' in sys.modules, 'mindspore' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False False"
