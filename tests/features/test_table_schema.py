"""The three table files are validated on load: every schema mistake is one line that names the file and the entry."""
from __future__ import annotations

import pytest

from mmrun import features as ft
from mmrun.features.loader import CATALOGUE_PATH, LAYER_PATHS

CATALOGUE = """\
features:
  demo:
    title: a demo feature
    group: Demo
    triggers:
      - flag: --demo
"""
STACK = """\
sources:
  doc:
    title: "a document"
    url: https://example.org/doc
features:
  demo:
    "*": {status: supported, reason: "r", source: doc}
"""
TRAINER = """\
features:
  demo:
    "*": {status: fallback, reason: "not implemented", hint: "drop --demo"}
"""


def load(tmp_path, catalogue: str = CATALOGUE, stack: str = STACK, trainer: str = TRAINER) -> ft.Tables:
    paths = {}
    for name, text in (("catalogue", catalogue), ("stack", stack), ("trainer", trainer)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text, encoding="utf-8")
    return ft.load_tables(**paths)


def entry(name="broken", title="t", group="g", triggers="      - flag: --x\n", extra=""):
    return f"  {name}:\n    title: {title}\n    group: {group}\n    triggers:\n{triggers}{extra}"


def expect_error(tmp_path, fragment: str, file: str, **texts) -> str:
    with pytest.raises(ft.FeatureTableError) as info:
        load(tmp_path, **texts)
    message = str(info.value)
    assert fragment in message, message
    assert str(tmp_path / f"{file}.yaml") in message, message  # the file is named
    assert "\n" not in message
    return message


def test_the_shipped_tables_load_and_every_cell_resolves():
    tables = ft.load_tables()
    assert len(tables.features) >= 35
    assert {p.name for p in LAYER_PATHS.values()} == {"stack.yaml", "trainer.yaml"} and CATALOGUE_PATH.exists()
    for layer in tables.layers.values():
        for cells in layer.cells.values():
            assert set(cells) == {(fw, dev) for fw in ft.FRAMEWORKS for dev in ft.DEVICES}


def test_a_minimal_table_loads(tmp_path):
    tables = load(tmp_path)
    assert tables.layer("trainer").cell("demo", "mindspore", "Ascend").status == "fallback"
    assert tables.layer("stack").cell("demo", "pytorch", "cpu").sources[0].url == "https://example.org/doc"


@pytest.mark.parametrize(
    "body, fragment",
    [
        pytest.param(entry(extra="    colour: red\n"), "the entry: unknown key(s) 'colour'", id="unknown-entry-key"),
        pytest.param(entry(triggers="      - {flag: --x, whenn: {gt: 1}}\n"), "a trigger: unknown key(s) 'whenn'", id="unknown-trigger-key"),
        pytest.param(entry(triggers="      - {flag: --x, when: {above: 1}}\n"), "when must be one of", id="bad-when"),
        pytest.param(entry(triggers="      - {flag: --x, when: {gt: big}}\n"), "gt needs a number", id="bad-gt"),
        pytest.param(entry(triggers="      - {flag: --x, when: {matches: '('}}\n"), "matches needs a regular expression", id="bad-regex"),
        pytest.param(entry(triggers="      - {flag: --x, takes: 1}\n"), "needs a 'when' condition", id="value-without-when"),
        pytest.param(entry(triggers="      - {flag: --x, when: {set: true}, takes: 0}\n"), "must take a value", id="when-on-switch"),
        pytest.param(entry(triggers="      - {flag: --x, when: {set: true}, takes: 2}\n"), "takes must be 0, 1 or '+'", id="bad-takes"),
        pytest.param(entry(triggers="      - flag: -x\n"), "--lower-case-with-dashes", id="bad-flag"),
        pytest.param(entry(triggers="      - {flag: --x, when: {in: [a]}, off: b}\n"), "read as a boolean", id="yaml-off-key"),
        pytest.param(entry(title="''"), "title must be a one-line string", id="empty-title"),
        pytest.param("  broken:\n    title: t\n    triggers:\n      - flag: --x\n", "missing key 'group'", id="missing-group"),
        pytest.param(entry(extra="    companions:\n      - {flag: --x}\n"), "companion --x is also a trigger", id="companion-is-trigger"),
    ],
)
def test_catalogue_errors_name_the_entry(tmp_path, body, fragment):
    message = expect_error(tmp_path, fragment, "catalogue", catalogue=CATALOGUE + body)
    assert "entry 'broken'" in message


def cells(body: str) -> str:
    return f"features:\n  demo:\n{body}"


