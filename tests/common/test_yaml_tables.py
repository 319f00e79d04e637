"""The one YAML loader of mmrun's tables."""
from __future__ import annotations

import pytest

from mmrun.common.yaml_tables import TableError, check_keys, load_yaml, parse_yaml


def test_duplicate_keys_are_refused_with_the_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(TableError, match=r"t\.yaml: line 3: key 'a' appears twice"):
        load_yaml(path)


def test_broken_yaml_and_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(TableError, match="x.yaml: not valid YAML"):
        parse_yaml("a: [1, 2\n", "x.yaml")
    with pytest.raises(TableError, match="missing.yaml: cannot read the table"):
        load_yaml(tmp_path / "missing.yaml")


def test_no_python_objects_from_a_table():
    with pytest.raises(TableError):
        parse_yaml("!!python/object/apply:os.system ['true']", "evil.yaml")


def test_check_keys_names_what_is_wrong():
    check_keys("entry", {"a": 1, "b": 2}, required=("a",), optional=("b",))
    with pytest.raises(TableError, match=r"entry: unknown key\(s\) 'c' \(allowed: a, b\)"):
        check_keys("entry", {"a": 1, "c": 2}, required=("a",), optional=("b",))
    with pytest.raises(TableError, match=r"entry: missing required key\(s\) a"):
        check_keys("entry", {"b": 1}, required=("a",), optional=("b",))
    with pytest.raises(TableError, match="read as a boolean"):
        check_keys("entry", {True: 1}, optional=("on",))
    with pytest.raises(TableError, match="must be a mapping"):
        check_keys("entry", [1], optional=("a",))
