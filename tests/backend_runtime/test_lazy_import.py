"""Importing mmrun.backend imports no framework; a missing framework is a one-line install hint."""
from __future__ import annotations

import pytest

NO_FRAMEWORK = """
import json, sys
import mmrun.backend as backend
from mmrun.backend import *  # noqa: F403  must not reach the lazy framework modules
from mmrun.backend import cann, checks, errors, info, object_codec, rank_env, selection
chosen = backend.framework()
where = backend.rank_env.read_rank_info()
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_npu', 'mindspore'))
print(json.dumps({"chosen": chosen, "loaded": loaded, "world": where.world_size}))
"""

# Hides one top-level module the way an absent package looks to the import system.
HIDE_AND_LOAD = """
import importlib.abc, json, sys
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hide())
import mmrun.backend as backend
try:
    backend.{attribute}
except backend.BackendError as exc:
    print(json.dumps({{"type": type(exc).__name__, "message": str(exc), "import_error": isinstance(exc, ImportError),
                      "exit_code": exc.exit_code}}))
"""


def test_import_mmrun_backend_imports_no_framework(run_python, last_json):
    result = last_json(run_python(NO_FRAMEWORK))
    assert result == {"chosen": "pytorch", "loaded": [], "world": 1}


@pytest.mark.parametrize("framework, hidden, extra, attribute", [
    ("pytorch", "torch", "torch", "load()"),
    ("mindspore", "mindspore", "mindspore", "distributed"),
])
def test_missing_framework_gives_the_install_command(run_python, clean_env, last_json, framework, hidden, extra,
                                                     attribute):
    proc = run_python(HIDE_AND_LOAD.format(hidden=hidden, attribute=attribute),
                      env=clean_env(MMRUN_AI_FRAMEWORK=framework))
    error = last_json(proc)
    assert error["type"] == "FrameworkNotInstalledError" and error["import_error"]
    message = error["message"]
    assert "\n" not in message
    assert f"The {framework} backend needs the '{hidden}' package, which is not installed" in message
    assert f"MMRUN_AI_FRAMEWORK={framework}" in message  # where the choice came from
    assert message.endswith(f'pip install "mmrun[{extra}]"')
