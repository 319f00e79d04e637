"""One verdict: what one layer of the table says about one flag as received, for one framework and device.

`decide` builds it (applying a cell's minimum framework version); `Decision.line` is the one-line
message every user-facing report prints, tagged with the layer it comes from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from mmrun.features.table import LAYER_TAGS, TRAINER, Cell, Feature, Source, Trigger, version_at_least


@dataclass(frozen=True)
class Decision:
    """What one layer says about one flag as received, for one framework and device."""

    layer: str
    feature: str
    title: str
    received: str  # the flag as received: "--tensor-model-parallel-size 2"
    flag: str
    dest: str
    value: Any
    framework: str
    device: str
    status: str
    reason: str
    hint: str | None
    off: Any
    substitute: Any = None
    has_substitute: bool = False
    sources: tuple[Source, ...] = ()
    span: tuple[int, int] | None = None  # check_flags only: [start, stop) in the token list
    companion_spans: tuple[tuple[int, int], ...] = ()
    value_known: bool = True  # False when a script passes a shell variable ($TP)

    @property
    def automatic(self) -> bool:
        """A substitution made without asking (a notice), whatever the policy."""
        return self.status == "fallback" and self.has_substitute

    def stops(self, policy: str) -> bool:
        """Whether a job with this flag stops under `policy` (error | warn)."""
        return self.status == "unsupported" or (self.status == "fallback" and not self.automatic and policy == "error")

    @property
    def replacement(self) -> Any:
        """The argument value the job runs with instead (substitute, else the 'off' value)."""
        return self.substitute if self.has_substitute else self.off

    def replacement_tokens(self) -> list[str]:
        """Tokens to put in place of `span` (empty: remove the flag)."""
        value = self.replacement
        if isinstance(value, bool) or value is None:
            return []
        return [self.flag, str(value)]

    def citation(self) -> str:
        """" Source: ..." (the cell's first source; docs/features.md lists them all), "" where there is none."""
        if not self.sources:
            return ""
        more = f" (and {len(self.sources) - 1} more in docs/features.md)" if len(self.sources) > 1 else ""
        return f" Source: {self.sources[0].cite()}{more}."

    def line(self, policy: str = "error") -> str:
        """The one-line message: layer, flag as received, feature, framework and device, reason, hint, source."""
        subject, where, cite = self._subject(), self._where(), self.citation()
        if self.status == "supported":
            return f"{subject} is supported {where}: {self.reason}.{cite}"
        if self.status == "unknown":
            return f"{subject} is not known to work {where}: {self.reason}."
        if self.automatic:
            using = " ".join(self.replacement_tokens()) or f"{self.flag} off"
            return f"{subject} is not available {where}; using {using} instead: {self.reason}.{cite}"
        if self.status == "fallback" and policy == "warn":
            return f"{subject} is not supported {where}; running with it off: {self.reason}.{self._hint()}{cite}"
        advice = " To run with it off, pass --on-unsupported warn." if self.status == "fallback" else ""
        return self.summary(advice)

    def summary(self, advice: str = "") -> str:
        """"<flag> is not supported ...: reason. Hint: ...." with `advice` before the source (no policy words)."""
        return f"{self._subject()} is not supported {self._where()}: {self.reason}.{self._hint()}{advice}{self.citation()}"

    def _subject(self) -> str:
        return f"{LAYER_TAGS[self.layer]} {self.received} ({self.title})"

    def _where(self) -> str:
        return f"with the {self.framework} backend on {self.device}"

    def _hint(self) -> str:
        return f" Hint: {self.hint}." if self.hint else ""

def decide(layer: str, cell: Cell, feature: Feature, trig: Trigger, received: str, value: Any, framework: str,
           device: str, framework_version: str | None, **extra: Any) -> Decision:
    """The decision of one layer's cell for a flag as received; an older framework than the cell needs is unsupported."""
    status, reason, hint = cell.status, cell.reason, cell.hint
    if cell.min_version and framework_version and not version_at_least(framework_version, cell.min_version):
        status = "unsupported"
        reason = f"needs {framework} >= {cell.min_version}, found {framework_version} ({cell.reason})"
        hint = f"upgrade {framework} to {cell.min_version} or newer, or drop {trig.flag}"
    has_sub = cell.has_substitute and status == "fallback"
    return Decision(layer=layer, feature=feature.name, title=feature.title, received=received, flag=trig.flag,
                    dest=trig.dest, value=value, framework=framework, device=device, status=status, reason=reason,
                    hint=hint, off=trig.off, substitute=cell.substitute if has_sub else None, has_substitute=has_sub,
                    sources=cell.sources, **extra)


def judged_for_entry(decisions: list[Decision], entry_features: Sequence[str]) -> list[Decision]:
    """The decisions that stand for an entry implementing `entry_features` itself (models/pretrain_vlm.py's LoRA):
    the trainer layer, which speaks for the training code the entries share, is not asked about those."""
    return [d for d in decisions if not (d.layer == TRAINER and d.feature in entry_features)]
