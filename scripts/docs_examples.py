"""The example blocks of the docs: their commands (docs/examples/*.yaml), run for real, and normalised.

A page marks each example block:

    <!-- example: NAME -->
    ```console
    $ command
    its output
    ```
    <!-- /example -->

and `docs/examples/<page>.yaml` says what runs there (see docs/development.md, "Example outputs"):

    page: docs/launcher.md
    examples:
      NAME:
        steps:                     # one shell session: cd, variables and background jobs carry over
          - mmrun --help           # a plain string: run, shown, expected to exit 0
          - run: mmrun --nproc-per-node 0 train.py
            exit: 2                # asserted; shown as "(exit 2)" when not 0
            note: a comment        # shown after the command as "   # a comment"
          - {run: "mkfifo pipe.py", hide: true}   # runs, is not shown (its output must be empty)
          - {run: cat plain.py, normalise: []}   # this step's own rules instead of the example's
        cwd: tmp                   # tmp (default: a fresh folder) or repo (the repository root)
        files: {plain.py: docs/examples/launcher/plain.py}   # copied into the folder first
        env: {COLUMNS: "80"}       # on top of BASE_ENV; {tmp} and {repo} are expanded
        normalise: [seconds, {pattern: 'pid \\d+', replace: 'pid <pid>'}]
        slow: true                 # starts torchrun/msrun or trains: the drift test marks it slow
        timeout: 120               # seconds for the whole example (default 120)
        fence: console             # the code fence's language

The commands are this repository's own data, run with bash as a user would type them (never text
from elsewhere), on a pseudo-terminal: the output is stdout and stderr together, as a user's terminal
shows them (Python line-buffers stdout on a terminal).
Output that differs from run to run is made stable by the declared normalisation rules
(docs/examples/normalise.yaml names the shared ones), after the built-in path placeholders.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import pty
import re
import secrets
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from mmrun.common.yaml_tables import TableError, check_keys, load_yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO / "docs" / "examples"
RULES_FILE = EXAMPLES_DIR / "normalise.yaml"
REGENERATE = "python scripts/update_docs.py"

# What every example starts from, so that a page does not depend on the shell it was generated in: the
# interpreter's bin/ first (an activated venv), a fixed locale and terminal width, a fixed hash seed, and
# nothing else inherited except HOME (and PYTHONPATH, see environment()).
BASE_ENV = {
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/sbin", "/usr/local/bin",
                             "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "COLUMNS": "100",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
}
STEP_KEYS = ("run", "exit", "note", "hide", "blank", "normalise")
EXAMPLE_KEYS = ("steps", "cwd", "files", "env", "normalise", "slow", "timeout", "fence", "covered_by")
RULE_KINDS = {"pattern": ("pattern", "replace"), "drop": ("drop", "note"), "sort": ("sort",)}


class ExampleError(RuntimeError):
    """An example could not be produced: a command failed, timed out, or the spec is wrong."""


@dataclasses.dataclass(frozen=True)
class Step:
    run: str
    exit: int = 0
    note: str = ""
    hide: bool = False
    blank: bool = False
    rules: tuple["Rule", ...] | None = None  # None: the example's rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """One normalisation: replace a pattern, drop lines (a run of them becomes `note`), or sort lines."""
    kind: str
    regex: re.Pattern
    replace: str = ""
    note: str = ""

    def apply(self, text: str) -> str:
        if self.kind == "pattern":
            return self.regex.sub(self.replace, text)
        lines = text.split("\n")
        if self.kind == "sort":
            # Lines that match are sorted among the places they held: the order in which concurrent
            # ranks write is the only thing that changes.
            places = [i for i, line in enumerate(lines) if self.regex.search(line)]
            for i, line in zip(places, sorted(lines[i] for i in places)):
                lines[i] = line
            return "\n".join(lines)
        dropped = [bool(self.regex.search(line)) for line in lines]
        # Blank lines right after a dropped line go with it (log messages end with one, or separate two).
        for i, line in enumerate(lines):
            if i and not line.strip() and dropped[i - 1]:
                dropped[i] = True
        kept: list[str] = []
        for line, drop in zip(lines, dropped):
            if not drop:
                kept.append(line)
            elif self.note and (not kept or kept[-1] != self.note):
                kept.append(self.note)
        return "\n".join(kept)


@dataclasses.dataclass(frozen=True)
class Example:
    page: str            # relative to the repository root, e.g. docs/launcher.md
    name: str
    steps: tuple[Step, ...]
    cwd: str = "tmp"
    files: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    rules: tuple[Rule, ...] = ()
    slow: bool = False
    timeout: float = 120.0
    fence: str = "console"
    spec_file: str = ""
    # A slow example whose run a test already makes and checks (the test named here): update_docs.py regenerates
    # it, the drift test does not run it a second time (the suite's time limit on CI).
    covered_by: str = ""

    @property
    def key(self) -> str:
        return f"{Path(self.page).stem}:{self.name}"

    @property
    def regenerate(self) -> str:
        return f"{REGENERATE} --only {self.key}"


def _rule(where: str, raw: Any, named: dict[str, Rule]) -> Rule:
    if isinstance(raw, str):
        if raw not in named:
            raise TableError(f"{where}: no normalisation rule named {raw!r} in {_shown(RULES_FILE)} "
                             f"(known: {', '.join(sorted(named))})")
        return named[raw]
    if not isinstance(raw, dict):
        raise TableError(f"{where}: a rule is a name or a mapping. Received: {raw!r}")
    kinds = [kind for kind in RULE_KINDS if kind in raw]
    if len(kinds) != 1:
        raise TableError(f"{where}: a rule has exactly one of {', '.join(RULE_KINDS)}. Received: {raw!r}")
    kind = kinds[0]
    check_keys(where, raw, required=RULE_KINDS[kind][:1] + (("replace",) if kind == "pattern" else ()),
               optional=RULE_KINDS[kind][1:])
    try:
        regex = re.compile(raw[kind], flags=re.M)
    except re.error as err:
        raise TableError(f"{where}: {raw[kind]!r} is not a regular expression ({err})") from None
    return Rule(kind, regex, replace=str(raw.get("replace", "")), note=str(raw.get("note", "")))


def load_rules(path: Path = RULES_FILE) -> dict[str, Rule]:
    data = check_keys(str(path), load_yaml(path), required=("rules",))
    return {name: _rule(f"{path.name}: rule {name}", raw, {}) for name, raw in data["rules"].items()}


def _step(where: str, raw: Any, named: dict[str, Rule]) -> Step:
    if isinstance(raw, str):
        return Step(run=raw)
    check_keys(where, raw, required=("run",), optional=STEP_KEYS[1:])
    if not isinstance(raw.get("exit", 0), int) or isinstance(raw.get("exit", 0), bool):
        raise TableError(f"{where}: exit is the step's expected exit status, a whole number. Received: {raw['exit']!r}")
    rules = raw.get("normalise")
    step = Step(run=str(raw["run"]), exit=int(raw.get("exit", 0)), note=str(raw.get("note", "")),
                hide=bool(raw.get("hide", False)), blank=bool(raw.get("blank", False)),
                rules=None if rules is None else tuple(_rule(f"{where}: normalise", r, named) for r in rules))
    if step.hide and (step.note or step.blank):
        raise TableError(f"{where}: a hidden step is not shown, so it takes no note or blank")
    return step


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def load_spec(path: Path, named: dict[str, Rule]) -> list[Example]:
    data = check_keys(str(path), load_yaml(path), required=("page", "examples"))
    page = str(data["page"])
    if not (REPO / page).is_file():
        raise TableError(f"{path}: page {page} does not exist")
    examples = []
    for name, raw in (data["examples"] or {}).items():
        where = f"{_shown(path)}: example {name}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(name)):
            raise TableError(f"{where}: a name is lower-case letters, digits and dashes")
        check_keys(where, raw, required=("steps",), optional=EXAMPLE_KEYS[1:])
        if raw.get("cwd", "tmp") not in ("tmp", "repo"):
            raise TableError(f"{where}: cwd is tmp or repo. Received: {raw['cwd']!r}")
        files = tuple((str(dest), str(src)) for dest, src in (raw.get("files") or {}).items())
        for dest, src in files:
            if not (REPO / src).exists():
                raise TableError(f"{where}: file {src} (for {dest}) does not exist")
        if not isinstance(raw["steps"], list) or not raw["steps"]:
            raise TableError(f"{where}: steps is a list of commands. Received: {raw['steps']!r}")
        steps = tuple(_step(f"{where}: step {i + 1}", s, named) for i, s in enumerate(raw["steps"]))
        if not any(not s.hide for s in steps):
            raise TableError(f"{where}: every step is hidden; nothing would be shown")
        examples.append(Example(
            page=page, name=str(name), steps=steps, cwd=raw.get("cwd", "tmp"), files=files,
            env=tuple((str(k), str(v)) for k, v in (raw.get("env") or {}).items()),
            rules=tuple(_rule(f"{where}: normalise", r, named) for r in raw.get("normalise") or ()),
            slow=bool(raw.get("slow", False)), timeout=float(raw.get("timeout", 120)),
            fence=str(raw.get("fence", "console")), spec_file=_shown(path),
            covered_by=str(raw.get("covered_by", ""))))
    return examples


def load_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Every example of every page, in file then declaration order."""
    named = load_rules()
    examples: list[Example] = []
    for path in sorted(directory.glob("*.yaml")):
        if path != RULES_FILE:
            examples += load_spec(path, named)
    twice = sorted(key for key, n in Counter(e.key for e in examples).items() if n > 1)
    if twice:
        raise TableError(f"example {twice[0]} is declared twice (two files for one page?)")
    return examples


