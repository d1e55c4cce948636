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
    """Seeds of small problems in training under 1F1B whose one-pipeline baseline has a plan."""
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
    assert got["one-pipeline"].note.startswith("not run: 0.0 s of the baselines'")


def test_one_pipeline_is_not_begun_when_its_solve_is_expected_to_overrun(monkeypatch):
    """NOTE [baseline deadline]: with less time left than its solve is expected to take, one-pipeline is left out and
    says why; megatron and metis, within their deadlines, give the plans they give without the expectation."""
    checked = 0
    for seed, p, M in _one_f1b():
        full = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=30)}
        if full["one-pipeline"].plan is None:
            continue
        with monkeypatch.context() as m:
            calls = _forbid(m, pb, "solve")
            got = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=30, single_expect_s=31.0)}
        assert calls == [] and got["one-pipeline"].plan is None, seed
        assert "expected to take 31.0 s" in got["one-pipeline"].note
        for name in ("megatron", "metis"):
            assert (got[name].plan is None) == (full[name].plan is None)
            if got[name].plan is not None:
                assert got[name].plan.iteration_ns == full[name].plan.iteration_ns and got[name].checked
        # With the time its solve needs, it runs: the expectation only leaves out what would overrun.
        kept = {b.name: b for b in pipeline_baselines(p, M, time_limit_s=30, single_expect_s=0.01)}
        assert kept["one-pipeline"].plan is not None and not kept["one-pipeline"].checked
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


def test_the_search_reports_its_shape_solves_pace_for_the_baselines():
    """The search's stats carry its slowest shape solve per devices^1.5, the pace by which `plan_with_baselines`
    expects the one-pipeline solve (NOTE [baseline deadline]); a plan still comes with its baselines."""
    seed, p, M = next(_one_f1b())
    plan, baselines = plan_with_baselines(p, M, SolveOptions(time_limit_s=10), baseline_limit_s=5)
    assert plan.stats["shape_s_per_device_1_5"] > 0
    assert [b.name for b in baselines] == ["megatron", "metis", "one-pipeline"]
