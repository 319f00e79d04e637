"""The analyser's rule table: load rules.yaml, validate every entry, index it for fast matching.

A bad table is a programming error that must surface at load time with the rule's code in the
message, not as a silently skipped rule at analysis time.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from mmrun.common.yaml_tables import TableError, check_keys, load_yaml

RULES_PATH = Path(__file__).with_name("rules.yaml")

KINDS = ("name", "import", "method", "string", "string-compare", "keyword-arg")
LEVELS = ("error", "warning", "info")
CONFIDENCES = ("certain", "possible")
TARGETS = ("npu", "mindspore")
FIX_KINDS = ("rename", "rename-method", "replace-string", "todo")
CODE_RE = re.compile(r"MM[1-6][0-9][0-9]")

_COMMON_REQUIRED = ("code", "title", "kind", "level", "targets", "message", "replacement", "reference")
_COMMON_OPTIONAL = ("confidence", "fix")
# Keys each kind accepts beyond the common ones; the first tuple is required.
_KIND_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "name": (("names",), ()),
    "import": (("names",), ()),
    "method": (("names", "call"), ()),
    "string": ((), ("names", "pattern")),
    "string-compare": ((), ("names", "pattern")),
    "keyword-arg": (("names", "keyword", "safe_values"), ()),
}
_FIX_KEYS = {
    "rename": ((), ("import",)),
    "rename-method": (("to",), ("import",)),
    "replace-string": (("old", "new"), ("import",)),
    "todo": (("comment",), ()),
}


class RuleError(TableError):
    """The rule table is malformed; the message names the rule and the offending key."""


@dataclass(frozen=True)
class Fix:
    kind: str
    to: str | None = None
    old: str | None = None
    new: str | None = None
    comment: str | None = None
    add_import: str | None = None

    @property
    def rewrites(self) -> bool:
        """True when applying the fix removes the finding (a TODO comment does not)."""
        return self.kind != "todo"


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    kind: str
    level: str
    targets: tuple[str, ...]
    message: str
    replacement: str
    reference: str
    confidence: str = "certain"
    names: tuple[str, ...] = ()
    renames: Mapping[str, str] = field(default_factory=dict)  # old qualified name -> new, for fix: rename
    pattern: str | None = None
    call: bool = True
    keyword: str | None = None
    safe_values: tuple[str, ...] = ()
    fix: Fix | None = None

    def format_message(self, name: str, key: str = "") -> str:
        """The message for a match of `name`; `key` is the table entry it matched (for {new})."""
        return self.message.format(name=name, new=self.renames.get(key or name, ""))

    def format_replacement(self, name: str, key: str = "") -> str:
        return self.replacement.format(name=name, new=self.renames.get(key or name, ""))


def _fail(where: str, what: str) -> RuleError:
    return RuleError(f"{where}: {what}")


def _check_keys(where: str, entry: Mapping, required: Iterable[str], optional: Iterable[str]) -> None:
    try:
        check_keys(where, entry, required, optional)
    except TableError as err:
        raise RuleError(str(err)) from None


def _str_list(where: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"'{key}' must be a non-empty list of strings, got {value!r}")
    return tuple(value)


def _parse_fix(where: str, raw: object) -> Fix:
    if not isinstance(raw, dict) or "kind" not in raw:
        raise _fail(where, f"'fix' must be a mapping with a 'kind' ({', '.join(FIX_KINDS)}), got {raw!r}")
    kind = raw["kind"]
    if kind not in FIX_KINDS:
        raise _fail(where, f"unknown fix kind {kind!r} (allowed: {', '.join(FIX_KINDS)})")
    required, optional = _FIX_KEYS[kind]
    _check_keys(f"{where} fix", raw, ("kind",) + required, optional)
    return Fix(kind=kind, to=raw.get("to"), old=raw.get("old"), new=raw.get("new"),
               comment=raw.get("comment"), add_import=raw.get("import"))


def parse_rule(raw: object, index: int) -> Rule:
    """Validate one table entry and build its Rule; RuleError names the rule on any problem."""
    if not isinstance(raw, dict):
        raise _fail(f"rules.yaml entry #{index + 1}", f"expected a mapping, got {raw!r}")
    code = raw.get("code")
    where = f"rules.yaml rule {code}" if isinstance(code, str) else f"rules.yaml entry #{index + 1}"
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"unknown kind {kind!r} (allowed: {', '.join(KINDS)})")
    required, optional = _KIND_KEYS[kind]
    _check_keys(where, raw, _COMMON_REQUIRED + required, _COMMON_OPTIONAL + optional)
    if not CODE_RE.fullmatch(code):
        raise _fail(where, "code must look like MM101 (MM1xx..MM6xx)")
    if raw["level"] not in LEVELS:
        raise _fail(where, f"unknown level {raw['level']!r} (allowed: {', '.join(LEVELS)})")
    confidence = raw.get("confidence", "certain")
    if confidence not in CONFIDENCES:
        raise _fail(where, f"unknown confidence {confidence!r} (allowed: {', '.join(CONFIDENCES)})")
    targets = _str_list(where, "targets", raw["targets"])
    bad_targets = [t for t in targets if t not in TARGETS]
    if bad_targets:
        raise _fail(where, f"unknown target(s) {', '.join(bad_targets)} (allowed: {', '.join(TARGETS)})")
    for key in ("title", "message", "replacement", "reference"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise _fail(where, f"'{key}' must be a non-empty string")

    names: tuple[str, ...] = ()
    renames: dict[str, str] = {}
    if "names" in raw:
        if isinstance(raw["names"], dict):
            renames = {str(k): str(v) for k, v in raw["names"].items()}
            names = _str_list(where, "names", list(renames))
        else:
            names = _str_list(where, "names", raw["names"])
    pattern = raw.get("pattern")
    if kind in ("string", "string-compare"):
        if (pattern is None) == (not names):
            raise _fail(where, "string rules need exactly one of 'names' or 'pattern'")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _fail(where, f"bad pattern {pattern!r}: {exc}") from None
            if not _literal_prefix(pattern):
                raise _fail(where, f"pattern {pattern!r} must start with a literal word (used by the pre-filter)")
    if kind in ("name", "keyword-arg"):
        for name in names:
            if name.endswith(".*") and name.count(".") < 2 or "*" in name[:-1]:
                raise _fail(where, f"name pattern {name!r} must look like 'package.module.*'")
    if kind == "method" and not isinstance(raw["call"], bool):
        raise _fail(where, f"'call' must be true or false, got {raw['call']!r}")
    safe_values = _str_list(where, "safe_values", raw["safe_values"]) if kind == "keyword-arg" else ()

    fix = _parse_fix(where, raw["fix"]) if "fix" in raw else None
    if fix is not None:
        allowed = {"name": ("rename", "todo"), "method": ("rename-method",),
                   "string": ("replace-string",), "string-compare": ("replace-string",)}.get(kind, ())
        if fix.kind not in allowed:
            raise _fail(where, f"fix kind {fix.kind!r} does not apply to kind {kind!r}")
        if fix.kind == "rename":
            if not renames:
                raise _fail(where, "fix 'rename' needs 'names' as a mapping old -> new")
            for old, new in renames.items():
                if len(old.split(".")) != len(new.split(".")):
                    raise _fail(where, f"rename {old} -> {new} must keep the number of dotted parts")
    elif renames:
        raise _fail(where, "'names' is a mapping but the rule has no 'rename' fix")
    return Rule(code=code, title=raw["title"], kind=kind, level=raw["level"], targets=targets,
                message=raw["message"], replacement=raw["replacement"], reference=raw["reference"],
                confidence=confidence, names=names, renames=renames, pattern=pattern,
                call=raw.get("call", True), keyword=raw.get("keyword"), safe_values=safe_values, fix=fix)


def _literal_prefix(pattern: str) -> str:
    """The word a string pattern's matches must start with ("cuda(:[0-9]*)?" -> "cuda")."""
    match = re.match(r"[A-Za-z0-9_]+", pattern)
    return match.group(0) if match else ""