def imported_checkout() -> Path:
    """The folder of the `mmrun` package this interpreter imports (through PYTHONPATH, or the installed one)."""
    import mmrun

    return Path(mmrun.__file__).parent


def check_imports_this_checkout() -> None:
    """The examples must run the code of the checkout whose pages they write, not another installed one."""
    if imported_checkout().resolve() != REPO.resolve():
        raise ExampleError(f"the examples would run mmrun from {imported_checkout()}, not this checkout {REPO}; "
                           f"put a folder holding a link mmrun -> {REPO} first on PYTHONPATH")


def _placeholders(tmp: Path) -> list[tuple[str, str]]:
    """Built-in: the paths of this machine become <tmp>, <site-packages>, <venv>, <repo> (longest first, resolved
    too)."""
    pairs = {}
    # Every site-packages folder the interpreter reads (a venv may reach another one through a .pth file).
    packages = {*site.getsitepackages(), *(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))}
    places = [(tmp, "<tmp>"), *((Path(p), "<site-packages>") for p in sorted(packages)),
              (Path(sys.prefix), "<venv>"), (REPO, "<repo>"), (imported_checkout(), "<repo>")]
    for path, name in places:
        for variant in {str(path), str(path.resolve())}:
            pairs.setdefault(variant, name)
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


