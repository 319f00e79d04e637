"""The parts: word splitting, value arithmetic, edits, lint, launch forms, the marker, the feature gate hook."""
from __future__ import annotations

import pytest

from mmrun.launchers.translate import Options, TranslationRefused, translate_script
from mmrun.launchers.translate.edits import Edit, EditConflict, apply_edits
from mmrun.launchers.translate.launch_forms import find_launches, read_args
from mmrun.launchers.translate.lint import broken_continuations, unset_variables
from mmrun.launchers.translate.parse import ScriptSyntaxError, parse_script
from mmrun.launchers.translate.rewrite import translate_rules
from mmrun.launchers.translate.values import ScriptValues
from mmrun.launchers.translate.words import Definitions, Words


def analyse(text: str):
    script = parse_script(text.encode())
    defs = Definitions(script)
    return script, defs, Words(script, defs)


def translate(text: str, **options) -> str:
    return translate_script(text.encode(), Options(**options), "t.sh").output.decode()


# ------------------------------------------------------------------ words


def test_definition_words_split_like_bash() -> None:
    script, defs, words = analyse('A="\n  --x 1 \\\n  --hidden-size 1024 \\ \n  --y \\"q\\" $B ${C}s\n"\n')
    container = words.definition(defs.get("A")[0])
    assert [w.text for w in container.words] == ["--x", "1", "--hidden-size", "1024", "\\", "--y", '"q"', "$B", "${C}s"]
    assert [w.static for w in container.words][-3:] == [True, False, False]
    assert container.words[-2].ref is not None and container.words[-2].ref.name == "B"
    for word in container.words:  # every word's bytes are where the script wrote them
        assert script.source[word.start:word.end].decode() == word.raw


def test_single_value_variables_stay_shell_text_and_option_variables_expand() -> None:
    script, defs, words = analyse('N=8\nD="--nproc_per_node $N"\ntorchrun $D "${E[@]}" t.py\n')
    launch = find_launches(script, words)[0]
    expanded = [w for arg in launch.args for w in words.expand(arg, union=True)[0]]
    assert [w.raw for w in expanded] == ["--nproc_per_node", "$N", '"${E[@]}"', "t.py"]
    assert expanded[2].opaque  # E is never defined: unknown words


def test_launch_forms_and_wrappers() -> None:
    text = (
        "env OMP_NUM_THREADS=1 /opt/env/bin/torchrun --nproc_per_node 2 a.py\n"
        "exec nohup $PYTHON -u -m torch.distributed.run -r3 --nproc-per-node=2 b.py\n"
        "python3 -m mindspore.parallel.cluster.run --worker_num 2 c.py\n"
        "python -m torch.distributed.launch --use_env d.py\n"
        "python train.py --nproc_per_node 2\n"
    )
    script, _, words = analyse(text)
    launches = find_launches(script, words)
    assert [(l.launcher, l.form) for l in launches] == [
        ("torchrun", "torchrun"), ("torchrun", "python -m torch.distributed.run"),
        ("msrun", "python -m mindspore.parallel.cluster.run"), ("torchrun", "python -m torch.distributed.launch"),
    ]
    assert launches[1].dropped == ["-u"]
    glued = read_args(launches[1], launches[1].args)
    assert [(u.dest, u.value) for u in glued.uses] == [("redirects", "3"), ("nproc_per_node", "2")]
    out = translate("env OMP_NUM_THREADS=1 /opt/env/bin/torchrun --nproc_per_node 2 a.py\n", device="cpu")
    assert "env OMP_NUM_THREADS=1 /opt/env/bin/msrun --local_worker_num 2 --worker_num 2" in out


def test_unknown_launcher_option_is_refused_with_its_spelling() -> None:
    with pytest.raises(TranslationRefused) as refused:
        translate("torchrun --nproc 2 t.py\n")
    assert "--nproc is not a torchrun option (received --nproc)" in str(refused.value)


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(ScriptSyntaxError) as error:
        parse_script(b"A=1\nif true; then\n  torchrun t.py\n", "x.sh")
    assert error.value.line >= 2 and str(error.value).startswith(f"x.sh:{error.value.line}:")


