"""Option arithmetic for scripts: values stay shell expressions, evaluated when the script runs.

`--worker_num` is `--nproc_per_node` x `--nnodes`. In a script both are usually variables, so the
product is written as `$(($GPUS_PER_NODE*$NNODES))`, or as a variable the script already defines
to exactly that product (`WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))`, the form of MindSpeed-MM's MindSpore backend migration guide). The
way back divides, and recognises those products so that `--nnodes $NNODES` comes back as written.
"""
from __future__ import annotations

import re
from dataclasses import replace

from mmrun.launchers.options import BY_LAUNCHER, MSRUN
from mmrun.launchers.option_rules import Translation, Values
from mmrun.launchers.translate.parse import Script
from mmrun.launchers.translate.words import Definitions

_INT = re.compile(r"-?\d+")
_ARITH = re.compile(r"\$\(\((.*)\)\)", re.S)
_PRODUCT = re.compile(r"\s*([^*/()\s]+)\s*\*\s*([^*/()\s]+)\s*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SIMPLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# Names a product variable is most likely to carry, preferred when several fit.
PREFERRED_PRODUCT_NAMES = ("WORLD_SIZE", "WORKER_NUM", "TOTAL_WORKERS")


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"' and '"' not in text[1:-1]:
        return text[1:-1]
    return text


def normalise_operand(text: str) -> str:
    """`"${N}"`, `${N}`, `N` (inside arithmetic) and `$N` all name one operand: `$N`."""
    text = _unquote(text)
    text = _BRACED.sub(lambda m: "$" + m.group(1), text)
    return "$" + text if _NAME.fullmatch(text) else text


def _render_factor(text: str) -> str:
    """A factor read from inside `$(( ))` as it must be written outside: `NNODES` -> `$NNODES`."""
    text = text.strip()
    return "$" + text if _NAME.fullmatch(text) else text


def _operand(text: str) -> str:
    """An operand as written inside `$(( ))`: bare names (shellcheck SC2004), nested arithmetic in parentheses."""
    text = _unquote(text)
    inner = _ARITH.fullmatch(text)
    if inner:
        return f"({inner.group(1)})"
    simple = _SIMPLE.fullmatch(text) or _BRACED.fullmatch(text)
    return simple.group(1) if simple else text


def _is_int(text: str) -> bool:
    return bool(_INT.fullmatch(text.strip()))


def has_top_level_colon(text: str) -> bool:
    """A `:` outside every `${...}`, `$(...)`, `$((...))` and backquote: `1:4` or `$MIN:$MAX`, not `${NNODES:-1}`."""
    depth, index, backquoted = 0, 0, False
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "$" and text[index + 1:index + 2] in ("{", "("):
            depth += 1
            index += 2
            continue
        if char == "`":
            backquoted = not backquoted
        elif depth and char == "(":
            depth += 1
        elif depth and char in "})":
            depth -= 1
        elif char == ":" and not depth and not backquoted:
            return True
        index += 1
    return False


class ProductIndex:
    """The variables a script defines as a product of two operands (`WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))`), by
    their factors: found once per script, so that each launch line looks up its product in constant time."""

    def __init__(self, script: Script, definitions: Definitions):
        self.by_factors: dict[tuple[str, ...], list[str]] = {}
        for name, found in definitions.by_name.items():
            if len(found) != 1 or found[0].append or found[0].value is None or found[0].value.type != "arithmetic_expansion":
                continue
            arith = _ARITH.fullmatch(script.node_text(found[0].value))
            product = _PRODUCT.fullmatch(arith.group(1)) if arith else None
            if product is not None:
                key = tuple(sorted(normalise_operand(f) for f in product.groups()))
                self.by_factors.setdefault(key, []).append(name)


class ScriptValues(Values):
    """Values for a script: products and quotients as shell arithmetic, reusing the script's own variables.

    A value whose `:` sits inside an expansion (`--nnodes ${NNODES:-1}`) is `shield`ed: the shared translation
    sees a token without `:` (it would read `MIN:MAX`, an elastic range), and `unshield` puts the text back.
    """

    def __init__(self, script: Script, definitions: Definitions, position: int, products: ProductIndex | None = None):
        self.script = script
        self.defs = definitions
        self.position = position  # where the computed value will be evaluated
        self.products = products if products is not None else ProductIndex(script, definitions)
        self._shielded: dict[str, str] = {}

    def shield(self, value: str | bool) -> str | bool:
        if not isinstance(value, str) or ":" not in value or has_top_level_colon(value):
            return value
        token = f"\0value{len(self._shielded)}\0"  # no script holds a NUL byte
        self._shielded[token] = value
        return token

    def unshield(self, value):
        if isinstance(value, str) and "\0" in value:
            for token, text in self._shielded.items():
                value = value.replace(token, text)
        return value

    def unshield_translation(self, translation: Translation) -> Translation:
        """The translation with every shielded value (in options, exports, notes and refusals) written out again."""
        if not self._shielded:
            return translation
        put_back = self.unshield
        return replace(
            translation,
            options=[(option, put_back(value)) for option, value in translation.options],
            env={name: put_back(value) for name, value in translation.env.items()},
            notes=[replace(note, value=put_back(note.value), message=put_back(note.message)) for note in translation.notes],
            refusals=[replace(refusal, value=put_back(refusal.value), reason=put_back(refusal.reason), hint=put_back(refusal.hint))
                      for refusal in translation.refusals],
        )

    def product(self, a: str, b: str) -> str:
        a, b = self.unshield(a), self.unshield(b)
        if (_is_int(a) and _is_int(b)) or (_is_int(b) and int(b) == 1):
            return super().product(a, b)
        if _is_int(a) and int(a) == 1:
            return b
        variable = self._product_variable(a, b)
        if variable is not None:
            return "$" + variable
        return f"$(({_operand(a)}*{_operand(b)}))"

    def quotient(self, a: str, b: str, what: str) -> str:
        a, b = self.unshield(a), self.unshield(b)
        if (_is_int(a) and _is_int(b)) or (_is_int(b) and int(b) == 1):
            return super().quotient(a, b, what)
        if normalise_operand(a) == normalise_operand(b):
            return "1"
        factors = self._factors(a)
        if factors is not None:
            left, right = factors
            if normalise_operand(b) == normalise_operand(left):
                return _render_factor(right)
            if normalise_operand(b) == normalise_operand(right):
                return _render_factor(left)
        return f"$(({_operand(a)}/{_operand(b)}))"

    def standalone_port(self) -> str:
        # A script cannot pick a free port when it is translated; msrun's own default port is the
        # single-node choice msrun users already know.
        return str(BY_LAUNCHER[MSRUN]["master_port"].default)

    # ------------------------------------------------------------------ helpers

    def _single_definition(self, name: str):
        definitions = self.defs.get(name)
        if len(definitions) != 1:
            return None
        definition = definitions[0]
        if definition.append or not definition.unconditional or definition.node.end_byte > self.position:
            return None
        return definition

    def _factors(self, text: str) -> tuple[str, str] | None:
        """(X, Y) when text is `$((X*Y))`, or a variable defined once as that."""
        text = _unquote(text)
        arith = _ARITH.fullmatch(text)
        if arith is None:
            name = normalise_operand(text)[1:] if normalise_operand(text).startswith("$") else ""
            definition = self._single_definition(name) if _NAME.fullmatch(name) else None
            if definition is None or definition.value is None or definition.value.type != "arithmetic_expansion":
                return None
            arith = _ARITH.fullmatch(self.script.node_text(definition.value))
            if arith is None:
                return None
        product = _PRODUCT.fullmatch(arith.group(1))
        return (product.group(1), product.group(2)) if product else None

    def _product_variable(self, a: str, b: str) -> str | None:
        wanted = tuple(sorted([normalise_operand(a), normalise_operand(b)]))
        candidates = []
        for name in self.products.by_factors.get(wanted, []):
            definition = self._single_definition(name)
            if definition is None:
                continue
            factors = self._factors("$" + name)
            if factors is None:
                continue
            # The factors must not change between the product's definition and its use.
            later = [d for f in factors for d in self.defs.get(normalise_operand(f).lstrip("$"))
                     if definition.node.end_byte <= d.node.start_byte < self.position]
            if not later:
                candidates.append(name)
        if not candidates:
            return None
        return min(candidates, key=lambda n: (n not in PREFERRED_PRODUCT_NAMES, n))