@pytest.mark.parametrize(
    "body, fragment",
    [
        pytest.param('    "*": {status: supported, reason: "r", hnit: "h"}\n', "unknown key(s) 'hnit'", id="unknown-cell-key"),
        pytest.param('    "*": {status: maybe, reason: "r", hint: "h"}\n', "unknown status 'maybe'", id="unknown-status"),
        pytest.param('    "*": {status: unknown, reason: "r"}\n', "unknown status 'unknown' (allowed: supported, fallback, unsupported)",
                     id="trainer-cannot-be-unknown"),
        pytest.param('    "*": {status: supported}\n', "missing reason", id="missing-reason"),
        pytest.param('    "*": {status: unsupported, reason: "r"}\n', "missing hint", id="missing-hint"),
        pytest.param('    "*": {status: fallback, reason: "r"}\n', "missing hint", id="missing-hint-fallback"),
        pytest.param('    pytorch/cpu: {status: supported, reason: "r"}\n', "no support cell for pytorch/npu", id="incomplete-cells"),
        pytest.param('    "*": {status: supported, reason: "r"}\n    tensorflow/cpu: {status: supported, reason: "r"}\n',
                     "unknown support key 'tensorflow/cpu'", id="unknown-framework"),
        pytest.param('    "*": {status: supported, reason: "r"}\n    pytorch/tpu: {status: supported, reason: "r"}\n',
                     "unknown support key 'pytorch/tpu'", id="unknown-device"),
        pytest.param('    "*": {status: supported, reason: "r"}\n    mindspore/*: {status: supported, reason: "a"}\n'
                     '    "*/cpu": {status: supported, reason: "b"}\n', "both match mindspore/cpu", id="ambiguous-wildcards"),
        pytest.param('    "*": {status: supported, reason: "r", substitute: x}\n', "substitute is only meaningful", id="substitute-not-fallback"),
        pytest.param('    "*": {status: supported, reason: "r", min_version: 2.6}\n', "min_version must be a quoted version", id="unquoted-version"),
        pytest.param('    "*": {status: supported, reason: "two\\nlines"}\n', "reason must be a one-line string", id="multiline-reason"),
        pytest.param('    "*": {status: supported, reason: "r", source: doc}\n', "unknown key(s) 'source'", id="trainer-has-no-sources"),
    ],
)
def test_trainer_cell_errors_name_the_entry(tmp_path, body, fragment):
    message = expect_error(tmp_path, fragment, "trainer", trainer=cells(body))
    assert "entry 'demo'" in message


SOURCES = 'sources:\n  doc:\n    title: "a document"\n    url: https://example.org/doc\n'


@pytest.mark.parametrize(
    "stack, fragment",
    [
        pytest.param(SOURCES + cells('    "*": {status: supported, reason: "r"}\n'), "missing source (every supported verdict of the stack cites one",
                     id="verdict-without-source"),
        pytest.param(SOURCES + cells('    "*": {status: fallback, reason: "r", hint: "h", source: nowhere}\n'),
                     "source 'nowhere' is not defined under sources", id="undefined-source"),
        pytest.param('sources:\n  doc:\n    title: "a document"\n' + cells('    "*": {status: unknown, reason: "r"}\n'),
                     "give a public url, or for a measurement the check that re-runs it", id="source-without-url"),
        pytest.param('sources:\n  doc:\n    title: "a document"\n    url: http://example.org\n' + cells('    "*": {status: unknown, reason: "r"}\n'),
                     "url must be an https:// address", id="plain-http"),
        pytest.param('sources:\n  doc:\n    title: "measured"\n    check: ../run.sh\n' + cells('    "*": {status: unknown, reason: "r"}\n'),
                     "check must name a test file (tests/....py)", id="check-not-a-test"),
        pytest.param(cells('    "*": {status: unknown, reason: "r"}\n'), "missing required key(s) sources", id="no-sources"),
        pytest.param(SOURCES + "features:\n  nosuch:\n    '*': {status: unknown, reason: r}\n", "not in the feature catalogue",
                     id="feature-not-in-catalogue"),
        pytest.param(SOURCES + "columns:\n  pytorch/npu: a stack\n" + cells('    "*": {status: unknown, reason: "r"}\n'),
                     "describe every framework/device; missing", id="incomplete-columns"),
    ],
)
def test_stack_errors_name_the_entry_or_source(tmp_path, stack, fragment):
    expect_error(tmp_path, fragment, "stack", stack=stack)


def test_unknown_needs_no_source_in_the_stack(tmp_path):
    tables = load(tmp_path, stack=SOURCES + cells('    "*": {status: unknown, reason: "no public statement"}\n'))
    assert tables.layer("stack").cell("demo", "mindspore", "cpu").status == "unknown"


def test_a_feature_no_layer_lists_is_refused(tmp_path):
    message = expect_error(tmp_path, "no layer lists it", "catalogue", catalogue=CATALOGUE + entry(name="orphan"))
    assert "entry 'orphan'" in message


def test_overlapping_values_across_entries_are_refused(tmp_path):
    body = (entry(name="first", triggers="      - {flag: --fmt, when: {in: [a, b]}}\n")
            + entry(name="broken", triggers="      - {flag: --fmt, when: {in: [b, c]}}\n"))
    expect_error(tmp_path, "entry 'broken': --fmt b|c overlaps entry 'first'", "catalogue", catalogue=CATALOGUE + body)


def test_a_regex_that_catches_another_entrys_value_is_refused(tmp_path):
    body = (entry(name="first", triggers="      - {flag: --fmt, when: {in: [x]}}\n")
            + entry(name="broken", triggers="      - {flag: --fmt, when: {matches: '[a-z]+'}}\n"))
    expect_error(tmp_path, "overlaps entry 'first'", "catalogue", catalogue=CATALOGUE + body)


def test_duplicate_entry_names_are_refused(tmp_path):
    expect_error(tmp_path, "key 'demo' appears twice", "trainer", trainer=TRAINER + TRAINER[len("features:\n"):])


def test_wrong_top_level_is_refused(tmp_path):
    expect_error(tmp_path, "one top-level key 'features'", "catalogue", catalogue="feature:\n  x: 1\n")
    expect_error(tmp_path, "unknown key(s) 'feature'", "trainer", trainer="feature:\n  x: 1\n")


def test_invalid_yaml_is_refused(tmp_path):
    expect_error(tmp_path, "not valid YAML", "stack", stack="features: [unclosed\n")
