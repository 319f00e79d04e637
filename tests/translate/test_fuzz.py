"""Hostile input through `mmrun translate` as users call it: random bytes, deep nesting, quotes, heredocs, arrays,
launch lines with random options, both directions, with --check, --diff and -o.

Whatever comes in: exit 0, 1 or 2, never a traceback; each error a line of its own; every example done within a
time bound (no hang); the input file's bytes untouched afterwards.
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mmrun.launchers.translate.cli import main

SECONDS_PER_EXAMPLE = 20  # generous on a loaded 2-core machine; a real example takes milliseconds
LAUNCHERS = ["torchrun", "msrun", "mmrun", "python -m torch.distributed.run", "python -u -m torch.distributed.launch",
             "python3 -m mindspore.parallel.cluster.run", "nohup torchrun", "env A=1 msrun", "$LAUNCHER"]
OPTIONS = ["--nproc_per_node", "--nproc-per-node", "--nnodes", "--node_rank", "--master_addr", "--master-port",
           "--rdzv_endpoint", "--rdzv_conf", "--standalone", "--max_restarts", "-m", "--local_worker_num",
           "--worker_num", "--log_dir", "--join", "--bind_core", "--cluster_time_out", "--tail_worker_log",
           "--ai-framework", "--dry-run", "--use_env", "--bogus", "-r3"]
VALUES = ["8", "0", "1:4", "2:2", "$N", "${N}", "${N:-1}", "$(nproc)", "`nproc`", "$((G*N))", '"$N"', "'x'",
          "host:29500", "join_timeout=60", "True", "", "\\", "a b", "${A[@]}", "$(echo $(echo 2))", "\xe9", "-1"]
TRAINING = ["train.py", "pretrain_gpt.py", "$SCRIPT", "--fp16", "--tensor-model-parallel-size 2", "--lr 1e-4",
            "--distributed-backend nccl", "--ckpt-format torch", "--ai-framework mindspore", "--use-flash-attn"]
PIECES = ["\n", " ", "\\\n", ";", "&&", "|", "| tee log", "2>&1", "&", '"', "'", "$(", ")", "`", "{", "}", "(", ")",
          "if true; then\n", "else\n", "fi\n", "for i in 1 2; do\n", "done\n", "f() {\n", "}\n", "<<EOF\n",
          "EOF\n", "<<'X'\n", "X\n", "eval ", "bash -c ", "CMD=", "ARGS=(", "ARGS+=(", "DISTRIBUTED_ARGS=\"",
          "export LOCAL_WORLD_SIZE=8\n", "# mmrun translate: torchrun -> msrun (--device npu); undo: mmrun translate --to pytorch\n",
          "# mmrun translate undo: [[0,1,[\"x\\n\"]]]\n", "# mmrun translate undo: [[[[[[[[", "#!/bin/bash\n",
          "# mmrun translate: msrun -> torchrun (--device cpu --on-unsupported remove); undo: mmrun translate --to mindspore\n",
          "# mmrun translate: mmrun -> msrun (--device \xff)\n", "# mmrun translate undo: [[99,5,[\"a\"]],[0,0,[1]]]\n",
          "# mmrun translate undo: {\"a\": [1e999, \"\\ud800\"]}\n", "# mmrun translate undo: [[0,3,[]],[1,1,[\"\\n\"]]]\n",
          "\r\n", "\t", "$", "${", "$((", "))", "=", "中", "\udcff"]


def _launch_line() -> st.SearchStrategy[str]:
    option = st.tuples(st.sampled_from(OPTIONS), st.sampled_from(["", " ", "="]), st.sampled_from(VALUES)).map("".join)
    return st.builds(lambda launcher, options, training: " ".join([launcher, *options, *training]),
                     st.sampled_from(LAUNCHERS), st.lists(option, max_size=6), st.lists(st.sampled_from(TRAINING), max_size=4))


def _nested(depth: int, opener: str, closer: str, middle: str = "x") -> str:
    return opener * depth + middle + closer * depth


_shell = st.recursive(
    st.one_of(_launch_line(), st.sampled_from(PIECES)),
    lambda inner: st.lists(inner, min_size=1, max_size=8).map("".join),
    max_leaves=40,
)
_deep = st.builds(
    lambda depth, kind, launch: launch + " " + {
        "subst": _nested(depth, "$(echo ", ")"),
        "quoted": _nested(depth, '"$(echo ', ')"'),
        "backquote": _nested(min(depth, 30), "`echo ", "`"),
        "braces": _nested(depth, "{ ", "; }", "true"),
        "ifs": _nested(depth, "if a; then\n", "fi\n", "true\n"),
        "arith": _nested(depth, "$((1+", "))", "1"),
        "arrays": "A=(" + " ".join(f"--x{i}" for i in range(depth)) + ")",
    }[kind] + "\n",
    st.integers(1, 600), st.sampled_from(["subst", "quoted", "backquote", "braces", "ifs", "arith", "arrays"]), _launch_line(),
)
TORCHRUN_OPTIONS = {"--nproc_per_node": ["8", "$GPUS", "${GPUS:-8}", "$(nproc)", '"$GPUS"'], "--nnodes": ["1", "2", "$NNODES", "${NNODES:-1}"],
                    "--node_rank": ["0", "$RANK"], "--master_addr": ["127.0.0.1", "$MASTER_ADDR"], "--master_port": ["6000", "$PORT"],
                    "--max_restarts": ["0"], "--rdzv_backend": ["c10d"], "--rdzv_endpoint": ["$MASTER_ADDR:29400", "localhost"]}
MSRUN_OPTIONS = {"--local_worker_num": ["8", "$GPUS", "$(nproc)"], "--worker_num": ["16", "$WORLD_SIZE", "$((GPUS*NNODES))"],
                 "--node_rank": ["0", "$RANK"], "--master_addr": ["127.0.0.1"], "--master_port": ["8118"], "--log_dir": ["msrun_log"],
                 "--join": ["True"], "--bind_core": ["True"], "--cluster_time_out": ["600"]}


@st.composite
def _plausible(draw) -> bytes:
    """A launch script that translates (valid options in a line, a string or an array), with hostile decorations."""
    msrun = draw(st.booleans())
    table = MSRUN_OPTIONS if msrun else TORCHRUN_OPTIONS
    flags = draw(st.lists(st.sampled_from(sorted(table)), unique=True, max_size=5))
    words = [f"{flag}{draw(st.sampled_from([' ', '=']))}{draw(st.sampled_from(table[flag]))}" for flag in flags]
    launcher = "msrun" if msrun else draw(st.sampled_from(["torchrun", "python -m torch.distributed.run", "mmrun"]))
    training = " ".join(draw(st.lists(st.sampled_from(TRAINING[3:]), max_size=4)))
    where = draw(st.sampled_from(["line", "string", "array", "if"]))
    if where == "line":
        body = f"{launcher} {' '.join(words)} pretrain_gpt.py {training}\n"
    elif where == "string":
        body = f'ARGS="\n    ' + " \\\n    ".join(words) + f'\n"\n{launcher} $ARGS pretrain_gpt.py {training}\n'
    elif where == "array":
        body = "ARGS=(" + " ".join(words) + f')\n{launcher} "${{ARGS[@]}}" pretrain_gpt.py {training}\n'
    else:
        body = f'if [ -n "$X" ]; then\n  ARGS="{" ".join(words)}"\nelse\n  ARGS="{" ".join(words[:1])}"\nfi\n{launcher} $ARGS train.py\n'
    decoration = draw(st.sampled_from(["", "eval", "heredoc", "deep", "variable", "crlf", "gbk"]))
    if decoration == "eval":
        body += f'eval "{launcher} --nproc_per_node 2 train.py"\n'
    elif decoration == "heredoc":
        body = f"cat > run.sh <<EOF\n{body}EOF\n" + body
    elif decoration == "deep":
        body = body.rstrip("\n") + " " + _nested(draw(st.integers(1, 400)), "$(echo ", ")") + "\n"
    elif decoration == "variable":
        body = f'CMD="{launcher} {" ".join(words)} train.py"\n$CMD\n' + body
    elif decoration == "crlf":
        body = body.replace("\n", "\r\n")
    data = ("#!/bin/bash\nGPUS=8\nNNODES=2\nWORLD_SIZE=$(($GPUS*$NNODES))\n" + body).encode()
    return data.replace(b"#!/bin/bash\n", b"#!/bin/bash\n# \xd6\xd0\xce\xc4\n") if decoration == "gbk" else data


SCRIPTS = st.one_of(
    _plausible(), _plausible(), _plausible(),  # weighted: most of the rewrite runs on scripts that translate
    st.binary(max_size=2000),
    _shell.map(lambda text: text.encode("utf-8", errors="surrogateescape")),
    _deep.map(str.encode),
    st.lists(_launch_line(), min_size=1, max_size=5).map(lambda lines: ("#!/bin/bash\n" + "\n".join(lines) + "\n").encode()),
)
MODES = st.sampled_from([[], ["--check"], ["--diff"], ["-o", "{out}"], ["--report", "json"], ["--on-unsupported", "comment"],
                         ["--on-unsupported", "remove", "--device", "cpu"]])


class ExampleTooSlow(Exception):
    pass


@contextmanager
def _time_bound(seconds: int):
    def expire(signum, frame):
        raise ExampleTooSlow(f"one example ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _captured():
    """sys.stdout/sys.stderr as byte buffers (main writes bytes through .buffer)."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        out.flush()
        err.flush()


