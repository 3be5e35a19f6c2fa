"""The tuner's confirmation rounds (gradlib.search): winners re-timed beside the default and the baseline, padded
probes, and the finalists that decide close libraries side by side. Times are injected; nothing is measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aiter_gemm.backends.base import GemmProblem, Solution
from gradlib.records import ENUMERATE, TIME, ItemResult
from gradlib.search import SearchOptions, ShapeSearch
from op_tests.test_gradlib import _enum


# ---- confirmation of winners (issue 13) ------------------------------------------------------------------------
def test_pad_probes_are_the_lowest_m_of_each_range_and_the_middle():
    from gradlib.search import pad_probes

    assert pad_probes(1024, 4096, 4096) == [513, 768, 993]  # gl1 513..1024, gl0 993..1024, middle of the widest
    assert pad_probes(16, 4096, 4096) == [1, 8, 9]  # gl0 1..16 (pads to 16), gl1 9..16
    assert pad_probes(32, 4096, 4096) == [17, 24]  # both levels start at 17
    assert pad_probes(777, 4096, 4096) == []  # nothing pads to 777: exact use only
    assert pad_probes(1, 4096, 4096) == []


F_LINEAR = Solution("torch", 0, 0, "F.linear")
HEURISTIC = Solution("heur", 0, 0, "a default heuristic")


def _confirm_drive(search: ShapeSearch, times: dict, default: Solution = HEURISTIC) -> list:
    """Drive a search whose full phase makes "tri" solidx 0 the winner (F.linear where only torch is asked for),
    resolve the runtime's default to ``default`` at every M, then answer the confirmation with
    ``times[(M, slot)]`` for slot in winner / default / torch (by what the item runs)."""
    from gradlib.records import DEFAULT, DEFAULTS

    def full(task):
        return [ItemResult(task.task_id, i, True, us=5.0 if s.libtype == "tri" else 9.0, err_ratio=0.0)
                for i, s in enumerate(task.items)]

    def confirm(task):
        out = []
        for i, s in enumerate(task.items):
            runs = default if s == DEFAULT else s
            slot = "default" if runs == HEURISTIC else "winner" if runs.libtype == "tri" else "torch"
            out.append(ItemResult(task.task_id, i, True, us=times[(task.problem.M, slot)], err_ratio=0.0,
                                  solutions=(default,) if s == DEFAULT else ()))
        return out

    tasks = []
    while not search.done:
        task = search.next_task(len(tasks))
        tasks.append(task)
        if task.kind == ENUMERATE:
            results = _enum(0, 1)(task)
        elif task.kind == DEFAULTS:
            results = [ItemResult(task.task_id, i, True, solutions=(default,)) for i in range(len(task.items))]
        elif task.problem.M == search.problem.M and search.phase == "full":
            results = full(task)
        else:
            results = confirm(task)
        for res in results:
            search.on_item(res)
        search.on_task_done(task)
    return tasks


def _times(ms, winner, default, torch_us):
    return {(m, k): v for m in ms for k, v in (("winner", winner(m)), ("default", default), ("torch", torch_us))}


PROBES_1024 = [1024, 513, 768, 993]  # M and its three padding probes


def test_confirmation_keeps_a_winner_that_holds_and_records_its_padding_range():
    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("tri",), confirm_rounds=2, min_gain=1.02))
    tasks = _confirm_drive(s, _times(PROBES_1024, lambda m: 11.0 if m < 700 else 5.0, 10.0, 10.0))
    (defaults,) = [t for t in tasks if t.kind == "defaults"]
    assert defaults.items == (1024, 513, 768, 993)  # resolved once, before anything is timed
    confirm = [t for t in tasks if t.kind == TIME and len(t.items) == 6]
    assert sorted(t.problem.M for t in confirm) == sorted(PROBES_1024)
    for t in confirm:  # 2 rounds of (winner, default, torch), the second in reverse order
        assert [s.libtype for s in t.items] == ["tri", "<default>", "torch", "torch", "<default>", "tri"]
    o = s.outcome
    assert o.winner.solution.libtype == "tri" and o.winner.us == 5.0
    assert o.pad_m_min == 768  # held at 993 and 768 (5 us against 10); lost at 513 (11 against 10)


def test_confirmation_times_every_candidate_in_graphs_of_the_same_length():
    """Each confirmation timing's calls per replay come from the winner's full-phase time, not the candidate's own
    eager estimate: a replay's fixed start-up spread over fewer calls read a costlier-to-launch default slower."""
    from aiter_gemm.timing import calls_per_rep
    from gradlib.search import CONFIRM

    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("tri",), confirm_rounds=2, min_gain=1.02))
    tasks = _confirm_drive(s, _times(PROBES_1024, lambda m: 5.0, 10.0, 10.0))
    confirm = [t for t in tasks if t.kind == TIME and len(t.items) == 6]
    assert confirm and {t.timing.per_call_us for t in confirm} == {5.0}  # the full phase's winner: 5 us
    assert {t.timing.per_call_us for t in tasks if t.kind == TIME and t not in confirm} == {0.0}
    cfg = replace(CONFIRM, per_call_us=5.0)
    assert calls_per_rep(3.0, 4, cfg) == calls_per_rep(40.0, 4, cfg) == 100  # 500 us at 5 us a call
    assert calls_per_rep(3.0, 4, CONFIRM) == 164 and calls_per_rep(40.0, 4, CONFIRM) == 12  # own estimates
    assert calls_per_rep(0.01, 3, CONFIRM) == 1998 and calls_per_rep(1e6, 3, CONFIRM) == 3  # capped, >= the sets


