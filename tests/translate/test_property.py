"""Generated launch scripts (option order, spellings, `=`/space, quoting, where options live, launcher form):
each translates, parses again (tree-sitter and `bash -n`), round-trips to the same bytes, and means the same.

Meaning is checked by running the generated scripts (ours, not a user's) with stub `torchrun`/`msrun`/`python`
executables on PATH that record their argv: the msrun options must be what the shared translation table says.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmrun.launchers.options import BY_LAUNCHER, MSRUN, TORCHRUN
from mmrun.launchers.translate import Options, translate_script
from mmrun.launchers.translate.rewrite import translate_rules
from mmrun.launchers.translate.rules import KEEP_DEFAULTS
from mmrun.launchers.option_rules import to_msrun, to_torchrun

STUB = '#!/bin/bash\nprintf "%s\\n" "LWS=${LOCAL_WORLD_SIZE-unset}" "$(basename "$0")" "$@" > "$STUB_OUT"\n'
DROPPED = {  # torchrun options msrun has no use for, with a value each may take
    "rdzv_backend": ["c10d", "static"], "rdzv_id": ["job42"], "max_restarts": ["0"],
    "monitor_interval": ["1"], "start_method": ["spawn"],
}
TRAINING = ["--num-layers 2", "--fp16", "--lr 1e-4", "--micro-batch-size 1", '--data-path "$DATA"', "--seq-length=128"]
FORMS = ["torchrun", "python -m torch.distributed.run", "python3 -m torch.distributed.launch"]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("stubs")
    for name in ("torchrun", "msrun", "python", "python3"):
        (directory / name).write_text(STUB)
        (directory / name).chmod(0o755)
    return directory


@st.composite
def scripts(draw) -> dict:
    gpus, nnodes = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    options: list[tuple[str, str | None]] = []
    use_vars = draw(st.booleans())
    options.append(("nproc_per_node", "$GPUS" if use_vars else str(gpus)))
    if draw(st.booleans()):
        options.append(("nnodes", "$NNODES" if use_vars else str(nnodes)))
    if draw(st.booleans()):
        options.append(("node_rank", draw(st.sampled_from(["0", "$NODE_RANK"]))))
    rendezvous = draw(st.sampled_from(["master", "endpoint", "standalone"]))
    if rendezvous == "master" and draw(st.booleans()):
        options.append(("master_addr", draw(st.sampled_from(["127.0.0.1", "$MASTER_ADDR", "localhost"]))))
    if rendezvous == "master" and draw(st.booleans()):
        options.append(("master_port", str(draw(st.integers(20000, 30000)))))
    if rendezvous == "endpoint":
        options.append(("rdzv_endpoint", draw(st.sampled_from(["127.0.0.1:29400", "$MASTER_ADDR:29400", "localhost"]))))
    if rendezvous == "standalone":
        options.append(("standalone", None))
    for dest in draw(st.lists(st.sampled_from(sorted(DROPPED)), unique=True, max_size=2)):
        options.append((dest, draw(st.sampled_from(DROPPED[dest]))))
    options = draw(st.permutations(options))
    where = draw(st.sampled_from(["line", "string", "string_lines", "array", "array_lines"]))
    written = []
    for dest, value in options:
        option = BY_LAUNCHER[TORCHRUN][dest]
        flag = draw(st.sampled_from(option.flags))
        quote = "" if where.startswith("string") else draw(st.sampled_from(["", '"']))
        if value is None:
            written.append([flag])
        elif draw(st.booleans()):
            written.append([f"{flag}={quote}{value}{quote}"])
        else:
            written.append([flag, f"{quote}{value}{quote}"])
    form = draw(st.sampled_from(FORMS))
    if form.endswith("launch"):
        written.insert(0, [draw(st.sampled_from(["--use_env", "--use-env"]))])
    training = draw(st.lists(st.sampled_from(TRAINING), unique=True, max_size=4))
    return {
        "gpus": gpus, "nnodes": nnodes, "options": options, "written": written, "form": form, "training": training,
        "where": where,
        "training_var": draw(st.booleans()), "world_size": draw(st.booleans()), "tee": draw(st.booleans()),
        "line_per_option": draw(st.booleans()),
    }


def render(case: dict) -> str:
    lines = ["#!/bin/bash", f"GPUS={case['gpus']}", f"NNODES={case['nnodes']}", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "DATA=/data/x"]
    if case["world_size"]:
        lines.append("WORLD_SIZE=$(($GPUS*$NNODES))")
    groups = [" ".join(group) for group in case["written"]]
    where = case["where"]
    if where == "line":
        joiner = " \\\n    " if case["line_per_option"] else " "
        launcher_args = joiner.join(groups)
    elif where.startswith("string"):
        body = "\n    " + " \\\n    ".join(groups) + "\n" if where == "string_lines" else " ".join(groups)
        lines.append(f'DISTRIBUTED_ARGS="{body}"')
        launcher_args = "$DISTRIBUTED_ARGS"
    else:
        body = "\n    " + "\n    ".join(groups) + "\n" if where == "array_lines" else " ".join(groups)
        lines.append(f"DISTRIBUTED_ARGS=({body})")
        launcher_args = '"${DISTRIBUTED_ARGS[@]}"'
    training = " ".join(case["training"])
    if case["training_var"] and training:
        lines.append(f'TRAIN_ARGS="{training}"'.replace('"$DATA"', "$DATA"))
        training = "$TRAIN_ARGS"
    command = f"{case['form']} {launcher_args} pretrain_gpt.py {training}".rstrip()
    if case["tee"]:
        command += " 2>&1 | tee train.log"
    return "\n".join(lines + [command]) + "\n"


def run(script: str, stubs: Path, workdir: Path) -> list[str]:
    """Run one of OUR generated scripts with the stubs first on PATH; returns [LWS=.., launcher, argv...]."""
    out = workdir / "argv.txt"
    if out.exists():
        out.unlink()
    path = workdir / "job.sh"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_OUT": str(out)}
    subprocess.run(["bash", str(path)], cwd=workdir, env=env, check=True, capture_output=True, timeout=10)
    return out.read_text().splitlines()


def launcher_options(argv: list[str], launcher: str) -> tuple[dict[str, str], list[str]]:
    """(dest -> value, [script, training args...]) read with the shared option table."""
    table = BY_LAUNCHER[launcher]
    if argv and argv[0] == "-m":
        argv = argv[2:]
    found: dict[str, str] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        flag, eq, value = argv[index].partition("=")
        if flag in ("--use_env", "--use-env"):
            index += 1
            continue
        option = next(o for o in table.values() if flag in o.flags)
        if option.takes_value and not eq:
            value, index = argv[index + 1], index + 1
        found[option.dest] = value if option.takes_value else True
        index += 1
    return found, argv[index:]


@settings(max_examples=int(os.environ.get("MMRUN_TRANSLATE_EXAMPLES", "40")), deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=scripts())
def test_generated_scripts_translate_parse_round_trip_and_keep_their_meaning(case, stubs, tmp_path_factory, tx) -> None:
    source = render(case).encode()
    there = translate_script(source, Options(), "gen.sh")
    assert tx.parses(there.output)
    assert tx.bash_n(there.output).returncode == 0
    assert translate_script(there.output, Options(target=TORCHRUN), "gen.sh").output == source

    workdir = tmp_path_factory.mktemp("job")
    torch_run = run(source.decode(), stubs, workdir)
    ms_run = run(there.output.decode(), stubs, workdir)
    assert ms_run[1] == "msrun"
    torch_opts, torch_rest = launcher_options(torch_run[2:], TORCHRUN)
    ms_opts, ms_rest = launcher_options(ms_run[2:], MSRUN)
    nproc, nodes = int(torch_opts["nproc_per_node"]), int(torch_opts.get("nnodes", "1"))
    # The oracle: the shared table applied to the values the script really passed (evaluated by bash), minus
    # the defaults both launchers share, plus the Ascend guide's --bind_core; a script's --standalone gets
    # msrun's default port (it cannot pick a free one).
    table = to_msrun(torch_opts)
    expected = {o.dest: str(v) for o, v in table.options if o.dest not in table.defaulted or o.dest in KEEP_DEFAULTS}
    expected["bind_core"] = "True"
    if "standalone" in torch_opts:
        expected["master_port"] = BY_LAUNCHER[MSRUN]["master_port"].default
    assert {k: str(int(v)) if k.endswith("_num") else v for k, v in ms_opts.items()} == expected
    assert ms_run[0] == f"LWS={nproc}"
    assert ms_rest == torch_rest + ["--ai-framework", "mindspore"]

    # Without the undo record the reverse rules alone still give a torchrun job with the same meaning.
    rules_back, _ = translate_rules(there.output, Options(target=TORCHRUN), "gen.sh")
    back_run = run(rules_back.decode(), stubs, workdir)
    back_opts, back_rest = launcher_options(back_run[2:], TORCHRUN)
    assert back_run[1] == "torchrun" and back_rest == torch_rest
    assert int(back_opts["nproc_per_node"]) * int(back_opts.get("nnodes", "1")) == nproc * nodes
    assert int(back_opts["nproc_per_node"]) == nproc
    for dest in ("node_rank", "master_addr", "master_port"):
        if "standalone" not in torch_opts and "rdzv_endpoint" not in torch_opts:
            assert back_opts.get(dest) == torch_opts.get(dest)
        else:  # --standalone / --rdzv_endpoint come back as the address and port msrun was given
            assert back_opts.get(dest) == ms_opts.get(dest)


@st.composite
def msrun_scripts(draw) -> str:
    """A hand-written msrun script: options in random order, on the line, in a string or in an array."""
    local, nodes = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    use_vars = draw(st.booleans())
    options = []
    if draw(st.booleans()) or not use_vars:
        options.append(("local_worker_num", "$NPUS" if use_vars else str(local)))
        options.append(("worker_num", "$WORLD_SIZE" if use_vars else str(local * nodes)))
    for dest, values in (("master_addr", ["127.0.0.1", "$MASTER_ADDR"]), ("master_port", ["8118", "29500"]),
                         ("node_rank", ["0", "-1", "$NODE_RANK"]), ("log_dir", ["msrun_log", "logs/ms"]),
                         ("join", ["True", "False"]), ("cluster_time_out", ["300"]), ("bind_core", ["True"])):
        if draw(st.booleans()):
            options.append((dest, draw(st.sampled_from(values))))
    options = draw(st.permutations(options))
    groups = [f"--{dest}={value}" if draw(st.booleans()) else f"--{dest} {value}" for dest, value in options]
    where = draw(st.sampled_from(["line", "string", "array"]))
    lines = ["#!/bin/bash", f"NPUS={local}", f"NNODES={nodes}", "WORLD_SIZE=$(($NPUS*$NNODES))", "NODE_RANK=0",
             "MASTER_ADDR=127.0.0.1", "export LOCAL_WORLD_SIZE=$NPUS"]
    if where == "line":
        args = " ".join(groups)
    elif where == "string":
        lines.append('DISTRIBUTED_ARGS="\n    ' + " \\\n    ".join(groups) + '\n"')
        args = "$DISTRIBUTED_ARGS"
    else:
        lines.append("DISTRIBUTED_ARGS=(\n    " + "\n    ".join(groups) + "\n)")
        args = '"${DISTRIBUTED_ARGS[@]}"'
    return "\n".join(lines + [f"msrun {args} pretrain_gpt.py --lr 1e-4 --ai-framework mindspore".replace("  ", " ")]) + "\n"


@settings(max_examples=int(os.environ.get("MMRUN_TRANSLATE_EXAMPLES", "40")) // 2, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=msrun_scripts())
def test_handwritten_msrun_scripts_go_to_torchrun_and_back(text, stubs, tmp_path_factory, tx) -> None:
    source = text.encode()
    there = translate_script(source, Options(target=TORCHRUN), "ms.sh")
    assert tx.parses(there.output) and tx.bash_n(there.output).returncode == 0
    assert translate_script(there.output, Options(), "ms.sh").output == source

    workdir = tmp_path_factory.mktemp("job")
    ms_opts, ms_rest = launcher_options(run(text, stubs, workdir)[2:], MSRUN)
    torch_run = run(there.output.decode(), stubs, workdir)
    torch_opts, torch_rest = launcher_options(torch_run[2:], TORCHRUN)
    assert torch_run[1] == "torchrun" and torch_rest == ms_rest[:-2]  # --ai-framework mindspore removed
    given = {"local_worker_num": "8", "worker_num": "8", **ms_opts}  # msrun's own defaults
    expected = {o.dest: str(v) for o, v in to_torchrun(given).options}
    assert torch_opts == expected