# ------------------------------------------------------------------ values


def values_at(text: str, marker: str = "USE") -> ScriptValues:
    script, defs, _ = analyse(text)
    return ScriptValues(script, defs, text.encode().index(marker.encode()))


def test_product_reuses_a_variable_holding_exactly_that_product() -> None:
    text = "G=8\nN=2\nWORLD_SIZE=$((G * N))\nTOTAL=$(($N*$G))\n# USE\n"
    assert values_at(text).product("$G", "${N}") == "$WORLD_SIZE"
    assert values_at(text).product('"$N"', "$G") == "$WORLD_SIZE"  # order and quoting do not matter
    assert values_at(text).product("$G", "$X") == "$((G*X))"  # bare names inside $(( )): shellcheck SC2004
    assert values_at(text).product("4", "2") == "8" and values_at(text).product("$G", "1") == "$G"


def test_product_variable_is_not_reused_when_a_factor_changes_before_the_use() -> None:
    text = "G=8\nN=2\nWORLD_SIZE=$((G*N))\nN=4\n# USE\n"
    assert values_at(text).product("$G", "$N") == "$((G*N))"
    later = "G=8\nN=2\n# USE\nWORLD_SIZE=$((G*N))\n"
    assert values_at(later).product("$G", "$N") == "$((G*N))"


def test_quotient_recognises_the_products_it_made() -> None:
    text = "G=8\nN=2\nWORLD_SIZE=$(($G*$N))\n# USE\n"
    values = values_at(text)
    assert values.quotient("$WORLD_SIZE", "$G", "--worker_num") == "$N"
    assert values.quotient("$((G*NNODES))", "${G}", "--worker_num") == "$NNODES"
    assert values.quotient("$G", "$G", "--worker_num") == "1"
    assert values.quotient("16", "8", "--worker_num") == "2"
    assert values.quotient("$T", "$G", "--worker_num") == "$((T/G))"
    with pytest.raises(ValueError):
        values.quotient("10", "4", "--worker_num")


# ------------------------------------------------------------------ edits


def test_edits_apply_merge_duplicates_and_refuse_overlaps() -> None:
    source = b"torchrun --nnodes 1 t.py"
    edits = [Edit(0, 8, b"msrun"), Edit(9, 17, b"--worker_num"), Edit(0, 8, b"msrun"), Edit(24, 24, b" --x"), Edit(24, 24, b" --y")]
    assert apply_edits(source, edits) == b"msrun --worker_num 1 t.py --x --y"
    with pytest.raises(EditConflict):
        apply_edits(source, [Edit(0, 10, b"a"), Edit(5, 12, b"b")])


def test_a_variable_shared_by_launches_that_need_different_rewrites_is_refused() -> None:
    text = 'D="--nnodes 2"\ntorchrun $D --nproc_per_node 2 a.py\ntorchrun $D --nproc_per_node 4 b.py\n'
    with pytest.raises(TranslationRefused) as refused:
        translate(text)
    assert "need different rewrites of the same text" in str(refused.value)
    # Sharing is fine when the rewrites agree: the definition is rewritten once.
    shared = translate('D="--nproc_per_node 2"\ntorchrun $D --nnodes 1 a.py\ntorchrun $D --nnodes 2 b.py\n')
    assert shared.count("export LOCAL_WORLD_SIZE=2") == 1 and "--worker_num 2 " in shared and "--worker_num 4 " in shared


def test_options_built_with_several_plain_assignments_and_appends_are_refused() -> None:
    text = "if a; then D=(--nproc_per_node 2); else D=(--nproc_per_node 4); fi\nD+=(--nnodes 1)\ntorchrun \"${D[@]}\" t.py\n"
    with pytest.raises(TranslationRefused) as refused:
        translate(text)
    assert "assigned several times with += between" in str(refused.value)


# ------------------------------------------------------------------ lint


def test_broken_continuations_in_and_out_of_strings() -> None:
    text = "torchrun a.py \\ \n  --x 1\nA='--y \\\t\n --w'\n# comment \\ \nB=\"--z \\\\ \"\nC=1 \\\r\nD=2\n"
    script = parse_script(text.encode())
    found = {f.line: f.message for f in broken_continuations(script)}
    assert sorted(found) == [1, 3, 7]  # not the comment, not an escaped backslash
    assert "line 2 runs as a separate command" in found[1]
    assert "a literal `\\` becomes an argument" in found[3]
    assert "carriage return" in found[7]


