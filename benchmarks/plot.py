"""BENCHMARKS.md's figures (``python -m benchmarks.run plot``): a provider's ratio against a baseline by M, and its
fraction of the roofline by M, one line per (label, N, K), as PNGs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.report import num, select


def plot(rows: Sequence[dict], out_dir: str | Path, provider: str, vs: str, mode: str, stem: str) -> list[Path]:
    """``<stem>_speedup.png`` and, where the rows have roofline fractions, ``<stem>_roofline.png`` in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = select(rows, provider, vs, mode)
    groups: dict[tuple, list[dict]] = {}
    for r in rs:
        groups.setdefault((r["label"], int(r["N"]), int(r["K"])), []).append(r)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    figures = [("speedup", "ratio", f"{provider} speed-up over {vs} ({mode})")]
    if any(r.get("roof") for r in rs):
        figures.append(("roofline", "roof", f"{provider}: fraction of the roofline ({mode})"))
    for name, key, ylabel in figures:
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for (label, n, k), part in sorted(groups.items()):
            part.sort(key=lambda r: int(r["M"]))
            ax.plot([int(r["M"]) for r in part], [num(r.get(key)) for r in part], marker="o",
                    label=f"{label} N={n} K={k}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{stem}_{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
