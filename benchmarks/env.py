"""Where a run writes (one CSV per benchmark and GPU) and the environment saved beside it (``<csv stem>_env.json``):
GPU, driver, torch, Triton, CUDA and nvmath versions, the commit, the date, the command and the shipped configs'
hashes, so a table quoting the CSV can say what produced it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.fileio import atomic_write_text
from aiter_gemm.settings import default_config_dir

#: The checkout the harness runs from (its commit goes into the environment); an installed copy has none.
REPO = Path(__file__).resolve().parents[1]


def gpu_slug(device: torch.device) -> str:
    """``H100_80GB_HBM3`` for an "NVIDIA H100 80GB HBM3", ``cpu`` on CPU: the GPU part of the file names."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).removeprefix("NVIDIA ")
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def output_paths(out_dir: str | Path, bench: str, device: torch.device) -> tuple[Path, Path]:
    """(CSV, env JSON) of benchmark ``bench`` on ``device`` under ``out_dir``."""
    stem = Path(out_dir) / f"{bench}_{gpu_slug(device)}"
    return stem.with_suffix(".csv"), stem.parent / f"{stem.name}_env.json"


def _run(cmd: list[str]) -> str:
    if cmd[0] == "git" and not (REPO / ".git").exists():  # installed: site-packages' enclosing repo is not ours
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(module: str) -> str:
    try:
        return str(__import__(module).__version__)
    except Exception:  # not installed, or broken: the env says so rather than failing the run
        return "-"


def environment(device: torch.device, argv: list[str]) -> dict[str, Any]:
    """What produced a run: device and driver, library versions, commit (``git describe``-free: the hash and
    whether the tree was dirty), UTC date, the command line, and the sha256 of each shipped tuned CSV."""
    from aiter_gemm import eager_ext
    from aiter_gemm.ops import a16w16 as ops

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m benchmarks.run", *argv]),
        # A device copy of the tree may have no .git: the caller passes COMMIT (the device scripts do).
        "commit": os.environ.get("COMMIT") or _run(["git", "rev-parse", "--short", "HEAD"]) or "-",
        "dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0] or "-",
        "torch": torch.__version__, "cuda": torch.version.cuda or "-", "triton": _version("triton"),
        "nvmath": _version("nvmath"), "python": platform.python_version(),
        "eager_ext": "loaded" if ops.EAGER_EXT is not None else str(eager_ext.status),
        "configs": {},
    }
    for path in sorted(default_config_dir().glob("*_tuned_gemm.csv")):
        env["configs"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return env


def write_env(path: Path, env: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(env, indent=1, default=str) + "\n")


def command_line() -> list[str]:
    return sys.argv[1:]
