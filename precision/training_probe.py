"""What the training loop calls around each step for --dump-config and --anomaly-detection.

    probe = TrainingProbe.create(args, framework, rank, model, log)   # None when neither is asked for
    probe.before_step(iteration)            # attaches module hooks for this step where wanted
    probe.after_step(iteration, loss, grad_norm)   # writes the dump, judges the step; raises AnomalyStop

The hooks come from mmrun.backend.<framework>.probe and see every named submodule of any model built on
mmrun's `nn.Module` (and torch modules under megatron-core), so module names are the model's attribute
paths, identical on PyTorch and MindSpore. Nothing is attached on steps that dump nothing while anomaly
detection is off: the cost of the options when off is one `if` per step.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from mmrun.precision import anomaly, dump_files
from mmrun.precision.dump_config import DumpConfig, load_dump_config


class AnomalyStop(RuntimeError):
    """--anomaly-detection stop found a NaN/Inf or a spike: the message names the step and the module."""


def _flatten(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [item for v in value for item in _flatten(v)]
    return [value]


class _Recorder:
    """Collects one step's records in execution order (the dump), with per-module call counts."""

    def __init__(self, probe: Any, config: DumpConfig) -> None:
        self.probe, self.config = probe, config
        self.records: dict[str, dict] = {}
        self.tensors: dict = {}
        self.calls: dict[tuple[str, str], int] = {}

    def _name(self, path: str, cls: str, direction: str) -> str:
        call = self.calls.get((path, direction), 0)
        self.calls[(path, direction)] = call + 1
        return dump_files.record_name(path, cls, direction, call)

    def _entries(self, name: str, role: str, values: Any) -> list:
        out = []
        for index, value in enumerate(_flatten(values)):
            entry = self.probe.summary(value)
            if entry is None:
                scalar = value if isinstance(value, (int, float, bool, str)) or value is None else None
                out.append({"type": type(value).__name__, "value": scalar})
                continue
            if self.config.task == "tensor":
                entry["data_name"] = f"{name}.{role}.{index}"
                self.tensors[entry["data_name"]] = self.probe.to_numpy(value)
            out.append(entry)
        return out

    def _wanted(self, name: str) -> bool:
        return not self.config.names or any(n in name for n in self.config.names)

    def forward(self, path: str, cls: str, inputs: tuple, output: Any) -> None:
        name = self._name(path, cls, "forward")
        if self._wanted(name):
            self.records[name] = {"input_args": self._entries(name, "input", inputs), "input_kwargs": {},
                                  "output": self._entries(name, "output", output)}

    def backward(self, path: str, cls: str, grad_outputs: tuple, grad_inputs: tuple) -> None:
        name = self._name(path, cls, "backward")
        if self._wanted(name):
            self.records[name] = {"input": self._entries(name, "input", grad_outputs),
                                  "output": self._entries(name, "output", grad_inputs)}

    def scoped(self) -> dict[str, dict]:
        """msprobe's `scope`: the records from the first matching scope[0] to the first matching scope[1]."""
        if not self.config.scope:
            return self.records
        names = list(self.records)
        start = next((i for i, n in enumerate(names) if self.config.scope[0] in n), len(names))
        end = next((i for i, n in enumerate(names) if i >= start and self.config.scope[1] in n), len(names) - 1)
        return {n: self.records[n] for n in names[start:end + 1]}


class _Checker:
    """Anomaly hooks: the first module whose forward output or backward gradients hold NaN/Inf or spike."""

    def __init__(self, probe: Any, history: anomaly.History) -> None:
        self.probe, self.history = probe, history
        self.iteration = 0
        self.findings: list[anomaly.Finding] = []
        self.calls: dict[tuple[str, str], int] = {}

    def _check(self, path: str, cls: str, direction: str, role: str, values: Any) -> None:
        call = self.calls.get((path, direction), 0)
        self.calls[(path, direction)] = call + 1
        if self.findings:
            return  # the first module is named; the rest of the step is not read back
        norms = []
        for index, value in enumerate(_flatten(values)):
            entry = self.probe.summary(value)
            if entry is not None and entry["Norm"] is not None:
                norms.append((index, entry["Norm"], entry))
        for index, norm, entry in norms:
            if not math.isfinite(norm) or not all(math.isfinite(entry[k]) for k in ("Max", "Min")):
                bad = next(v for v in (entry["Max"], entry["Min"], norm) if not math.isfinite(v))
                self.findings.append(anomaly.Finding(
                    self.iteration, f"module {path} ({direction})", bad, "non-finite",
                    f" in {dump_files.record_name(path, cls, direction, call)} {role}.{index}"))
                return
        if direction == "backward" and norms:
            total = math.sqrt(sum(n * n for _, n, _ in norms))
            found = self.history.check(self.iteration, f"module {path} (backward)", total,
                                       " (L2 norm of the gradients it passes back)")
            if found:
                self.findings.append(found)

    def forward(self, path: str, cls: str, inputs: tuple, output: Any) -> None:
        self._check(path, cls, "forward", "output", output)

    def backward(self, path: str, cls: str, grad_outputs: tuple, grad_inputs: tuple) -> None:
        self._check(path, cls, "backward", "output", grad_inputs)