def parse_rules(data: object) -> tuple[Rule, ...]:
    if not isinstance(data, dict) or set(data) != {"rules"} or not isinstance(data["rules"], list):
        raise RuleError("rules.yaml: expected one top-level key 'rules' holding a list")
    rules = tuple(parse_rule(raw, i) for i, raw in enumerate(data["rules"]))
    seen: set[str] = set()
    for rule in rules:
        if rule.code in seen:
            raise RuleError(f"rules.yaml rule {rule.code}: duplicate code")
        seen.add(rule.code)
    return rules


@functools.lru_cache(maxsize=4)
def load_rules(path: str | None = None) -> tuple[Rule, ...]:
    """All rules from the table (validated), in table order."""
    try:
        data = load_yaml(path or RULES_PATH)
    except TableError as err:
        raise RuleError(str(err)) from None
    return parse_rules(data)


def all_codes(rules: Iterable[Rule]) -> list[str]:
    return sorted(rule.code for rule in rules)


def expand_prefixes(prefixes: Iterable[str], rules: Iterable[Rule]) -> set[str]:
    """Codes matching any prefix ("MM1", "MM302", "ALL"); ValueError names a prefix matching none."""
    codes = all_codes(rules)
    chosen: set[str] = set()
    for prefix in prefixes:
        prefix = prefix.strip().upper()
        if not prefix:
            continue
        matched = codes if prefix == "ALL" else [c for c in codes if c.startswith(prefix)]
        if not matched:
            raise ValueError(f"code prefix {prefix!r} matches no rule (codes: {codes[0]}..{codes[-1]})")
        chosen.update(matched)
    return chosen


def select_rules(rules: Iterable[Rule], *, target: str = "both", select: Iterable[str] = (),
                 ignore: Iterable[str] = ()) -> tuple[Rule, ...]:
    """The rules that apply to `target` ("npu", "mindspore", "both"), filtered by code prefixes."""
    rules = tuple(rules)
    wanted_targets = TARGETS if target == "both" else (target,)
    chosen = expand_prefixes(select, rules) if list(select) else {r.code for r in rules}
    chosen -= expand_prefixes(ignore, rules)
    return tuple(r for r in rules
                 if r.code in chosen and any(t in wanted_targets for t in r.targets))


