"""Realistic Megatron/MindSpeed launch scripts (tests/translate/corpus/) translate to msrun without false alarms.

The scripts are the user's own entries (pretrain_gpt.py, pretrain_vlm.py, posttrain_gpt.py, ...), so
only the framework stack judges their flags: TP/PP/CP/VPP/EP, flash attention, the fused kernels,
the distributed optimizer, recomputation and LoRA all run on MindSpeed's MindSpore backend and must
never be reported. Each script's header says what the stack really lacks:

    # corpus-reported: FLAG[, FLAG]   warned about by default, taken out (or replaced) by --on-unsupported remove
    # corpus-replaced: FLAG VALUE     what --on-unsupported remove writes in place of a reported choice
    # corpus-unknown: FLAG[, FLAG]    no public source covers it: listed in one note, never warned about
    # corpus-refused: FLAG[, FLAG]    the stack cannot run it at all: refused by default, with what to do instead
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from mmrun import features as ft
from mmrun.launchers.translate import Options, translate_script
from mmrun.launchers.translate.cli import main
from mmrun.launchers.translate.rewrite import TranslationRefused

CORPUS_DIR = Path(__file__).parent / "corpus"
CORPUS = sorted(CORPUS_DIR.glob("*.sh"))
# Features MindSpeed runs on the MindSpore backend (features/stack.yaml cites where): never a warning for a user's script.
NEVER_REPORTED = ("tensor-parallel", "pipeline-parallel", "virtual-pipeline", "context-parallel", "expert-parallel",
                  "mixture-of-experts", "sequence-parallel", "flash-attention", "fused-rmsnorm", "fused-swiglu",
                  "fused-rotary-pos-emb", "distributed-optimizer", "recompute", "lora", "overlap-grad-reduce",
                  "overlap-param-gather", "mcore-models", "bf16", "backend-nccl", "ckpt-format-torch",
                  "no-masked-softmax-fusion")
TABLES = ft.load_tables()
FEATURE_FLAGS = {t.flag for f in TABLES.features for t in f.triggers} | {c.flag for f in TABLES.features for c in f.companions}


def header(path: Path, key: str) -> list[str]:
    for line in path.read_text(encoding="utf-8").splitlines()[:6]:
        if line.startswith(f"# corpus-{key}: "):
            value = line.split(": ", 1)[1].strip()
            return [] if value == "none" else [v.strip() for v in value.split(",")]
    return []


def reported_flags(messages: list[str]) -> list[str]:
    """The flag each [stack] message is about: `[stack] --log-tps (tokens-per-second logging) is ...` -> `--log-tps`."""
    return [m.split("[stack] ", 1)[1].split(" (", 1)[0] for m in messages if "[stack] " in m]


def feature_flags(text: str) -> Counter:
    """The table's flags written in a script's commands (not its comments; launcher options are not among them)."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return Counter(flag for flag in re.findall(r"--[a-z][a-z0-9-]*", code) if flag in FEATURE_FLAGS)


def _refused(path: Path) -> bool:
    return bool(header(path, "refused"))


TRANSLATED = [p for p in CORPUS if not _refused(p)]
REFUSED = [p for p in CORPUS if _refused(p)]


def test_the_corpus_covers_the_scripts_the_brief_names():
    names = {p.stem for p in CORPUS}
    assert {"llm_pretrain_llama2_7b", "vlm_finetune_qwen25vl_72b", "lora_finetune_qwen3_8b", "yaml_config_launch",
            "moe_multinode_deepseek"} <= names
    text = "".join(p.read_text(encoding="utf-8") for p in CORPUS)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage", "--expert-model-parallel-size", "--use-distributed-optimizer",
                 "--recompute-granularity", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
                 "--lora-target-modules", "--nnodes $NNODES"):
        assert flag in text, flag