def test_confirmation_pad_range_stops_at_the_first_probe_that_loses():
    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("tri",), confirm_rounds=2, min_gain=1.02))
    _confirm_drive(s, _times(PROBES_1024, lambda m: 12.0 if m == 768 else 5.0, 10.0, 10.0))
    assert s.outcome.winner.solution.libtype == "tri" and s.outcome.pad_m_min == 993  # 768 lost: 513 untrusted


def test_confirmation_replaces_a_winner_that_does_not_hold_by_the_faster_of_default_and_baseline():
    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("tri",), confirm_rounds=2, min_gain=1.02))
    _confirm_drive(s, _times(PROBES_1024, lambda m: 9.9, 10.0, 10.0))  # 1% faster: noise, not a win
    o = s.outcome
    assert o.winner.solution == HEURISTIC  # what the default ran (F.linear was not 2% faster than it)
    assert o.pad_m_min == 1024 and o.searched.solution.libtype == "tri"  # exact use only; the search's pick kept
    assert o.probes[0].M == 1024 and not o.probes[0].passed


def test_confirmation_never_times_a_solution_against_itself():
    """A default that runs F.linear (every CPU shape) is timed as F.linear, once; a winner that is also the default
    and the baseline (F.linear on CPU) has nothing to be confirmed against: no confirmation timing at all, and the
    row serves every M its probes cover (before, F.linear had to beat itself by 2%: a coin flip, usually lost, and
    13 of the 17 timings of a quick-start M = 16 shape)."""
    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("tri",), confirm_rounds=2, min_gain=1.02))
    tasks = _confirm_drive(s, _times(PROBES_1024, lambda m: 5.0, 99.0, 10.0), default=F_LINEAR)
    confirm = tasks[[t.kind for t in tasks].index("defaults") + 1:]
    assert sorted(t.problem.M for t in confirm) == sorted(PROBES_1024)
    assert all([x.libtype for x in t.items] == ["tri", "<default>", "<default>", "tri"] for t in confirm)
    assert (s.outcome.winner.solution.libtype, s.outcome.pad_m_min) == ("tri", 513)
    assert s.outcome.probes[0].default_us == s.outcome.probes[0].baseline_us == 10.0  # the default ran F.linear

    s = ShapeSearch(0, GemmProblem(1024, 96, 64), SearchOptions(("torch",), confirm_rounds=2, min_gain=1.02))
    tasks = _confirm_drive(s, {}, default=F_LINEAR)  # a timing asked for would be a KeyError
    assert [t.kind for t in tasks] == ["enumerate", "time", "defaults", "time"]  # the last one empty
    assert tasks[-1].items == () and s.outcome.winner.solution == F_LINEAR and s.outcome.winner.us == 9.0
    assert s.outcome.pad_m_min == 513 and all(p.passed for p in s.outcome.probes)