@dataclass
class RuleIndex:
    """Rules arranged for lookups during the walk: by exact name, by pattern prefix, by method.

    The tables hold every rule, so that which rule a name belongs to (the most specific entry)
    does not depend on the selection: with `--select MM102`, `torch.cuda.synchronize` is still
    MM101's and is not reported. `selected` says which codes are reported.
    """
    rules: tuple[Rule, ...]
    selected: frozenset[str]
    fixes_enabled: bool
    exact: dict[str, Rule] = field(default_factory=dict)        # qualified name -> rule (name kind)
    prefixes: dict[str, Rule] = field(default_factory=dict)     # "torch.cuda" -> rule for torch.cuda.*
    keyword_args: dict[str, Rule] = field(default_factory=dict)  # qualified name -> keyword-arg rule
    imports: dict[str, Rule] = field(default_factory=dict)      # module -> import rule
    methods_call: dict[str, Rule] = field(default_factory=dict)
    methods_attr: dict[str, Rule] = field(default_factory=dict)
    strings: list[tuple[Rule, re.Pattern[str]]] = field(default_factory=list)
    compares: list[tuple[Rule, re.Pattern[str]]] = field(default_factory=list)
    literals: tuple[str, ...] = ()                # substrings a matching string literal contains
    trigger_re: re.Pattern[bytes] | None = None   # pre-filter over the raw file

    def lookup_name(self, qualified: str) -> tuple[Rule, str] | None:
        """The rule for a qualified name and the table key that matched, or None.

        The longest match wins: `torch.cuda.amp.autocast.__init__` is MM104's `torch.cuda.amp.autocast`,
        not MM102's `torch.cuda.*`; an exact name beats a pattern of the same length.
        """
        rule = self.exact.get(qualified)
        if rule is not None:
            return rule, qualified
        parts = qualified.split(".")
        for cut in range(len(parts) - 1, 1, -1):
            key = ".".join(parts[:cut])
            rule = self.exact.get(key) or self.prefixes.get(key)
            if rule is not None:
                return rule, key
        return None

    def lookup_import(self, module: str) -> Rule | None:
        parts = module.split(".")
        for cut in range(len(parts), 0, -1):
            rule = self.imports.get(".".join(parts[:cut]))
            if rule is not None:
                return rule
        return None


def _string_regex(rule: Rule) -> re.Pattern[str]:
    if rule.pattern is not None:
        return re.compile(rule.pattern)
    return re.compile("|".join(re.escape(n) for n in rule.names))


def build_index(rules: Iterable[Rule], *, selected: Iterable[str] | None = None,
                fixes_enabled: bool = True) -> RuleIndex:
    """Index the rule table; report only `selected` codes (default: all).

    `trigger_re` matches a file only if some selected rule could fire in it.
    """
    rules = tuple(rules)
    chosen = frozenset(r.code for r in rules) if selected is None else frozenset(selected)
    index = RuleIndex(rules=rules, selected=chosen, fixes_enabled=fixes_enabled)
    words: set[str] = set()        # identifiers (need word boundaries)
    methods: set[str] = set()      # method names (follow a dot)
    literals: set[str] = set()     # string contents
    for rule in rules:
        live = rule.code in chosen
        if rule.kind in ("name", "keyword-arg"):
            target = index.keyword_args if rule.kind == "keyword-arg" else index.exact
            for name in rule.names:
                if name.endswith(".*"):
                    index.prefixes.setdefault(name[:-2], rule)
                    trigger = name[:-2].rsplit(".", 1)[-1]
                else:
                    target.setdefault(name, rule)
                    trigger = name.rsplit(".", 1)[-1]
                if live:
                    words.add(trigger)
        elif rule.kind == "import":
            for name in rule.names:
                index.imports.setdefault(name, rule)
                if live:
                    words.add(name.split(".")[0])
        elif rule.kind == "method":
            table = index.methods_call if rule.call else index.methods_attr
            for name in rule.names:
                table.setdefault(name, rule)
                if live:
                    methods.add(name)
        else:
            (index.strings if rule.kind == "string" else index.compares).append((rule, _string_regex(rule)))
            if live:
                literals.update(rule.names or (_literal_prefix(rule.pattern or ""),))
    index.literals = tuple(sorted(literals))
    # A rule can only fire where its trigger word is spelled out: a qualified name's last part
    # appears at the use or in the import that binds an alias, an import names its module, a
    # method follows a dot, a string contains its literal. (Star imports are not resolved, and a
    # literal spelled with escapes such as "\x63uda" is not matched, with or without the filter.)
    alternatives = [rb"\b" + re.escape(w.encode()) + rb"\b" for w in sorted(words)]
    alternatives += [rb"\.[\s\\]*" + re.escape(m.encode()) + rb"\b" for m in sorted(methods)]
    alternatives += [re.escape(s.encode()) for s in sorted(literals)]
    index.trigger_re = re.compile(b"|".join(alternatives)) if alternatives else None
    return index
