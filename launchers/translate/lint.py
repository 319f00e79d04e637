"""What silently breaks launch scripts, found from the parse tree and reported with line numbers.

Codes (the messages say what to do):
  MT001  backslash followed by spaces before the newline: the continuation breaks, or inside a quoted
         option string a literal `\\` becomes an argument
  MT002  an array expanded as `$ARR`: only its first element
  MT003  `--distributed-backend X` the target framework/device does not use (from the feature gate)
  MT004  a variable used in the launch line that the script never sets
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mmrun.launchers.translate.parse import Node, Script
from mmrun.launchers.translate.words import Definitions

_BROKEN_CONTINUATION = re.compile(rb"(?<!\\)(?:\\\\)*\\([ \t\r]+)$", re.M)
# Variables a launch line may use without setting them: the shell's and the login environment's.
ENVIRONMENT = frozenset({
    "HOME", "PATH", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL", "HOSTNAME", "HOSTTYPE", "RANDOM", "LINENO",
    "SECONDS", "BASH_SOURCE", "BASH_VERSION", "BASHPID", "UID", "EUID", "PPID", "IFS", "TMPDIR", "LANG",
    "FUNCNAME", "PIPESTATUS", "OSTYPE", "PYTHONPATH", "LD_LIBRARY_PATH",
})
_DEFAULTING_OPERATORS = (":-", "-", ":=", "=", ":+", "+", ":?", "?")


@dataclass(frozen=True)
class Finding:
    line: int
    column: int
    code: str
    message: str

    def as_dict(self) -> dict:
        return {"line": self.line, "column": self.column, "code": self.code, "message": self.message}


def broken_continuations(script: Script) -> list[Finding]:
    """MT001: `\\` then spaces (or a carriage return) before the newline."""
    findings = []
    for match in _BROKEN_CONTINUATION.finditer(script.source):
        backslash = match.start(1) - 1
        inside = _enclosing(script, backslash)
        if inside in ("comment", "heredoc_body"):
            continue
        line = script.line_of(backslash)
        trailing = "a carriage return (CRLF line ending)" if b"\r" in match.group(1) else f"{len(match.group(1))} space(s)"
        if inside in ("string", "raw_string"):
            effect = "inside this quoted string the backslash is no continuation: a literal `\\` becomes an argument where the variable is expanded"
        else:
            effect = f"the line continuation breaks: line {line + 1} runs as a separate command"
        findings.append(Finding(line, script.column_of(backslash), "MT001",
                                f"backslash followed by {trailing} before the newline; {effect}. Delete what follows the backslash"))
    return findings


def array_as_scalar(script: Script, defs: Definitions) -> list[Finding]:
    """MT002: `$ARR` / `${ARR}` of an array-valued variable."""
    findings = []
    for node in script.walk():
        if node.type not in ("simple_expansion", "expansion"):
            continue
        named = node.named_children
        if len(named) != 1 or named[0].type != "variable_name":
            continue
        name = script.node_text(named[0])
        text = script.node_text(node).strip()
        if text not in ("$" + name, "${" + name + "}") or not defs.is_array(name):
            continue
        start = node.start_byte + (len(script.node_text(node)) - len(script.node_text(node).lstrip()))
        findings.append(Finding(script.line_of(start), script.column_of(start), "MT002",
                                f"{text} expands only the first element of the array {name}; write \"${{{name}[@]}}\""))
    return findings


def unset_variables(script: Script, defs: Definitions, nodes: list[Node]) -> list[Finding]:
    """MT004: variables the launch uses (directly or through the definitions it expands) but never sets."""
    findings, reported = [], set()
    for root in nodes:
        for node in script.walk(root):
            if node.type not in ("simple_expansion", "expansion"):
                continue
            name_node = next((c for c in node.named_children if c.type == "variable_name"), None)
            if name_node is None:
                subscript = next((c for c in node.named_children if c.type == "subscript"), None)
                name_node = subscript.child_by_field_name("name") if subscript is not None else None
            if name_node is None:
                continue
            name = script.node_text(name_node)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in ENVIRONMENT or defs.is_set(name):
                continue
            if node.type == "expansion" and any(c.type in _DEFAULTING_OPERATORS for c in node.children):
                continue  # ${X:-default}
            if name in reported:
                continue
            reported.add(name)
            start = name_node.start_byte
            findings.append(Finding(script.line_of(start), script.column_of(start), "MT004",
                                    f"${name} is used by the launch line but never set in the script: it comes from the environment "
                                    f"or expands to nothing; set it in the script or give it a default (${{{name}:-...}})"))
    return findings


def _enclosing(script: Script, offset: int) -> str | None:
    """The innermost comment, heredoc or string holding the byte at `offset`, walking down from the root."""
    found = None
    cursor = script.root.walk()
    while True:
        if cursor.node.type in ("comment", "heredoc_body", "string", "raw_string"):
            found = cursor.node.type
        if cursor.goto_first_child_for_byte(offset) is None or cursor.node.start_byte > offset:
            return found