class TrainingProbe:
    def __init__(self, framework: str, rank: int, model: Any, log: Callable[[str], None],
                 dump: DumpConfig | None, level: str, rule: anomaly.SpikeRule) -> None:
        from mmrun import backend

        self.framework, self.rank, self.model, self.log = framework, rank, model, log
        self.dump, self.level = dump, level
        self.probe = backend.probe
        self.history = anomaly.History(rule)
        self._recorder: _Recorder | None = None
        self._checker: _Checker | None = None
        self._remove: list[Callable[[], None]] = []
        if level != "off":
            self._checker = _Checker(self.probe, self.history)
            self._remove.append(self.probe.attach(model, self._checker.forward, self._checker.backward))

    @classmethod
    def create(cls, args: Any, framework: str, rank: int, model: Any,
               log: Callable[[str], None]) -> "TrainingProbe | None":
        path = getattr(args, "dump_config", None)
        level = getattr(args, "anomaly_detection", "off") or "off"
        if not path and level == "off":
            return None
        dump = load_dump_config(path) if path else None
        if framework == "mindspore" and not getattr(args, "no_ms_jit", False):
            # Cell hooks do not run inside mindspore.jit: the step runs in PyNative while probing.
            args.no_ms_jit = True
            log("> MindSpore train step in PyNative: module hooks (--dump-config, --anomaly-detection) do not run "
                "inside mindspore.jit")
        rule = anomaly.SpikeRule(factor=getattr(args, "anomaly_spike_factor", 10.0),
                                 window=getattr(args, "anomaly_window", 50))
        if dump is not None:
            steps = "every step" if not dump.steps else f"step(s) {', '.join(map(str, dump.steps))}"
            log(f"> --dump-config {path}: {dump.task} of every module at level {dump.level}, {steps}, into "
                f"{dump.dump_path}/step<S>/rank<R>/dump.json")
        return cls(framework, rank, model, log, dump, level, rule)

    def before_step(self, iteration: int) -> None:
        step = iteration - 1
        if self.dump is not None and self.dump.wants_step(step) and self.dump.wants_rank(self.rank):
            self._recorder = _Recorder(self.probe, self.dump)
            self._dump_remove = self.probe.attach(self.model, self._recorder.forward, self._recorder.backward)
        if self._checker is not None:
            self._checker.iteration = iteration
            self._checker.findings = []
            self._checker.calls = {}

    def after_step(self, iteration: int, loss: float, grad_norm: float | None) -> None:
        if self._recorder is not None:
            self._dump_remove()
            folder = dump_files.step_dir(self.dump.dump_path, iteration - 1, self.rank)
            records = self._recorder.scoped()
            dump_files.write_step(folder, self.dump.task, self.framework, records, self._recorder.tensors)
            self.log(f"> dumped {len(records)} module records of step {iteration - 1} (iteration {iteration}) to {folder}")
            self._recorder = None
        if self._checker is None:
            return
        findings = list(self._checker.findings[:1])  # the first module, in execution order (forward first)
        for series, value in (("lm loss", loss), ("grad norm", grad_norm)):
            if value is not None:
                found = self.history.check(iteration, series, value)
                if found:
                    findings.append(found)
        if not findings:
            return
        text = "; ".join(f.describe() for f in findings)
        if self.level == "stop":
            raise AnomalyStop(f"anomaly at {text} (rank {self.rank}); stopping (--anomaly-detection stop; "
                              "'log' reports and goes on)")
        print(f"WARNING: [rank {self.rank}] anomaly at {text}", flush=True)

    def close(self) -> None:
        for remove in self._remove:
            remove()
        self._remove = []
