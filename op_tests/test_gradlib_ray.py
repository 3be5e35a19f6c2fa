"""The tuner on Ray (``--ray``), on a local CPU-only Ray cluster this module starts: end-to-end runs equal to
``--mp 1`` runs, faulting candidates recorded failed exactly as in ``--mp``, an actor killed mid-task replaced and
the task retried on the new one (bounded), the driver SIGKILLed mid-run then resumed. Ray is an optional extra
(``pip install .[ray]``; CI installs it): without it these tests skip, except the one checking the error message."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

import op_tests.gradlib_fakes  # noqa: F401  (registers fake, fakelt, fakeslow in this process too)
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.timing import TimingConfig
from gradlib import gemm_tuner
from gradlib.gemm_tuner import main
from gradlib.pool import ItemDone, PoolError, TaskDone
from gradlib.records import TIME, Task
from op_tests.runtime_helpers import kill_then_resume, repo_env

try:
    import ray
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is an optional extra: pip install '.[ray]' (CI installs it)")

PLUGIN = "op_tests.gradlib_fakes"
QUICK = TimingConfig(warmup=1, reps=3, target_us=0, budget_s=0.2)
NAMES = list(op_tests.gradlib_fakes.FAKE_BEHAVIOURS)
# Seconds one candidate may run in these tests: the "hangs" fake costs this much per run. The first candidate of a
# fresh worker also pays for input set-up and torch's first matmul: it took over 2 s once on a 2-core machine busy
# with a Ray cluster (then the --mp run recorded good_fast as timed out), so 10 s (5 s was a 2.5x margin).
TIMEOUT = 10


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster of 2 CPUs and no GPU for this module; yields its GCS address (for other drivers).
    The actors see no GPU (so fake backends' sleeps are what gets timed) and import this checkout first."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDA_VISIBLE_DEVICES", "")
    mp.setenv("PYTHONPATH", repo_env()["PYTHONPATH"])
    mp.setenv("RAY_DISABLE_USAGE_STATS", "1")
    # Ray's workers take their environment from the cluster, not from a test: the actors' CPU timings read the
    # fakes' virtual clock (conftest.virtual_clock) for every test of this module.
    mp.setenv(op_tests.gradlib_fakes.VIRTUAL_CLOCK_ENV, "1")
    hold = tmp_path_factory.mktemp("ray_hold") / "hold"  # the actors' fakes stop while it exists (kill tests)
    mp.setenv(op_tests.gradlib_fakes.HOLD_ENV, str(hold))
    # address="local": always a new cluster of our own, never one that happens to run on this machine
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        mp.undo()


# CPU tuner workers (conftest.cpu_tuner_workers) for every test here but GPU-marked ones.
pytestmark = pytest.mark.usefixtures("cpu_tuner_workers", "virtual_clock")


def _untuned(tmp_path: Path, text: str, name: str = "untuned.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _run(*args: object) -> int:
    return main([*map(str, args), "--plugin", PLUGIN])


def _winners(path: Path) -> dict[tuple, tuple]:
    return {(r["gfx"], r["M"], r["N"], r["K"], r["bias"]): (r["libtype"], r["solidx"], r["kernelName"])
            for r in read_csv_rows(path)[1]}


def _collect(ex, n_items: int, deadline_s: float = 120.0, seen: list | None = None) -> tuple[dict, list]:
    """Poll ``ex`` until a TaskDone: the item results by index (asserting one per item) and the done tasks;
    ``seen`` are events already polled."""
    results, done = {}, []
    deadline = time.monotonic() + deadline_s
    pending = list(seen or [])
    while not done and time.monotonic() < deadline:
        events, pending = pending + ex.poll(0.5), []
        for ev in events:
            if isinstance(ev, ItemDone):
                assert ev.result.index not in results, f"two results for item {ev.result.index}"
                results[ev.result.index] = ev.result
            elif isinstance(ev, TaskDone):
                done.append(ev.task)
    assert done, f"no TaskDone within {deadline_s} s; results so far {sorted(results)}"
    assert sorted(results) == list(range(n_items))
    return results, done


def _fake_task(behaviours: list[str], task_id: int = 0) -> Task:
    sols = tuple(Solution("fake", NAMES.index(b), 0, b) for b in behaviours)
    return Task(task_id, 0, TIME, GemmProblem(3, 16, 8), sols, QUICK, check=False)


# ---- CLI runs against --mp 1 ---------------------------------------------------------------------------------------
@needs_ray
def test_ray_tunes_end_to_end_like_mp(tmp_path, ray_cluster, capsys):
    untuned = _untuned(tmp_path, "M,N,K\n1,64,32\n17,96,64\n97,40,24\n")
    mp_file, ray_file, summary = tmp_path / "mp.csv", tmp_path / "ray.csv", tmp_path / "summary.csv"
    # torch (one tick of the virtual clock) against fakeslow (20 ms a call): the winners cannot depend on load.
    assert _run("-i", untuned, "-o", mp_file, "--libtype", "torch,fakeslow", "--mp", 1) == 0
    capsys.readouterr()
    assert _run("-i", untuned, "-o", ray_file, "--libtype", "torch,fakeslow", "--ray", "auto", "--mp", 2,
                "--summary_file", summary) == 0
    out = capsys.readouterr().out
    assert "3 tuned, 0 skipped" in out and "0 worker restart(s); 2 worker(s) on cpu/" in out
    assert _winners(ray_file) == _winners(mp_file)
    assert {w[0] for w in _winners(ray_file).values()} == {"torch"}
    rows = read_csv_rows(ray_file)[1]
    # two actors finish in either order; each shape once
    assert sorted((int(r["M"]), r["N"], r["K"]) for r in rows) == [(1, "64", "32"), (17, "96", "64"), (97, "40", "24")]
    assert all(r["gfx"] == "cpu" and float(r["us"]) > 0 and float(r["err_ratio"]) <= 0.05 for r in rows)
    assert [s["timed"] for s in read_csv_rows(summary)[1]] == ["2", "2", "2"]
    # Resume: a second --ray run finds every shape tuned.
    assert _run("-i", untuned, "-o", ray_file, "--libtype", "torch,fakeslow", "--ray", "auto") == 0
    assert "0 tuned, 3 skipped" in capsys.readouterr().out


@needs_ray
def test_ray_faulty_candidates_recorded_as_in_mp(tmp_path, ray_cluster, capsys):
    untuned = _untuned(tmp_path, "M,N,K\n3,64,32\n")
    prof = {k: tmp_path / f"profile_{k}.csv" for k in ("mp", "ray")}
    tuned = {k: tmp_path / f"tuned_{k}.csv" for k in ("mp", "ray")}
    # No confirmation rounds (as test_gradlib_e2e's faulty-candidate test): with them good_fast (F.linear in float32
    # plus casts) must also beat the torch baseline by --min_gain on this CPU, a timing coin flip that failed in all
    # 5 runs on 2026-11-23 (the previous commit's too); what is tested here is how faulty candidates are recorded.
    assert _run("-i", untuned, "-o", tuned["mp"], "--libtype", "fake", "--timeout", TIMEOUT, "--profile_file",
                prof["mp"], "--mp", 1, "--confirm_rounds", 0) == 0
    capsys.readouterr()
    assert _run("-i", untuned, "-o", tuned["ray"], "--libtype", "fake", "--timeout", TIMEOUT, "--profile_file",
                prof["ray"], "--ray", "auto", "--confirm_rounds", 0) == 0
    assert "3 worker restart(s)" in capsys.readouterr().out  # hangs (timeout), exits, sigkill
    assert _winners(tuned["ray"]) == _winners(tuned["mp"])
    assert next(iter(_winners(tuned["ray"]).values())) == ("fake", "0", "good_fast")

    def statuses(path: Path) -> dict[tuple, str]:
        return {(r["libtype"], r["kernelName"]): r["status"] for r in read_csv_rows(path)[1]}

    assert statuses(prof["ray"]) == statuses(prof["mp"])  # same candidates ok / inaccurate / failed
    errors = {r["kernelName"]: r["error"] for r in read_csv_rows(prof["ray"])[1] if r["libtype"] == "fake"}
    assert errors["hangs"] == f"timed out after {TIMEOUT} s (actor killed)"
    assert "died" in errors["exits"] and "died" in errors["sigkill"]
    assert "fake kernel launch failure" in errors["raises"]  # an exception costs no actor
    assert errors["good_fast"] == errors["good_slow"] == ""


@needs_ray
def test_ray_sigkill_driver_then_resume(tmp_path, ray_cluster):
    shapes = [(m, 32, 32) for m in range(1, 9)]
    untuned = _untuned(tmp_path, "M,N,K\n" + "".join(f"{m},{n},{k}\n" for m, n, k in shapes))
    tuned = tmp_path / "tuned.csv"
    # A second driver joins this module's cluster by its address, as a tuner joins an existing cluster.
    cmd = [sys.executable, "-m", "gradlib.gemm_tuner", "-i", str(untuned), "-o", str(tuned), "--libtype",
           "fakeslow", "--batch", "1", "--plugin", PLUGIN, "--ray", ray_cluster]
    kill_then_resume(cmd, repo_env(CUDA_VISIBLE_DEVICES=""), tmp_path, tuned, shapes,
                     lambda r: (int(r["M"]), int(r["N"]), int(r["K"])), 2)


# ---- the executor on its own ---------------------------------------------------------------------------------------
@needs_ray
def test_actor_killed_mid_task_is_replaced_and_the_task_retried(ray_cluster):
    from gradlib.ray_executor import RayExecutor

    task = _fake_task(["good_fast", "hangs", "good_fast", "good_slow"])
    with RayExecutor("auto", [None], [PLUGIN], timeout=600) as ex:
        first_where = ex._slots[0].where
        ex.submit(task)
        deadline, seen = time.monotonic() + 60, []
        while ex._slots[0].running != 1 and time.monotonic() < deadline:  # item 0 done, the hanging one running
            seen += ex.poll(0.1)
        assert ex._slots[0].running == 1
        time.sleep(0.3)
        ray.kill(ex._slots[0].actor)  # as a lost node or an OOM kill would: not the candidate's own doing
        results, _ = _collect(ex, len(task.items), seen=seen)
        restarts, second_where = ex.restarts, ex._slots[0].where
    assert results[0].ok and results[2].ok and results[3].ok and results[3].us > 4000  # good_slow sleeps 5 ms
    assert not results[1].ok and "died" in results[1].error and first_where in results[1].error
    assert restarts == 1 and second_where != first_where  # the rest ran on a new actor


@needs_ray
def test_retries_after_actor_deaths_are_bounded(ray_cluster):
    from gradlib.ray_executor import RayExecutor

    task = _fake_task(["sigkill", "sigkill", "good_fast", "good_fast"])
    with RayExecutor("auto", [None], [PLUGIN], timeout=60, max_retries=1) as ex:
        ex.submit(task)
        results, _ = _collect(ex, len(task.items))
        assert ex.restarts == 2
        ex.submit(_fake_task(["good_fast"], task_id=1))  # the slot serves the next task on its new actor
        after, _ = _collect(ex, 1)
    assert all("died" in results[i].error for i in (0, 1))
    assert all(not results[i].ok and "not run: 2 actor deaths" in results[i].error for i in (2, 3))
    assert after[0].ok


@needs_ray
def test_actor_that_cannot_start_is_a_pool_error(ray_cluster):
    from gradlib.ray_executor import RayExecutor

    ex = RayExecutor("auto", [None], ["op_tests.no_such_plugin"], timeout=60)
    try:
        with pytest.raises(PoolError, match="failed to start 3 times.*no_such_plugin"):
            ex.start()
    finally:
        ex.close()


@needs_ray
def test_more_gpu_actors_than_cluster_gpus_is_an_error(ray_cluster):
    from gradlib.ray_executor import GPU, RayExecutor, ray_worker_devices

    assert ray_worker_devices("auto", None) == [None]  # no GPU in the cluster: one CPU actor
    assert ray_worker_devices("auto", 2) == [None, None]
    ex = RayExecutor("auto", [GPU], [PLUGIN])
    with pytest.raises(PoolError, match="1 GPU actor.*has 0 GPU"):
        ex.start()
    ex.close()


def test_without_ray_the_flag_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as on a machine without it
    code = _run("-i", _untuned(tmp_path, "M,N,K\n1,8,8\n"), "-o", tmp_path / "t.csv", "--ray", "auto")
    assert code == 2 and "pip install 'aiter_gemm[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_gpu_cluster_from_a_driver_without_gpu_is_refused(tmp_path, monkeypatch, capsys):
    import gradlib.ray_executor as rx

    # A GPU cluster seen from a CPU-only driver: --libtype would be resolved to torch alone, so the run is refused.
    monkeypatch.setattr(rx, "ray_worker_devices", lambda address, mp: [rx.GPU, rx.GPU])
    monkeypatch.setattr(gemm_tuner.torch.cuda, "is_available", lambda: False)
    code = _run("-i", _untuned(tmp_path, "M,N,K\n1,8,8\n"), "-o", tmp_path / "t.csv", "--ray", "auto")
    assert code == 2 and "this driver sees none" in capsys.readouterr().err


def _node_loss_scenario() -> None:
    """Run in a subprocess (a process joins one Ray cluster only): a two-node cluster whose worker node is removed
    while its actor runs a candidate; prints each item's result and where the task ended."""
    import json

    from ray.cluster_utils import Cluster

    from gradlib.ray_executor import RayExecutor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    doomed = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    cluster.wait_for_nodes()
    task = _fake_task(["good_fast", "hangs", "good_fast"])
    try:
        with RayExecutor("auto", [None], [PLUGIN], timeout=600) as ex:
            first = ex._slots[0].where
            ex.submit(task)
            deadline, seen = time.monotonic() + 60, []
            while ex._slots[0].running != 1 and time.monotonic() < deadline:
                seen += ex.poll(0.1)
            cluster.add_node(num_cpus=1)  # where the retry can go
            cluster.remove_node(doomed)  # the node is lost in the middle of item 1
            results, _ = _collect(ex, len(task.items), seen=seen)
            out = {"first": first, "second": ex._slots[0].where, "restarts": ex.restarts,
                   "results": [(results[i].ok, results[i].error) for i in range(len(task.items))]}
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))


@needs_ray
def test_node_lost_mid_task_is_retried_on_another_node(tmp_path):
    import json

    env = repo_env(CUDA_VISIBLE_DEVICES="", RAY_DISABLE_USAGE_STATS="1")
    code = "from op_tests.test_gradlib_ray import _node_loss_scenario; _node_loss_scenario()"
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=240)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    (ok0, _), (ok1, err1), (ok2, _) = out["results"]
    assert ok0 and ok2 and not ok1 and "died" in err1, out
    node = lambda where: where.split(" on node ")[1]  # noqa: E731
    assert out["restarts"] == 1 and node(out["second"]) != node(out["first"]), out
