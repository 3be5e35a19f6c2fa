"""The statistics of ``hf_decode`` runs (``python -m examples.hf_decode``): each arm's timings per configuration,
the per-round ratios and their medians, and the markdown table with its legend. Shared by the example, which
writes them, and :mod:`benchmarks.report`, which pools runs.
"""

from __future__ import annotations

import statistics
from typing import Any

CONTROL = "control"  # with --control: a second unpatched arm; without / control is the method's A/A noise floor


def arm_times(rounds: list[dict[str, Any]]) -> dict[tuple, dict[str, list[float]]]:
    """Per configuration (model, batch, mode, phase), each arm's timings in round order (rounds pair by position)."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in rounds:
        groups.setdefault((r["model"], r["batch"], r["mode"], r["phase"]), {}).setdefault(r["arm"], []).append(r["ms"])
    return groups


def summarize(rounds: list[dict[str, Any]], prompt_len: int, base: str = "without",
              main: str = "with") -> list[dict[str, Any]]:
    """Per configuration: ``base`` and ``main`` as the columns "without" and "with" (their names in ``arm_without`` /
    ``arm_with``), the control's A/A ratio, and for any other arm X ``vs_X``: median per-round ratio X / main."""
    out = []
    for (model, b, mode, phase), arms in arm_times(rounds).items():
        tokens = b * prompt_len if phase == "prefill" else b
        wo, wi = arms[base], arms[main]
        ratios = [a / c for a, c in zip(wo, wi)]
        row = {"model": model, "batch": b, "mode": mode, "phase": phase, "rounds": len(wo), "arm_without": base,
               "arm_with": main}
        for arm, vals in (("without", wo), ("with", wi)):
            med = statistics.median(vals)
            row.update({f"ms_{arm}": med, f"ms_{arm}_min": min(vals), f"ms_{arm}_max": max(vals),
                        f"tok_s_{arm}": tokens / med * 1e3})
        row.update(speedup=statistics.median(ratios), round_ratio_min=min(ratios),
                   round_ratio_median=statistics.median(ratios), round_ratio_max=max(ratios),
                   ratio_of_medians=row["ms_without"] / row["ms_with"])
        if CONTROL in arms:  # identical work in both arms: how far from 1.0 the method reads by itself
            aa = [a / c for a, c in zip(wo, arms[CONTROL])]
            row.update(aa_ratio=statistics.median(aa), aa_ratio_min=min(aa), aa_ratio_max=max(aa))
        for arm in sorted(set(arms) - {base, main, CONTROL}):
            vs = [x / c for x, c in zip(arms[arm], wi)]
            row.update({f"ms_{arm}": statistics.median(arms[arm]), f"vs_{arm}": statistics.median(vs),
                        f"vs_{arm}_min": min(vs), f"vs_{arm}_max": max(vs)})
        out.append(row)
    return out


#: Under the table: the speedup and the medians are different statistics, and can disagree in direction when the
#: arms differ by less than the round-to-round spread (one report: medians 1.265 vs 1.285 ms, speedup 1.025).
TABLE_LEGEND = ("ms: median over the rounds of one arm [min-max]. speedup: median over the rounds of the ratio of the "
                "two arms' adjacent timings (without / with, > 1: patched is faster) [min-max], the method's number; "
                "ratio of medians: median ms without / median ms with, which pairs timings of different rounds. "
                "FP8 loop: without = torch_blockwise, with = tuned; bf16/tuned > 1: tuned FP8 beats the bf16 model.")


def markdown(summary: list[dict[str, Any]]) -> str:
    """The summary as a markdown table, each column naming its statistic, and :data:`TABLE_LEGEND` under it. The
    arms are named as they ran (without / with in the bf16 loop; torch_blockwise / tuned, + bf16, in the FP8 one)."""
    control = any("aa_ratio" in r for r in summary)
    wo, wi = (summary[0]["arm_without"], summary[0]["arm_with"]) if summary else ("without", "with")
    extra = sorted({k[3:] for r in summary for k in r if k.startswith("vs_") and not k.endswith(("_min", "_max"))})
    lines = [f"| model | batch | mode | phase | median ms {wo} [min-max] | median ms {wi} [min-max] "
             f"| tok/s {wo} (median) | tok/s {wi} (median) | speedup: median per-round ratio [min-max] "
             "| ratio of medians |" + (f" A/A {wo}/control: median per-round ratio [min-max] |" if control else "")
             + "".join(f" median ms {x} | {x}/{wi}: median per-round ratio [min-max] |" for x in extra),
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if control else "")
             + " ---: | ---: |" * len(extra)]
    for r in summary:
        aa = (f" {r['aa_ratio']:.3f} [{r['aa_ratio_min']:.3f}-{r['aa_ratio_max']:.3f}] |" if "aa_ratio" in r
              else " |" if control else "")
        aa += "".join(f" {r[f'ms_{x}']:.3f} | {r[f'vs_{x}']:.3f} [{r[f'vs_{x}_min']:.3f}-{r[f'vs_{x}_max']:.3f}] |"
                      for x in extra)
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['mode']} | {r['phase']} "
            f"| {r['ms_without']:.3f} [{r['ms_without_min']:.3f}-{r['ms_without_max']:.3f}] "
            f"| {r['ms_with']:.3f} [{r['ms_with_min']:.3f}-{r['ms_with_max']:.3f}] "
            f"| {r['tok_s_without']:.0f} | {r['tok_s_with']:.0f} "
            f"| {r['speedup']:.3f} [{r['round_ratio_min']:.3f}-{r['round_ratio_max']:.3f}] "
            f"| {r['ratio_of_medians']:.3f} |" + aa)
    return "\n".join(lines + ["", TABLE_LEGEND])
