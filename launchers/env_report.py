"""`mmrun env`: versions and devices as one block to paste into a bug report.

Reads package metadata and the device nodes only: no framework is imported, so it works (and is fast)
on a machine where `import torch` itself is broken, which is often why a user runs it.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

from mmrun.backend.cann import cann_location

PACKAGES = (
    ("mmrun", "mmrun"),
    ("torch", "torch"),
    ("torch_npu", "torch_npu"),
    ("mindspore", "mindspore"),
    ("msadapter", "msadapter"),
    ("megatron-core", "megatron-core"),
    ("numpy", "numpy"),
)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cann_version(home: str | None) -> str | None:
    if not home:
        return None
    for name in ("version.cfg", "ascend_toolkit_install.info", "version.info"):
        for folder in (Path(home), Path(home).parent):
            path = folder / name
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines():
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip()
    return "found (version file not read)"


def _devices() -> dict[str, object]:
    npus = sorted(p.name for p in Path("/dev").glob("davinci[0-9]*"))
    gpu_dir = Path("/proc/driver/nvidia/gpus")
    gpus = sorted(p.name for p in gpu_dir.iterdir()) if gpu_dir.is_dir() else []
    return {
        "npu": npus or "none",
        "cuda": gpus or "none",
        "cpu cores": os.cpu_count(),
        "ASCEND_RT_VISIBLE_DEVICES": os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "unset"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
    }


def collect() -> dict[str, object]:
    report: dict[str, object] = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
    }
    for label, distribution in PACKAGES:
        report[label] = _version(distribution) or "not installed"
    cann = cann_location()
    if report["torch_npu"] != "not installed":
        report["torch_npu"] = f"{report['torch_npu']} ({'usable: CANN found' if cann else 'NOT usable: CANN not found'})"
    report["CANN"] = f"{_cann_version(cann)} at {cann}" if cann else "not found"
    msadapter_path = os.environ.get("MSADAPTER_PATH")
    if msadapter_path:
        report["msadapter"] = f"source tree {msadapter_path}"
    report["devices"] = _devices()
    report["MMRUN_AI_FRAMEWORK"] = os.environ.get("MMRUN_AI_FRAMEWORK", "unset")
    return report


def format_text(report: dict[str, object]) -> str:
    lines = ["```"]
    for key, value in report.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in value.items())
        else:
            lines.append(f"{key}: {value}")
    lines.append("```")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mmrun env",
        description="Print mmrun, Python, OS, framework, CANN and device information as a copy-paste block.",
        epilog="example:\n  mmrun env            # paste the block into a bug report\n  mmrun env --json     # for scripts",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the text block")
    args = parser.parse_args(argv)
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0
