"""torchrun <-> msrun translation: the table's rules, refusals, and a round-trip property."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mmrun.launchers.option_rules import Values, to_msrun, to_torchrun


# The mapping of the MindSpeed-MM MindSpore-backend migration guide: --local_worker_num = nproc_per_node,
# --worker_num = nproc_per_node x nnodes, the rest by the same names.
def test_ascend_guide_mapping_with_literal_values():
    out = to_msrun({"nproc_per_node": "8", "nnodes": "2", "node_rank": "1", "master_addr": "10.0.0.1", "master_port": "6000"})
    assert out.argv() == ["--local_worker_num", "8", "--worker_num", "16", "--master_addr", "10.0.0.1",
                          "--master_port", "6000", "--node_rank", "1", "--log_dir", "msrun_log", "--join", "True"]
    assert out.env == {"LOCAL_WORLD_SIZE": "8"}
    assert not out.refusals


def test_msrun_defaults_are_always_overridden_explicitly():
    # msrun would otherwise start 8 workers on port 8118 with an automatic node rank.
    out = to_msrun({})
    assert out.argv() == ["--local_worker_num", "1", "--worker_num", "1", "--master_addr", "127.0.0.1",
                          "--master_port", "29500", "--node_rank", "0", "--log_dir", "msrun_log", "--join", "True"]


def test_shell_expressions_stay_expressions():
    out = to_msrun({"nproc_per_node": "$GPUS_PER_NODE", "nnodes": "$NNODES"})
    assert out.value("worker_num") == "$(($GPUS_PER_NODE*$NNODES))"
    assert Values().product("$((A+1))", "2") == "$(((A+1)*2))"


def test_user_msrun_options_win_over_defaults():
    out = to_msrun({"nproc_per_node": "2", "log_dir": "logs", "join": "False", "bind_core": "True"})
    assert out.value("log_dir") == "logs" and out.value("join") == "False" and out.value("bind_core") == "True"


@pytest.mark.parametrize("given, fragment", [
    ({"nnodes": "1:4"}, "--nnodes 1:4 cannot run under msrun: elastic node ranges need torchrun's elastic agent and msrun has no elastic mode; pass a fixed node count"),
    ({"max_restarts": "3"}, "msrun does not restart failed workers"),
    ({"rdzv_backend": "etcd"}, "msrun has no external rendezvous store"),
    ({"no_python": True}, "--no-python cannot run under msrun"),
    ({"run_path": True}, "--run-path cannot run under msrun"),
    ({"redirects": "3"}, "msrun always writes each worker's output"),
    ({"tee": "1"}, "msrun always writes each worker's output"),
    ({"local_ranks_filter": "0,1"}, "not a list"),
    ({"rdzv_conf": "foo=1"}, "rendezvous setting 'foo'"),
    ({"nproc_per_node": "gpu"}, "msrun needs a worker count"),
    ({"nproc_per_node": "2", "nnodes": "2", "worker_num": "6"}, "disagrees with --nproc-per-node 2 x --nnodes 2"),
])
def test_refusals_name_option_reason_and_hint(given, fragment):
    out = to_msrun(given)
    assert any(fragment in str(r) for r in out.refusals), [str(r) for r in out.refusals]
    assert all("; " in str(r) for r in out.refusals)  # every refusal carries a hint


@pytest.mark.parametrize("given, expected", [
    ({"standalone": True}, {"master_addr": "127.0.0.1", "master_port": "0"}),
    ({"rdzv_endpoint": "node0:7000", "rdzv_backend": "c10d"}, {"master_addr": "node0", "master_port": "7000"}),
    ({"rdzv_endpoint": "node0"}, {"master_addr": "node0", "master_port": "29400"}),
    ({"rdzv_conf": "join_timeout=900,read_timeout=60"}, {"cluster_time_out": "900"}),
    ({"local_ranks_filter": "1"}, {"tail_worker_log": "1"}),
    ({"nnodes": "2:2", "nproc_per_node": "4"}, {"worker_num": "8"}),
])
def test_translated_forms(given, expected):
    out = to_msrun(given)
    assert not out.refusals
    assert {k: out.value(k) for k in expected} == expected


def test_harmless_options_are_dropped_with_a_note():
    out = to_msrun({"monitor_interval": "5", "start_method": "fork", "max_restarts": "0"})
    assert not out.refusals
    assert {n.flag for n in out.notes} == {"--monitor-interval", "--start-method"}


def test_msrun_options_back_to_torchrun():
    out = to_torchrun({"local_worker_num": "4", "worker_num": "8", "node_rank": "1", "master_port": "6000",
                       "log_dir": "msrun_log", "join": "True", "cluster_time_out": "300", "tail_worker_log": "0"})
    assert out.argv() == ["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--master-port", "6000",
                          "--rdzv-conf", "join_timeout=300", "--local-ranks-filter", "0"]
    refused = to_torchrun({"local_worker_num": "4", "worker_num": "6", "sim_level": "1"}).refusals
    assert {r.flag for r in refused} == {"--worker_num", "--sim_level"}


def test_automatic_node_rank_becomes_zero_with_a_note():
    out = to_torchrun({"node_rank": "-1"})
    assert out.value("node_rank") == "0" and out.notes


# --- property: supported torchrun option sets survive torchrun -> msrun -> torchrun -------------

SUPPORTED = {
    "nproc_per_node": st.integers(1, 16).map(str),
    "nnodes": st.integers(1, 8).map(str),
    "node_rank": st.integers(0, 7).map(str),
    "master_addr": st.sampled_from(["127.0.0.1", "10.1.2.3", "node-0", "$MASTER_ADDR"]),
    "master_port": st.integers(1024, 65535).map(str),
    "log_dir": st.sampled_from(["logs", "/tmp/x", "$LOG_DIR"]),
    "rdzv_conf": st.integers(1, 3600).map(lambda t: f"join_timeout={t}"),
    "local_ranks_filter": st.integers(0, 7).map(str),
    "module": st.just(True),
}
TORCHRUN_DEFAULTS = {"nproc_per_node": "1", "nnodes": "1", "node_rank": "0", "master_addr": "127.0.0.1", "master_port": "29500"}


def normalise(options: dict) -> dict:
    return {**TORCHRUN_DEFAULTS, **options}


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional=SUPPORTED))
def test_round_trip_torchrun_msrun_torchrun(options):
    there = to_msrun(options)
    assert not there.refusals
    back = to_torchrun({o.dest: v for o, v in there.options})
    result = {o.dest: v for o, v in back.options}
    if there.module:
        result["module"] = True
    assert not back.refusals
    assert normalise(result) == normalise(options)


def test_msrun_only_options_use_msruns_worker_default():
    # `msrun --worker_num 16` means 2 nodes of msrun's default 8 workers, not 16 nodes of 1.
    assert to_torchrun({"worker_num": "16"}).argv() == ["--nproc-per-node", "8", "--nnodes", "2"]