@pytest.mark.parametrize("path", TRANSLATED, ids=lambda p: p.stem)
def test_translates_without_false_alarms(path: Path, tx) -> None:
    source = path.read_bytes()
    result = translate_script(source, Options(), path.name)  # the defaults: --to mindspore, --device npu, error policy
    report = result.report
    assert report.launches == 1 and not report.refusals
    assert sorted(reported_flags([w.message for w in report.warnings])) == sorted(header(path, "reported"))
    assert all(w.message.startswith("[stack] ") for w in report.warnings), "a user's script is judged by the stack alone"
    unknown_notes = [n.message for n in report.notes if n.message.startswith("[stack] not checked")]
    expected_unknown = header(path, "unknown")
    assert len(unknown_notes) == (1 if expected_unknown else 0)
    if expected_unknown:
        assert unknown_notes[0].endswith(f": {', '.join(expected_unknown)} (see docs/features.md)")
    # nothing the MindSpore stack runs is mentioned anywhere in the report
    said = [w.message for w in report.warnings] + [n.message for n in report.notes] + [f.message for f in report.lint]
    for name in NEVER_REPORTED:
        for trig in TABLES.feature(name).triggers:
            assert not any(f"] {trig.flag} " in text for text in said), (name, said)
    assert not any(f.code == "MT003" for f in report.lint)  # MindSpeed's msrun scripts keep --distributed-backend nccl
    output = result.output
    assert b"msrun " in output and b"--ai-framework mindspore" in output
    assert tx.parses(output) and tx.bash_n(output).returncode == 0, tx.bash_n(output).stderr


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_remove_takes_out_exactly_the_reported_flags(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    result = translate_script(source.encode(), Options(on_unsupported="remove"), path.name)
    reported = header(path, "reported")
    changes = [c for c in result.report.changes if c.why.startswith("[stack] ")]
    assert sorted(reported_flags([c.why for c in changes])) == sorted(reported)
    assert not result.report.warnings
    expected = feature_flags(source)
    for change in changes:
        expected -= feature_flags(change.before)
        expected += feature_flags(change.after)
    assert feature_flags(result.output.decode()) == expected, "remove touched a flag it did not report"
    for replaced in header(path, "replaced"):
        assert replaced in result.output.decode()


@pytest.mark.parametrize("policy", ["error", "comment", "remove"])
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_round_trip_is_byte_exact(path: Path, policy: str) -> None:
    source = path.read_bytes()
    if policy == "error" and _refused(path):
        return  # nothing is written: test_what_the_stack_cannot_run_is_refused_with_the_alternative
    there = translate_script(source, Options(on_unsupported=policy), path.name)
    back = translate_script(there.output, Options(target="torchrun"), path.name)
    assert back.output == source


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.stem)
def test_what_the_stack_cannot_run_is_refused_with_the_alternative(path: Path) -> None:
    """FSDP2 has no MindSpore counterpart: the translation stops naming the flag and what to use instead."""
    with pytest.raises(TranslationRefused) as info:
        translate_script(path.read_bytes(), Options(), path.name)
    refusals = [r.message for r in info.value.report.refusals]
    assert sorted(reported_flags(refusals)) == sorted(header(path, "refused"))
    assert all("pretrain_vlm.py" in r or "Megatron" in r for r in refusals), refusals


def test_mmruns_own_trainer_as_the_entry_adds_the_trainer_layer() -> None:
    """The same flags launched into models/pretrain_gpt.py are mmrun's trainer's business: it has no CP, RMSNorm, ..."""
    source = (CORPUS_DIR / "llm_pretrain_llama2_7b.sh").read_text(encoding="utf-8")
    source = source.replace("torchrun $DISTRIBUTED_ARGS pretrain_gpt.py", "torchrun $DISTRIBUTED_ARGS models/pretrain_gpt.py")
    source = source.replace("--sequence-parallel \\\n", "--sequence-parallel \\\n    --context-parallel-size ${CP} \\\n")
    assert "--context-parallel-size ${CP}" in source
    warned = translate_script(source.encode(), Options(), "mmrun_entry.sh").report.warnings
    assert warned and all(w.message.startswith("[mmrun trainer] ") for w in warned)
    assert any(w.message.startswith("[mmrun trainer] --context-parallel-size ${CP}") and "not checked here" in w.message
               for w in warned)  # a shell variable: judged when the job starts
    # the models call the fused Ascend kernels (and flash attention) on NPUs: nothing to say about them
    assert not any("--use-fused" in w.message or "--use-flash-attn" in w.message for w in warned)
    with pytest.raises(TranslationRefused) as info:
        translate_script(source.replace("--context-parallel-size ${CP}", "--context-parallel-size 8").encode(),
                         Options(), "mmrun_entry.sh")
    assert [r.message.split(" (")[0] for r in info.value.report.refusals] == ["[mmrun trainer] --context-parallel-size 8"]
    removed = translate_script(source.encode(), Options(on_unsupported="remove"), "mmrun_entry.sh")
    # what removal takes out is what the trainer warned about (the shell variable aside: judged at start-up)
    assert {c.why.split(" (")[0] for c in removed.report.changes if c.why.startswith("[mmrun trainer]")} == {
        w.message.split(" (")[0] for w in warned if "not checked here" not in w.message}


def test_the_cli_translates_the_vlm_fine_tune_without_a_warning(capsys, tmp_path) -> None:
    """Issue 13's script shape: `mmrun translate --to mindspore` prints the launch rewrite and no warning (--log-tps,
    which the Qwen2.5-VL twins leave out, is kept: the maintainers' msrun Omni script passes it)."""
    out = tmp_path / "vlm_ms.sh"
    assert main([str(CORPUS_DIR / "vlm_finetune_qwen25vl_72b.sh"), "--to", "mindspore", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert not [line for line in err.splitlines() if ": warning: " in line], err
    assert "--log-tps" in out.read_text(encoding="utf-8")
    assert "msrun $DISTRIBUTED_ARGS pretrain_vlm.py" in out.read_text(encoding="utf-8")
