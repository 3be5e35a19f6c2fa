"""Every environment setting of the runtime, read once (at first use and at :func:`aiter_gemm.reload_configs`).

Nothing on the per-GEMM path reads the environment: the dispatcher holds one frozen :class:`Settings`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Config kind -> (environment variable, shipped default file name), as in AITER (docs/design.md, "Config files").
CONFIG_KINDS: dict[str, tuple[str, str]] = {
    "GEMM_BF16": ("AITER_CONFIG_GEMM_BF16", "bf16_tuned_gemm.csv"),
    "GEMM_A8W8": ("AITER_CONFIG_GEMM_A8W8", "a8w8_tuned_gemm.csv"),
    "GEMM_A8W8_BPRESHUFFLE": ("AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE", "a8w8_bpreshuffle_tuned_gemm.csv"),
    "GEMM_A8W8_BLOCKSCALE": ("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", "a8w8_blockscale_tuned_gemm.csv"),
    "GEMM_A4W4": ("AITER_CONFIG_GEMM_A4W4", "a4w4_blockscale_tuned_gemm.csv"),
    "A8W8_BATCHED_GEMM": ("AITER_CONFIG_A8W8_BATCHED_GEMM", "a8w8_tuned_batched_gemm.csv"),
    "BF16_BATCHED_GEMM": ("AITER_CONFIG_BF16_BATCHED_GEMM", "bf16_tuned_batched_gemm.csv"),
    "FMOE": ("AITER_CONFIG_FMOE", "tuned_fmoe.csv"),
}

_PACKAGE_DIR = Path(__file__).resolve().parent


def default_config_dir() -> Path:
    """The shipped ``configs/``: ``aiter_gemm/configs`` in an installed copy, ``<repo>/configs`` in a checkout."""
    for cand in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs"):
        if (cand / CONFIG_KINDS["GEMM_BF16"][1]).is_file():
            return cand
    raise FileNotFoundError(
        f"aiter_gemm: shipped configs not found in {_PACKAGE_DIR / 'configs'} or {_PACKAGE_DIR.parent / 'configs'}; "
        "reinstall the package (setup.py ships configs/ as package data)"
    )


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    """Runtime settings; see README's table of environment variables."""

    config_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tune_gemm: bool = False  # AITER_TUNE_GEMM: capture shapes that miss every tuned row
    untuned_file: str = "bf16_untuned_gemm.csv"  # AITER_UNTUNED_GEMM_FILE (relative to the working directory)
    capture_flush_s: float = 30.0  # AITER_TUNE_GEMM_FLUSH_S: capture flushes at most this long after a new shape
    log_tuned_config: bool = False  # AITER_LOG_TUNED_CONFIG
    arch: str | None = None  # AITER_GEMM_ARCH
    cu_num: int | None = None  # AITER_GEMM_CU_NUM
    # AITER_GEMM_TRITON_CONFIGS folders (colon-separated), then the shipped configs/triton: per-device Triton JSONs.
    triton_config_dirs: tuple[str, ...] = ()


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read the environment once into a frozen :class:`Settings` (errors name the variable)."""
    env = os.environ if env is None else env
    paths: dict[str, tuple[str, ...]] = {}
    for kind, (var, fname) in CONFIG_KINDS.items():
        raw = env.get(var, "").strip()
        if raw:
            paths[kind] = tuple(p for p in raw.split(":") if p.strip())
        else:
            paths[kind] = (str(default_config_dir() / fname),)
    cu_raw = env.get("AITER_GEMM_CU_NUM", "").strip()
    try:
        cu_num = int(cu_raw) if cu_raw else None
        flush_s = float(env.get("AITER_TUNE_GEMM_FLUSH_S", "30"))
    except ValueError as exc:
        raise ValueError(f"aiter_gemm: bad AITER_GEMM_CU_NUM / AITER_TUNE_GEMM_FLUSH_S value: {exc}") from None
    if cu_num is not None and cu_num <= 0:
        raise ValueError(f"aiter_gemm: AITER_GEMM_CU_NUM must be a positive integer, got {cu_raw!r}")
    return Settings(
        config_paths=paths,
        tune_gemm=_flag(env, "AITER_TUNE_GEMM"),
        untuned_file=env.get("AITER_UNTUNED_GEMM_FILE", "").strip() or "bf16_untuned_gemm.csv",
        capture_flush_s=flush_s,
        log_tuned_config=_flag(env, "AITER_LOG_TUNED_CONFIG"),
        arch=env.get("AITER_GEMM_ARCH", "").strip() or None,
        cu_num=cu_num,
        triton_config_dirs=tuple(p for p in env.get("AITER_GEMM_TRITON_CONFIGS", "").split(":") if p.strip())
        + (str(default_config_dir() / "triton"),),
    )


def package_dirs() -> tuple[Path, ...]:
    """Folders the runtime must never write into (the package and its shipped configs)."""
    dirs = [_PACKAGE_DIR]
    try:
        dirs.append(default_config_dir().resolve())
    except FileNotFoundError:
        pass
    return tuple(dirs)
