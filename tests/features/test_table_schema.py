"""features.yaml is validated on load: every schema mistake is an error that names the entry."""
from __future__ import annotations

import pytest

from mmrun.backend import features as ft

GOOD_ENTRY = """\
  demo:
    title: a demo feature
    group: Demo
    triggers:
      - flag: --demo
    support:
      "*": {status: fallback, reason: "not implemented", hint: "drop --demo"}
"""


def write(tmp_path, body: str):
    path = tmp_path / "features.yaml"
    path.write_text("features:\n" + body)
    return path


def entry(name="broken", title="t", group="g", triggers="      - flag: --x\n", support=None, extra=""):
    support = support if support is not None else '      "*": {status: supported, reason: "r"}\n'
    return (f"  {name}:\n    title: {title}\n    group: {group}\n    triggers:\n{triggers}"
            f"    support:\n{support}{extra}")


def test_the_shipped_table_loads():
    table = ft.load_table()
    assert len(table.entries) >= 30
    # every framework x device resolves for every entry
    for e in table.entries:
        assert set(e.cells) == {(fw, dev) for fw in ft.FRAMEWORKS for dev in ft.DEVICES}


def test_a_minimal_table_loads(tmp_path):
    table = ft.load_table(write(tmp_path, GOOD_ENTRY))
    assert table.get("demo").cell("mindspore", "Ascend").status == "fallback"


@pytest.mark.parametrize(
    "body, fragment",
    [
        pytest.param(entry(extra="    colour: red\n"), "the entry: unknown key(s) 'colour'", id="unknown-entry-key"),
        pytest.param(entry(triggers="      - {flag: --x, whenn: {gt: 1}}\n"), "a trigger: unknown key(s) 'whenn'", id="unknown-trigger-key"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r", hnit: "h"}\n'), "unknown key(s) 'hnit'", id="unknown-cell-key"),
        pytest.param(entry(support='      "*": {status: maybe, reason: "r", hint: "h"}\n'), "unknown status 'maybe'", id="unknown-status"),
        pytest.param(entry(support='      "*": {status: supported}\n'), "missing reason", id="missing-reason"),
        pytest.param(entry(support='      "*": {status: unsupported, reason: "r"}\n'), "missing hint", id="missing-hint"),
        pytest.param(entry(support='      "*": {status: fallback, reason: "r"}\n'), "missing hint", id="missing-hint-fallback"),
        pytest.param(entry(support='      pytorch/cpu: {status: supported, reason: "r"}\n'), "no support cell for pytorch/npu", id="incomplete-cells"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r"}\n      tensorflow/cpu: {status: supported, reason: "r"}\n'),
                     "unknown support key 'tensorflow/cpu'", id="unknown-framework"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r"}\n      pytorch/tpu: {status: supported, reason: "r"}\n'),
                     "unknown support key 'pytorch/tpu'", id="unknown-device"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r"}\n      mindspore/*: {status: supported, reason: "a"}\n'
                                   '      "*/cpu": {status: supported, reason: "b"}\n'), "both match mindspore/cpu", id="ambiguous-wildcards"),
        pytest.param(entry(triggers="      - {flag: --x, when: {above: 1}}\n"), "when must be one of", id="bad-when"),
        pytest.param(entry(triggers="      - {flag: --x, when: {gt: big}}\n"), "gt needs a number", id="bad-gt"),
        pytest.param(entry(triggers="      - {flag: --x, when: {matches: '('}}\n"), "matches needs a regular expression", id="bad-regex"),
        pytest.param(entry(triggers="      - {flag: --x, takes: 1}\n"), "needs a 'when' condition", id="value-without-when"),
        pytest.param(entry(triggers="      - {flag: --x, when: {set: true}, takes: 0}\n"), "must take a value", id="when-on-switch"),
        pytest.param(entry(triggers="      - {flag: --x, when: {set: true}, takes: 2}\n"), "takes must be 0, 1 or '+'", id="bad-takes"),
        pytest.param(entry(triggers="      - flag: -x\n"), "--lower-case-with-dashes", id="bad-flag"),
        pytest.param(entry(triggers="      - {flag: --x, when: {in: [a]}, off: b}\n"), "read as a boolean", id="yaml-off-key"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r", substitute: x}\n'), "substitute is only meaningful", id="substitute-not-fallback"),
        pytest.param(entry(support='      "*": {status: supported, reason: "r", min_version: 2.6}\n'), "min_version must be a quoted version", id="unquoted-version"),
        pytest.param(entry(support='      "*": {status: supported, reason: "two\\nlines"}\n'), "reason must be a one-line string", id="multiline-reason"),
        pytest.param(entry(title="''"), "title must be a one-line string", id="empty-title"),
        pytest.param("  broken:\n    title: t\n    triggers:\n      - flag: --x\n    support:\n      '*': {status: supported, reason: r}\n",
                     "missing key 'group'", id="missing-group"),
        pytest.param(entry(triggers="      - flag: --x\n", extra="    companions:\n      - {flag: --x}\n"), "companion --x is also a trigger", id="companion-is-trigger"),
    ],
)
def test_schema_errors_name_the_entry(tmp_path, body, fragment):
    with pytest.raises(ft.FeatureTableError) as info:
        ft.load_table(write(tmp_path, body))
    message = str(info.value)
    assert "entry 'broken'" in message, message
    assert fragment in message, message
    assert str(tmp_path) in message  # the file is named too
    assert "\n" not in message


def test_overlapping_values_across_entries_are_refused(tmp_path):
    body = (entry(name="first", triggers="      - {flag: --fmt, when: {in: [a, b]}}\n")
            + entry(name="broken", triggers="      - {flag: --fmt, when: {in: [b, c]}}\n"))
    with pytest.raises(ft.FeatureTableError, match=r"entry 'broken': --fmt b\|c overlaps entry 'first'"):
        ft.load_table(write(tmp_path, body))


def test_a_regex_that_catches_another_entrys_value_is_refused(tmp_path):
    body = (entry(name="first", triggers="      - {flag: --fmt, when: {in: [x]}}\n")
            + entry(name="broken", triggers="      - {flag: --fmt, when: {matches: '[a-z]+'}}\n"))
    with pytest.raises(ft.FeatureTableError, match="entry 'broken'.*overlaps entry 'first'"):
        ft.load_table(write(tmp_path, body))


def test_duplicate_entry_names_are_refused(tmp_path):
    with pytest.raises(ft.FeatureTableError, match="key .demo. appears twice"):
        ft.load_table(write(tmp_path, GOOD_ENTRY + GOOD_ENTRY))


def test_wrong_top_level_is_refused(tmp_path):
    path = tmp_path / "features.yaml"
    path.write_text("feature:\n  x: 1\n")
    with pytest.raises(ft.FeatureTableError, match="one top-level key 'features'.*Received: \\['feature'\\]"):
        ft.load_table(path)


def test_invalid_yaml_is_refused(tmp_path):
    path = tmp_path / "features.yaml"
    path.write_text("features: [unclosed\n")
    with pytest.raises(ft.FeatureTableError, match="not valid YAML"):
        ft.load_table(path)