def test_unset_variables_skip_defaults_environment_and_loop_variables() -> None:
    text = "for i in 1 2; do read -r R; done\ntorchrun --nproc_per_node ${N:-2} $HOME/$i/$R/$MISSING t.py\n"
    script, defs, _ = analyse(text)
    found = unset_variables(script, defs, [script.root])
    assert [f.message.split()[0] for f in found] == ["$MISSING"]


# ------------------------------------------------------------------ marker and reverse


def test_edited_msrun_script_falls_back_to_the_rules_and_keeps_the_meaning() -> None:
    source = "#!/bin/bash\npython -m torch.distributed.run --nproc-per-node=4 --nnodes=1 t.py\n"
    msrun = translate(source)
    assert "# mmrun translate undo:" in msrun
    edited = msrun.replace("--local_worker_num=4", "--local_worker_num=2").replace("--worker_num=4", "--worker_num=2")
    back = translate_script(edited.encode(), Options(target="torchrun"), "t.sh")
    assert back.report.undo is None
    assert any("no longer matches" in n.message for n in back.report.notes)
    assert "torchrun --nproc_per_node=2 --nnodes=1 t.py" in back.output.decode()


def test_a_forged_undo_record_is_not_trusted() -> None:
    msrun = translate("#!/bin/bash\ntorchrun --nproc_per_node 2 t.py\n")
    forged = msrun.replace("# mmrun translate: torchrun", '# mmrun translate undo: [[1,1,["rm -rf /\\n"]]]\n# mmrun translate: torchrun')
    back = translate_script(forged.encode(), Options(target="torchrun"), "t.sh")
    commands = [line for line in back.output.decode().splitlines() if not line.startswith("#")]
    assert commands == ["torchrun --nproc_per_node 2 --nnodes 1 t.py"]  # the rules' translation, nothing forged runs
    assert back.report.undo is None


def test_handwritten_msrun_script_there_and_back() -> None:
    """msrun -> torchrun -> msrun gives the hand-written msrun script back (via the marker of the first step)."""
    source = "msrun --worker_num=8 --local_worker_num=8 --join=True t.py --ai-framework mindspore\n"
    torch_form = translate(source, target="torchrun")
    assert "torchrun --nnodes=1 --nproc_per_node=8 t.py\n" in torch_form
    assert translate(torch_form) == source


def test_msrun_defaults_are_written_out_for_torchrun() -> None:
    """msrun without --local_worker_num/--worker_num starts 8 workers; torchrun's default is 1."""
    out, report = translate_rules(b"msrun t.py\n", Options(target="torchrun"), "t.sh")
    assert out == b"torchrun --nproc_per_node 8 --nnodes 1 t.py\n"
    assert {c.after for c in report.changes} >= {"--nproc_per_node 8", "--nnodes 1"}


# ------------------------------------------------------------------ feature gate


def test_gate_fallbacks_warn_unsupported_stop_and_unknown_values_are_not_judged() -> None:
    text = "torchrun --nproc_per_node 2 models/pretrain_gpt.py --recompute-activation-function --context-parallel-size $CP\n"
    result = translate_script(text.encode(), Options(), "t.sh")
    messages = " ".join(w.message for w in result.report.warnings)
    assert "--recompute-activation-function" in messages and "--on-unsupported warn" in messages
    assert "$CP" in messages and "not checked here" in messages
    with pytest.raises(TranslationRefused):
        translate("torchrun --nproc_per_node 2 models/pretrain_gpt.py --context-parallel-size 2\n")
    removed = translate("torchrun --nproc_per_node 2 models/pretrain_gpt.py --context-parallel-size 2 --recompute-activation-function\n",
                        on_unsupported="remove")
    command = [line for line in removed.splitlines() if line.startswith("msrun")][0]
    assert command.endswith(" models/pretrain_gpt.py --ai-framework mindspore")
