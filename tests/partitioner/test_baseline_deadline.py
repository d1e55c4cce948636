"""Issue 19: every step of the data-parallel solve keeps to --time-limit. A step whose deadline has gone begins no
work and says what it left out (NOTE [baseline deadline]); the checks count calls into the work, not seconds."""

from __future__ import annotations

import pytest

import hetpart.partitioner.pipeline_baselines as pb
import hetpart.partitioner.pipeline_search as ps
from hetpart.errors import HetpartError
from hetpart.partitioner.pipeline_baselines import pipeline_baselines
from hetpart.partitioner.pipeline_search import plan_with_baselines
from hetpart.partitioner.solve import SolveOptions

from test_pipeline_search import small_problem


def _forbid(monkeypatch, module, *names: str) -> list[str]:
    """Replace `names` in `module` by functions that record the call and fail: work begun past its deadline."""
    calls: list[str] = []

    def forbidden(name: str):
        def f(*_a, **_k):
            calls.append(name)
            raise AssertionError(f"{name} began past its deadline")
        return f

    for name in names:
        monkeypatch.setattr(module, name, forbidden(name))
    return calls


def _one_f1b(seeds=range(40)):
    """Small problems in training under 1F1B, with their seeds."""
    for seed in seeds:
        p, M = small_problem(seed)
        if p.training is not None and p.training.schedule == "1f1b":
            yield seed, p, M


def test_baselines_past_their_deadline_begin_no_work(monkeypatch):
    """Megatron and metis rank no layout (no block split, no evaluation) and one-pipeline starts no solve when the
    baselines' time is gone; each says so, none says that no layout fits."""
    p, M = small_problem(0)
    calls = _forbid(monkeypatch, pb, "_blocks_of", "evaluate", "solve")
    got = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=1e-9)}
    assert calls == [] and sorted(got) == ["megatron", "metis", "one-pipeline"]
    assert all(b.plan is None for b in got.values())
    for name in ("megatron", "metis"):
        assert "found before its deadline" in got[name].note and "none was tried" in got[name].note
        assert "fits in memory" not in got[name].note
    assert got["one-pipeline"].note.startswith("not run: nothing was left of the baselines' 1e-09 s")


def test_the_layout_baselines_are_checked_once_and_one_pipeline_runs_in_the_time_left():
    """Megatron's and metis' plans come checked (`plan_with_baselines` does not check them again); with time left,
    one-pipeline runs and its plan is not marked checked (NOTE [baseline deadline])."""
    checked = 0
    for seed, p, M in _one_f1b():
        got = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=30)}
        if got["one-pipeline"].plan is None:
            continue
        assert not got["one-pipeline"].checked
        for name in ("megatron", "metis"):
            assert got[name].checked == (got[name].plan is not None)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_a_search_past_its_deadline_solves_no_shape_and_says_so(monkeypatch):
    """`--parallel data` with its whole limit gone: the search solves no shape, no baseline begins, and the error
    names both (raise --time-limit), rather than working past the limit."""
    seed, p, M = next(_one_f1b())
    calls = _forbid(monkeypatch, pb, "_blocks_of", "evaluate", "solve")
    calls += _forbid(monkeypatch, ps, "_solve_shape_why", "solve_outer")
    with pytest.raises(HetpartError) as e:
        plan_with_baselines(p, M, SolveOptions(time_limit_s=1e-9), baseline_limit_s=1e-9)
    assert calls == [], seed
    msg = str(e.value)
    assert "no pipeline shape was solved within" in msg and "0 tried" in msg and "raise --time-limit" in msg
    assert "none of the baselines (megatron, metis, one-pipeline) has a plan" in msg


def test_strategy_checks_a_layout_baseline_s_plan_once(monkeypatch):
    """`--strategy megatron` / `metis`: the baseline's plan comes checked, so `strategy_pipelines` does not run
    `pipelines_violations` on it again (each check re-evaluates every pipeline)."""
    real, seen = pb.pipelines_violations, []

    def counted(problem, plan, m):
        seen.append(plan)
        return real(problem, plan, m)

    monkeypatch.setattr(pb, "pipelines_violations", counted)
    done = set()
    for seed, p, M in _one_f1b():
        for name in ("megatron", "metis"):
            seen.clear()
            try:
                _, baselines = pb.strategy_pipelines(p, M, name, time_limit_s=30)
            except HetpartError:
                continue
            b = next(b for b in baselines if b.name == name)
            assert b.checked and sum(plan is b.plan for plan in seen) == 1, (seed, name)
            done.add(name)
        if done == {"megatron", "metis"}:
            break
    assert done == {"megatron", "metis"}


def test_megatron_and_metis_split_the_blocks_once(monkeypatch):
    """Both layout baselines read one block split (NOTE [equal blocks]), kept on the problem: 0.4 s on 3,690 nodes."""
    real, calls = pb._blocks_of, []
    monkeypatch.setattr(pb, "_blocks_of", lambda problem: calls.append(1) or real(problem))
    p, M = small_problem(0)
    got = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=30, single=False)}
    assert got["megatron"].plan is not None and got["metis"].plan is not None and len(calls) == 1