def _translate(script: Path, argv: list[str]) -> tuple[int, bytes, bytes]:
    with _captured() as (out, err), _time_bound(SECONDS_PER_EXAMPLE):
        try:
            code = main([str(script), *argv])
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code
    out.flush()
    err.flush()
    return code, out.buffer.getvalue(), err.buffer.getvalue()


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("MMRUN_FUZZ_EXAMPLES", "250")), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.data_too_large])
@given(source=SCRIPTS, to=st.sampled_from(["mindspore", "pytorch"]), mode=MODES)
def test_hostile_scripts_never_crash_hang_or_change_the_input(source: bytes, to: str, mode: list[str], tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example (tmp_path is shared by all of them)
    script = work / "fuzz.sh"
    script.write_bytes(source)
    out_file = work / "out.sh"
    argv = ["--to", to, *[part.format(out=out_file) for part in mode]]
    code, out, err = _translate(script, argv)
    assert code in (0, 1, 2), err
    event(f"exit {code}" + (" (translated)" if code == 0 and b" change(s)" in err and b" 0 change(s)" not in err else ""))
    assert b"Traceback" not in err and b"internal error" not in err, err.decode(errors="replace")
    assert script.read_bytes() == source  # the input is never touched
    lines = err.decode("utf-8", errors="surrogateescape").splitlines()
    if "--report" in mode:
        assert (len(lines) == 1 and lines[0].startswith("mmrun translate: error:")) or json.loads(err)["script"] == str(script)
    else:
        # Every line of the report names the script (path:line: ...) or is mmrun's one-line error.
        assert all(line.startswith((str(script), "mmrun translate: error:")) for line in lines), lines[:5]
    if code == 2:
        assert out == b"" and not out_file.exists()
    if code == 0 and not mode:
        # What was printed translates back without a crash either (the way back is exercised on our own output).
        printed = work / "printed.sh"
        printed.write_bytes(out)
        back, _, back_err = _translate(printed, ["--to", "pytorch" if to == "mindspore" else "mindspore"])
        assert back in (0, 2) and b"Traceback" not in back_err and b"internal error" not in back_err