_INTERPRETER = re.compile(r"<venv>/bin/python3(?:\.\d+)?\b")


def normalise(example: Example, step: Step, text: str, tmp: Path) -> str:
    for path, name in _placeholders(tmp):
        text = text.replace(path, name)
    # The interpreter's name is the one its caller used (a console script's shebang says python3 or python,
    # depending on how pip was run): one spelling on the page.
    text = _INTERPRETER.sub("<venv>/bin/python", text)
    for rule in example.rules if step.rules is None else step.rules:
        text = rule.apply(text)
    return text


def _script(steps: Iterable[Step], mark: str) -> str:
    # One bash session for the whole example; after each step a line with the mark and its exit status.
    # The newline before the mark ends a last line that had none; the parser removes exactly that one.
    return "".join(f"{step.run}\nprintf '\\n{mark} %d\\n' $?\n" for step in steps)


def environment(example: Example, tmp: Path) -> dict[str, str]:
    env = dict(BASE_ENV, HOME=os.environ.get("HOME", str(tmp)))
    if os.environ.get("PYTHONPATH"):
        # How a checkout other than the installed one is imported (a git worktree): the examples run the code
        # the generator checked with check_imports_this_checkout().
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    for key, value in example.env:
        env[key] = value.replace("{tmp}", str(tmp)).replace("{repo}", str(REPO))
    return env