# ---- finalists: close libraries decided in the confirmation rounds ---------------------------------------------
X0, X1 = Solution("x", 0, 0, "x0"), Solution("x", 1, 0, "x1")
Y0, Z0 = Solution("y", 0, 0, "y0"), Solution("z", 0, 0, "z0")
#: Full-phase times: the pick x0, y0 2% behind it, x1 (the pick's own libtype) and z0 (20% behind) never finalists.
FULL_US = {X0: 100.0, X1: 101.0, Y0: 102.0, Z0: 120.0, F_LINEAR: 200.0}


def _finalist_drive(opts: SearchOptions, confirm_us: dict, incumbent: Solution | None = None):
    """A search of (1024, 96, 64) over x0, x1, y0, z0 (F.linear the baseline) timed ``FULL_US`` in the full phase
    and ``confirm_us`` (by what an item runs; the default runs ``HEURISTIC``) in the confirmation rounds; (search,
    its confirmation tasks)."""
    from gradlib.records import DEFAULT, DEFAULTS

    s = ShapeSearch(0, GemmProblem(1024, 96, 64), opts, (X0, X1, Y0, Z0), F_LINEAR, incumbent)
    tasks, confirm = [], []
    while not s.done:
        task = s.next_task(len(tasks))
        tasks.append(task)
        if task.kind == DEFAULTS:
            results = [ItemResult(task.task_id, i, True, solutions=(HEURISTIC,)) for i in range(len(task.items))]
        else:
            times = FULL_US if s.phase == "full" else confirm_us
            if s.phase == "confirm":
                confirm.append(task)
            results = [ItemResult(task.task_id, i, True, us=times[HEURISTIC if x == DEFAULT else x], err_ratio=0.0,
                                  solutions=(HEURISTIC,) if x == DEFAULT else ()) for i, x in enumerate(task.items)]
        for res in results:
            s.on_item(res)
        s.on_task_done(task)
    return s, confirm


def _names(task) -> list[str]:
    return [x.kernelName or x.libtype for x in task.items]


CONFIRM_US = {X0: 105.0, X1: 90.0, Y0: 98.0, Z0: 80.0, HEURISTIC: 200.0, F_LINEAR: 200.0}


def test_a_finalist_of_another_library_with_the_better_confirmation_median_is_written():
    """The full phase ranks x0 2% ahead of y0, timed one after the other (a heating GPU reads later candidates
    slower); in the same confirmation rounds y0 is faster: y0 is written, with its padding range, and the profile
    lists its timings; x0 is noted as the search's pick."""
    s, confirm = _finalist_drive(SearchOptions(("x", "y", "z"), confirm_rounds=2, min_gain=1.02), CONFIRM_US)
    o = s.outcome
    assert o.winner.solution == Y0 and o.winner.us == 98.0 and o.winner.phase == "confirm"
    assert o.winner.result.err_ratio == 0.0 and o.winner.index == 2  # y0's full-phase record (kernelId)
    assert o.searched.solution == X0 and o.pad_m_min == 513  # beat default and F.linear at every probe
    for task in confirm:  # every M: the pick and y0, then the default and F.linear, alternating
        assert _names(task) == ["x0", "y0", "<default>", "F.linear", "F.linear", "<default>", "y0", "x0"]
    rows = [c for c in o.candidates if c.phase.startswith("confirm M=1024")]
    assert sorted(c.solution.kernelName for c in rows if c.solution == Y0) == ["y0", "y0"]


