"""The rule table: validated on load, errors name the rule; selection and the pre-filter."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from mmrun.analyse.rules import (
    RULES_PATH, RuleError, build_index, expand_prefixes, load_rules, parse_rules, select_rules,
)
from mmrun.analyse.runner import RunConfig, analyse_source, make_index

FIXTURES = Path(__file__).parent / "fixtures"
RAW = yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))


def _table_with(change) -> dict:
    data = copy.deepcopy(RAW)
    change(data["rules"])
    return data


def _rule(rules, code):
    return next(r for r in rules if r["code"] == code)


def test_real_table_loads_and_covers_every_category():
    rules = load_rules()
    prefixes = {r.code[:3] for r in rules}
    assert prefixes == {"MM1", "MM2", "MM3", "MM4", "MM5", "MM6"}
    for rule in rules:   # every template formats
        assert "{" not in rule.format_message("x") and "{" not in rule.format_replacement("x")


@pytest.mark.parametrize("change, expected", [
    (lambda rs: _rule(rs, "MM105").update(level="fatal"), r"rule MM105: unknown level 'fatal'"),
    (lambda rs: _rule(rs, "MM201").update(nmes=["x"]), r"rule MM201: unknown key\(s\) 'nmes'"),
    (lambda rs: _rule(rs, "MM301").pop("message"), r"rule MM301: missing required key\(s\) message"),
    (lambda rs: _rule(rs, "MM402").update(targets=["gpu"]), r"rule MM402: unknown target\(s\) gpu"),
    (lambda rs: _rule(rs, "MM507").update(confidence="maybe"), r"rule MM507: unknown confidence"),
    (lambda rs: _rule(rs, "MM203").update(kind="module"), r"rule MM203: unknown kind 'module'"),
    (lambda rs: _rule(rs, "MM302").update(code="MM301"), r"rule MM301: duplicate code"),
    (lambda rs: _rule(rs, "MM106").update(pattern="(cuda"), r"rule MM106: bad pattern"),
    (lambda rs: _rule(rs, "MM108").update(fix={"kind": "rename-method", "to": "x"}),
     r"rule MM108: fix kind 'rename-method' does not apply to kind 'name'"),
    (lambda rs: _rule(rs, "MM303").update(names={"torch.distributed.is_nccl_available": "torch.is_hccl"}),
     r"rule MM303: rename .* must keep the number of dotted parts"),
    (lambda rs: _rule(rs, "MM105")["fix"].update(colour="red"), r"rule MM105 fix: unknown key\(s\) 'colour'"),
])
def test_bad_tables_fail_naming_the_rule(change, expected):
    with pytest.raises(RuleError, match=expected):
        parse_rules(_table_with(change))


def test_table_shape_errors():
    with pytest.raises(RuleError, match="one top-level key 'rules'"):
        parse_rules({"rule": []})
    with pytest.raises(RuleError, match="entry #1: expected a mapping"):
        parse_rules({"rules": ["MM101"]})


def test_code_prefixes():
    rules = load_rules()
    assert expand_prefixes(["MM30"], rules) == {"MM301", "MM302", "MM303", "MM304", "MM305"}
    assert expand_prefixes(["all"], rules) == {r.code for r in rules}
    with pytest.raises(ValueError, match="'MM9' matches no rule"):
        expand_prefixes(["MM9"], rules)
    chosen = select_rules(rules, target="npu", select=["MM1", "MM5"], ignore=["MM105"])
    codes = {r.code for r in chosen}
    assert "MM105" not in codes and "MM101" in codes
    assert not any(c.startswith("MM5") for c in codes)   # MM5xx target MindSpore only


def test_most_specific_rule_wins_whatever_is_selected():
    # torch.cuda.synchronize belongs to MM101 (exact); selecting only the catch-all MM102 must
    # not report it as "no NPU equivalent".
    index = make_index(RunConfig(select=("MM102",)))
    result = analyse_source(b"import torch\ntorch.cuda.synchronize()\ntorch.cuda.get_arch_list()\n", "x.py", index)
    assert [(f.line, f.code) for f in result.findings] == [(3, "MM102")]


def test_prefilter_keeps_results_identical():
    # The same findings with the pre-filter disabled (its regex matching every file).
    index = make_index(RunConfig(target="both", fix=True))
    unfiltered = make_index(RunConfig(target="both", fix=True))
    unfiltered.trigger_re = re.compile(b"")
    skipped = 0
    for source in sorted(FIXTURES.glob("*.py")):
        data = source.read_bytes()
        a = analyse_source(data, source.name, index, fix=True)
        b = analyse_source(data, source.name, unfiltered, fix=True)
        assert (a.findings, a.changes, a.diff) == (b.findings, b.changes, b.diff), source.name
        skipped += not a.parsed
    plain = b"import os\n\ndef f(x):\n    return os.path.join(x, 'data')\n"
    assert not analyse_source(plain, "plain.py", index).parsed   # no trigger word: never parsed
    assert analyse_source(plain, "plain.py", unfiltered).findings == []


def test_prefilter_uses_only_selected_rules():
    index = build_index(load_rules(), selected=["MM302"])
    assert index.trigger_re.search(b'x = "nccl"') and not index.trigger_re.search(b"x.cuda()")