def run_example(example: Example) -> list[tuple[Step, str, int]]:
    """Run the steps in a fresh folder; (step, normalised output, exit status) for each."""
    check_imports_this_checkout()
    tmp = Path(tempfile.mkdtemp(prefix="mmrun-docs-"))
    session = Path(tempfile.mkdtemp(prefix="mmrun-docs-session-"))
    try:
        for dest, src in example.files:
            target = tmp / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (REPO / src).is_dir() else shutil.copy2)(REPO / src, target)
        mark = f"@@mmrun-docs-step-{secrets.token_hex(8)}@@"
        # A script file, not `bash -c TEXT`: the session's own command line must not hold the commands,
        # or `pgrep -f` in an example would count it.
        script = session / "session.sh"
        script.write_text(_script(example.steps, mark), encoding="utf-8")
        env = environment(example, tmp)
        raw = run_on_terminal(["bash", str(script)], cwd=REPO if example.cwd == "repo" else tmp, env=env,
                              timeout=example.timeout, columns=int(env["COLUMNS"]))
        if raw is None:
            raise ExampleError(f"{example.page}: example {example.name!r} ran over its {example.timeout:g} s "
                               f"timeout ({example.spec_file})")
        chunks = re.split(f"\n{re.escape(mark)} (-?\\d+)\n", raw)
        results = []
        for i, step in enumerate(example.steps):
            if 2 * i + 1 >= len(chunks):
                raise ExampleError(f"{example.page}: example {example.name!r} stopped before step {i + 1} "
                                   f"`{step.run}`; output: {chunks[-1][-2000:]}")
            output, status = normalise(example, step, chunks[2 * i], tmp), int(chunks[2 * i + 1])
            if status != step.exit:
                raise ExampleError(f"{example.page}: example {example.name!r}, step {i + 1} `{step.run}` exited "
                                   f"{status}, expected {step.exit} ({example.spec_file}); output:\n{output[-3000:]}")
            if step.hide and output.strip():
                raise ExampleError(f"{example.page}: example {example.name!r}, hidden step {i + 1} `{step.run}` "
                                   f"printed output; hidden steps must be silent:\n{output[-2000:]}")
            results.append((step, output, status))
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(session, ignore_errors=True)


def run_on_terminal(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, columns: int) -> str | None:
    """Run `argv` with stdout and stderr on a pseudo-terminal, as in a user's terminal (Python line-buffers
    stdout there, so lines arrive in the order written and whole); its output, or None after `timeout`.
    Whatever the session leaves running in its process group is killed when it ends."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # keep "\n" as "\n" (a terminal would add "\r")
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    data = bytearray()
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now > deadline:
                return None
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                data += chunk
                quiet_since = None
            elif proc.poll() is not None:
                # The session ended; a process it started elsewhere (another session) may still hold the
                # terminal open: take what arrives within half a second, then stop reading.
                quiet_since = quiet_since or now
                if now - quiet_since > 0.5:
                    break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return data.decode("utf-8", errors="replace")
    except subprocess.TimeoutExpired:
        return None
    finally:
        _kill_group(proc)
        os.close(master)


def _kill_group(proc: subprocess.Popen) -> None:
    # Whatever the example left running in its session (a background job) ends with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def render(example: Example, results: list[tuple[Step, str, int]]) -> str:
    """The fenced block: `$ command` lines, the output, `(exit N)` where N is not 0."""
    lines = [f"```{example.fence}"]
    for step, output, status in results:
        if step.hide:
            continue
        if step.blank:
            lines.append("")
        lines.append(f"$ {step.run}" + (f"   # {step.note}" if step.note else ""))
        if output.strip("\n"):
            lines += output.rstrip("\n").split("\n")
        if status:
            lines.append(f"(exit {status})")
    lines.append("```")
    return "\n".join(lines) + "\n"


def produce(example: Example) -> str:
    return render(example, run_example(example))


def produce_all(examples: list[Example], jobs: int = 1,
                progress: Callable[[str], None] = lambda line: None) -> dict[str, str | ExampleError]:
    """key -> rendered block (or the error), running up to `jobs` examples at once."""
    from concurrent.futures import ThreadPoolExecutor

    def one(example: Example) -> str | ExampleError:
        started = time.monotonic()
        try:
            block = produce(example)
        except ExampleError as err:
            progress(f"FAILED {example.key}: {str(err).splitlines()[0]}")
            return err
        progress(f"ran {example.key} ({time.monotonic() - started:.1f} s)")
        return block

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip((e.key for e in examples), pool.map(one, examples)))
