"""Every environment setting of the runtime, read once (at first use and at :func:`aiter_gemm.reload_configs`).

Nothing on the per-GEMM path reads the environment: the dispatcher holds one frozen :class:`Settings`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiter_gemm.configs import parse_bool, parse_float, parse_int, shown
from aiter_gemm.fileio import file_problem

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
#: An entry of an ``AITER_CONFIG_*`` list that stands for what the kind reads when its variable is unset (the shipped
#: file and its model configs): ``AITER_CONFIG_GEMM_BF16=my.csv:@shipped``. A file of that name is ``./@shipped``.
SHIPPED = "@shipped"
#: Model-specific tuned files merged with a kind's shipped file when its variable is unset (AITER's
#: ``configs/model_configs/*<stem>*.csv``, untuned shape lists excluded).
MODEL_CONFIGS = "model_configs"

log = logging.getLogger(__name__)


def default_config_dir() -> Path:
    """The shipped ``configs/``: ``aiter_gemm/configs`` in an installed copy, ``<repo>/configs`` in a checkout."""
    for cand in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs"):
        if (cand / CONFIG_KINDS["GEMM_BF16"][1]).is_file():
            return cand
    raise FileNotFoundError(
        f"aiter_gemm: shipped configs not found in {_PACKAGE_DIR / 'configs'} or {_PACKAGE_DIR.parent / 'configs'}; "
        "reinstall the package (setup.py ships configs/ as package data)"
    )


def default_config_paths(kind: str, config_dir: Path | None = None) -> tuple[str, ...]:
    """The files a kind reads when its variable is unset, as AITER reads them: the shipped file, then every
    ``model_configs/*<stem>*.csv`` (``stem``: the shipped name without ``.csv``; names containing ``untuned`` are shape
    lists, skipped), sorted by name so the merge does not depend on the file system's order."""
    folder = default_config_dir() if config_dir is None else config_dir
    fname = CONFIG_KINDS[kind][1]
    stem = fname[: -len(".csv")]
    models = sorted(p for p in (folder / MODEL_CONFIGS).glob(f"*{stem}*.csv")
                    if p.is_file() and "untuned" not in p.name)
    if models:
        log.info("aiter_gemm: %s merges the model configs %s with %s", kind, ", ".join(p.name for p in models),
                 folder / fname)
    return (str(folder / fname), *map(str, models))


def config_list(kind: str, raw: str) -> tuple[str, ...]:
    """The files of a colon-separated ``AITER_CONFIG_*`` value, in order, each read as :func:`_path` reads it (``~``
    expanded), each :data:`SHIPPED` entry replaced by :func:`default_config_paths` (so a user's table goes in front
    of the shipped one without knowing where it is)."""
    out: list[str] = []
    for entry in raw.split(":"):
        if entry.strip() == SHIPPED:
            out += default_config_paths(kind)
        elif entry.strip():
            out.append(_path(entry))
    return tuple(out)


def _flag(env: Mapping[str, str], name: str) -> bool:
    """A boolean variable as :func:`~aiter_gemm.configs.parse_bool` reads it (unset or empty: off). Any other value is
    a ValueError naming the variable and the value: ``AITER_TUNE_GEMM=2`` was silently off (issue 31)."""
    raw = env.get(name, "")
    try:
        return bool(raw.strip()) and parse_bool(raw)
    except ValueError as exc:
        raise ValueError(f"aiter_gemm: {name} {exc}") from None


def set_env(values: Mapping[str, str | None]) -> None:
    """Set environment variables (None: unset) for this process and the processes it starts from now on."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def scoped_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Environment variables set (None: unset) inside the block and restored as they were after it, however it
    ends. The runtime reads them at :func:`aiter_gemm.reload_configs`; a spawned child copies them at its start."""
    old = {k: os.environ.get(k) for k in values}
    try:
        set_env(values)
        yield
    finally:
        set_env(old)


def _path(raw: str) -> str:
    """A path setting as a path: surrounding blanks dropped, ``~`` expanded (the shell leaves ``~`` alone inside
    quotes or after ``=``; issue 31 found it taken literally)."""
    return os.path.expanduser(raw.strip())


def _paths(raw: str) -> tuple[str, ...]:
    """A colon-separated list of paths (empty entries dropped), each as :func:`_path` reads it."""
    return tuple(_path(p) for p in raw.split(":") if p.strip())


def _flush_seconds(env: Mapping[str, str]) -> float:
    """``AITER_TUNE_GEMM_FLUSH_S``: seconds from 0 to ``threading.TIMEOUT_MAX`` (what a timer can wait; ``inf``
    killed the timer thread, ``nan`` and negative values were taken). ValueError naming the variable."""
    raw = env.get("AITER_TUNE_GEMM_FLUSH_S", "").strip() or "30"
    try:
        value = parse_float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= threading.TIMEOUT_MAX:  # false for NaN too
        raise ValueError(f"aiter_gemm: AITER_TUNE_GEMM_FLUSH_S must be a number of seconds from 0 to "
                         f"{threading.TIMEOUT_MAX:g}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """Runtime settings; see docs/configs.md's table of settings."""

    config_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tune_gemm: bool = False  # AITER_TUNE_GEMM: capture shapes that miss every tuned row
    untuned_file: str = "bf16_untuned_gemm.csv"  # AITER_UNTUNED_GEMM_FILE (relative to the working directory)
    capture_flush_s: float = 30.0  # AITER_TUNE_GEMM_FLUSH_S: capture flushes at most this long after a new shape
    log_tuned_config: bool = False  # AITER_LOG_TUNED_CONFIG
    arch: str | None = None  # AITER_GEMM_ARCH, else AITER's GPU_ARCHS (last of a ';' list; "native": none)
    cu_num: int | None = None  # AITER_GEMM_CU_NUM, else AITER's CU_NUM (0: none)
    device_name: str | None = None  # AITER_GEMM_DEVICE_NAME: the device name rows and SGLang files are matched on
    # AITER_GEMM_TRITON_CONFIGS folders (colon-separated), then the shipped configs/triton: per-device Triton JSONs.
    triton_config_dirs: tuple[str, ...] = ()
    # AITER_GEMM_SGLANG_TILELANG_DIR folders (colon-separated): SGLang's TileLang files, below the project's own.
    sglang_tilelang_dirs: tuple[str, ...] = ()
    # AITER_GEMM_FUSED_MOE_CONFIGS folders (colon-separated): vLLM/SGLang fused-MoE JSON files (E=..,N=..,...json).
    fused_moe_dirs: tuple[str, ...] = ()
    # AITER_GEMM_PRECOMPILE_WORKERS: processes (Triton) or compiler threads (TileLang) that build kernels ahead
    # (the backends' precompile: aiter_gemm.warmup, the tuners); None: each backend's default.
    precompile_workers: int | None = None


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read the environment once into a frozen :class:`Settings` (errors name the variable)."""
    env = os.environ if env is None else env
    paths: dict[str, tuple[str, ...]] = {}
    for kind, (var, _) in CONFIG_KINDS.items():
        paths[kind] = config_list(kind, env.get(var, "")) or default_config_paths(kind)
    return Settings(
        config_paths=paths,
        tune_gemm=_flag(env, "AITER_TUNE_GEMM"),
        untuned_file=_path(env.get("AITER_UNTUNED_GEMM_FILE", "")) or "bf16_untuned_gemm.csv",
        capture_flush_s=_flush_seconds(env),
        log_tuned_config=_flag(env, "AITER_LOG_TUNED_CONFIG"),
        arch=arch_override(env),
        cu_num=cu_num_override(env),
        device_name=env.get("AITER_GEMM_DEVICE_NAME", "").strip() or None,
        triton_config_dirs=_folders(env, "AITER_GEMM_TRITON_CONFIGS") + (str(default_config_dir() / "triton"),),
        sglang_tilelang_dirs=_folders(env, "AITER_GEMM_SGLANG_TILELANG_DIR"),
        fused_moe_dirs=_folders(env, "AITER_GEMM_FUSED_MOE_CONFIGS"),
        precompile_workers=_positive(env, "AITER_GEMM_PRECOMPILE_WORKERS"),
    )


def _positive(env: Mapping[str, str], name: str) -> int | None:
    """A count setting: a positive integer, or None where unset or empty; ValueError naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = parse_int(raw)
    except ValueError as exc:
        raise ValueError(f"aiter_gemm: {name} {exc}, got {shown(raw)}") from None
    if value < 1:
        raise ValueError(f"aiter_gemm: {name} must be a positive integer, got {raw!r}")
    return value


def _folders(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A colon-separated list of folders, each one that is not a folder warned about saying what it is instead (a
    file, not found, a symlink loop): read as folders, they would hold nothing, without a word."""
    folders = _paths(env.get(name, ""))
    for folder in folders:
        if not os.path.isdir(folder):
            log.warning("aiter_gemm: %s entry %s is no folder (%s): nothing is read from it", name, folder,
                        file_problem(folder) or "a file")
    return folders


def arch_override(env: Mapping[str, str]) -> str | None:
    """The arch rows are matched against instead of the probed one: ``AITER_GEMM_ARCH``, else AITER's ``GPU_ARCHS``
    (a ``;`` list gives its last entry, as AITER's ``get_gfx``; ``native`` or empty: no override)."""
    ours = env.get("AITER_GEMM_ARCH", "").strip()
    if ours:
        return ours
    archs = [a.strip() for a in env.get("GPU_ARCHS", "").split(";") if a.strip()]
    return archs[-1] if archs and archs[-1].lower() != "native" else None


def cu_num_override(env: Mapping[str, str]) -> int | None:
    """The CU / SM count rows are matched against instead of the probed one: ``AITER_GEMM_CU_NUM`` (a positive
    integer), else AITER's ``CU_NUM`` (0 or empty: no override). ValueError naming the variable."""
    for var, zero_ok in (("AITER_GEMM_CU_NUM", False), ("CU_NUM", True)):
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = parse_int(raw)
        except ValueError as exc:
            raise ValueError(f"aiter_gemm: {var} {exc}, got {shown(raw)}") from None
        if value < 0 or (value == 0 and not zero_ok):
            raise ValueError(f"aiter_gemm: {var} must be a positive integer, got {raw!r}")
        if value:
            return value
    return None


def package_dirs() -> tuple[Path, ...]:
    """Folders the runtime must never write into (the package and its shipped configs)."""
    dirs = [_PACKAGE_DIR]
    try:
        dirs.append(default_config_dir().resolve())
    except FileNotFoundError:
        pass
    return tuple(dirs)