def test_only_finalists_within_the_margin_join_the_confirmation():
    """z0 (20% behind the pick) is outside the default 1.15 margin and x1 is of the pick's own library: neither is
    timed again, so neither can win there, however fast the confirmation would have read them."""
    s, confirm = _finalist_drive(SearchOptions(("x", "y", "z"), confirm_rounds=2, min_gain=1.02), CONFIRM_US)
    timed = {x for task in confirm for x in task.items}
    assert Y0 in timed and not {X1, Z0} & timed and s.outcome.winner.solution == Y0
    s, confirm = _finalist_drive(SearchOptions(("x", "y", "z"), confirm_rounds=2, min_gain=1.02,
                                               finalist_margin=1.25), CONFIRM_US)
    assert {x for task in confirm for x in task.items} >= {Y0, Z0} and s.outcome.winner.solution == Z0


@pytest.mark.parametrize("margin", [1.0, 0.0])
def test_finalist_margin_off_confirms_the_pick_alone(margin):
    """Margin 1 (or 0): the confirmation times the pick, the default and F.linear only, and writes the pick."""
    s, confirm = _finalist_drive(SearchOptions(("x", "y", "z"), confirm_rounds=2, min_gain=1.02,
                                               finalist_margin=margin), CONFIRM_US)
    assert confirm and all(_names(t) == ["x0", "<default>", "F.linear", "F.linear", "<default>", "x0"]
                           for t in confirm)
    o = s.outcome
    assert (o.winner.solution, o.winner.us, o.searched, o.pad_m_min) == (X0, 105.0, None, 513)


def test_the_incumbent_is_timed_once_in_the_finalists_rounds():
    """--compare: an incumbent that is also a finalist is timed once, and what it is weighed by is its median in
    the same rounds; the verdict keeps the row when that finalist wins."""
    from gradlib.compare import CompareOptions, verdict

    s, confirm = _finalist_drive(SearchOptions(("x", "y", "z"), confirm_rounds=2, min_gain=1.02), CONFIRM_US,
                                 incumbent=Y0)
    assert all(sum(x == Y0 for x in t.items) == 2 for t in confirm)  # once a round
    o = s.outcome
    assert o.incumbent.us == 98.0 and o.winner.solution == Y0
    assert verdict(o, True, CompareOptions()).action == "KEEP"


@pytest.mark.parametrize("module, args", [
    ("gradlib.gemm_tuner", ["--libtype", "torch"]),
    ("gradlib.tune_a8w8_blockscale", ["--nk", "128,128", "--m", "1"]),
    ("gradlib.tune_moe", ["--model_dir", "qwen3_30b_a3b", "--token", "1"]),
])
def test_finalist_margin_flag_reaches_the_search(module, args, tmp_path, monkeypatch, cpu_tuner_workers):
    import importlib

    from gradlib import cli

    tuner = importlib.import_module(module)
    jobs = []
    monkeypatch.setattr(cli, "build_executor", lambda *a: None)
    monkeypatch.setattr(tuner, "run", lambda job, executor, **kw: jobs.append(job) or 0)
    untuned = tmp_path / "untuned.csv"
    untuned.write_text("M,N,K\n4,64,32\n")
    extra = ["-i", str(untuned)] if module == "gradlib.gemm_tuner" else []
    for flag, margin in (([], 1.15), (["--finalist_margin", "1.3"], 1.3), (["--finalist_margin", "0"], 0.0)):
        assert tuner.main([*extra, *args, "-o", str(tmp_path / "t.csv"), *flag]) == 0
        assert jobs.pop().search.finalist_margin == margin
