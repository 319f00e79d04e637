"""The whole suite's one hook: which tests share a pytest-xdist worker (the README runs `pytest -n 2`).

The expensive session fixtures train real jobs once and share them between files (the VLM runs, the
megatron-core runs, the tiny Hugging Face and Wan models); module fixtures share within a file (the docs'
slow examples run all together in one). A worker that got only part of such a group would build the
fixture again, so `--dist loadgroup` keeps each group on one worker: the shared fixture's name where a test
uses one, its file otherwise, unless the test names its own group (`pytest.mark.xdist_group`).
"""
from __future__ import annotations

import pytest

# session fixture -> its group; fixtures built on one another share one (wan_frameworks needs wan_refs)
SHARED_SESSION_FIXTURES = {"vlm": "vlm", "mcore_runs": "mcore_runs", "runs": "gpt_runs", "vlm_job": "vlm_job",
                           "wan_frameworks": "wan", "wan_refs": "wan", "mmrun_models": "hf_models",
                           "hf_dirs": "hf_models"}


def xdist_group(item: pytest.Item) -> str:
    shared = next((group for name, group in SHARED_SESSION_FIXTURES.items() if name in item.fixturenames), None)
    return f"fixture:{shared}" if shared else f"file:{item.nodeid.split('::', 1)[0]}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:  # a test's own group wins (the docs' slow examples)
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    # The groups around a shared fixture are the longest (minutes each), then the files with a slow test (real
    # launches): handed out first, so that the last minutes of a run are many small groups that even out the two
    # workers, not one long group on one of them (measured: with the slow files last, one worker ran them alone).
    group = {item: str(item.get_closest_marker("xdist_group").args[0]) for item in items}
    slow = {group[item] for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (not group[item].startswith("fixture:"), group[item] not in slow))
