"""NOTE [tensor-parallel hint]: which refusals of `--parallel data` name --max-tensor-parallel. The search decides
where it refuses how many shapes it refused for memory (`PipelinesRefused.memory_refused`) and the hint reads that
count, one test per refusal path; the last test rewords the messages, which the regex over their words that decided
before would have missed."""

from __future__ import annotations

import re

import pytest
from test_pipeline_idle import _chain

from hetpart.compile import CompileOptions
from hetpart.compile_pipelines import _tp_hint, plan_data_parallel
from hetpart.errors import HetpartError
from hetpart.partitioner import Device, Link, pipeline_search
from hetpart.partitioner.infeasible import PipelinesRefused
from hetpart.partitioner.pipeline_shape import ShapeSolve
from hetpart.partitioner.problem import Problem, Training

_HINT = ("; tensor parallelism splits each weight and its training state over T devices of a machine: pass "
         "--max-tensor-parallel 8 (or --tensor-parallel T) to plan stages of TP groups")
# The regex that decided before (NOTE [tensor-parallel hint]); kept here only to show what it would miss.
_OLD_REGEX = re.compile(r"fills its memory|whose every stage fits|[1-9][\d,]* fit no plan in memory")


def _problem(devices: int, capacity: int, schedule: str, per_machine: int) -> Problem:
    """_chain's a -> b -> c, 100 bytes of activations a node (1 byte of weights each), 4 microbatches."""
    nodes = [f"n{i // per_machine}" for i in range(devices)]
    return Problem(graph=_chain(mem_bytes=100), weights={"wa": 1, "wb": 1, "wc": 1},
                   devices=[Device(f"g{i}", "gpu", nodes[i], capacity) for i in range(devices)],
                   intra_node_links={n: Link(1000, 0) for n in nodes}, network=Link(1000, 0),
                   training=Training(schedule, 4, {}))


def _stash_too_big() -> Problem:
    """Three 250-byte GPUs of one machine under GPipe: every stage of every plan stashes all 4 microbatches."""
    return _problem(3, 250, "gpipe", 3)


def _small_stages() -> Problem:
    """Four machines of two 150-byte GPUs under 1F1B: 4 devices hold the model in all, no stage its stash; shapes of
    3 and 4 machines (and more, the LP's), so that one may run out of time while the others are refused."""
    return _problem(8, 150, "1f1b", 2)


def _refused(problem: Problem, **asked) -> PipelinesRefused:
    with pytest.raises(PipelinesRefused) as e:
        plan_data_parallel(problem, CompileOptions(parallel="data", microbatches=4, time_limit_s=3, **asked))
    return e.value


def test_a_memory_refusal_at_one_device_per_stage_suggests_tensor_parallelism():
    """NOTE [shape misses]: every shape tried, none with a plan whose stages fit: the count is the shapes'."""
    e = _refused(_stash_too_big())
    shapes = int(re.search(r"none of the (\d+) pipeline shapes", str(e)).group(1))
    assert e.memory_refused == shapes >= 1
    assert str(e).endswith(_HINT) and str(e).count(_HINT) == 1


def test_a_degree_already_asked_gets_no_hint():
    """The same refusal with --max-tensor-parallel or --tensor-parallel given: the message is the search's own."""
    plain = str(_refused(_stash_too_big()))
    for asked in ({"max_tensor_parallel": 2}, {"tensor_parallel": 2}):
        e = _refused(_stash_too_big(), **asked)
        assert e.memory_refused >= 1 and str(e) == plain.removesuffix(_HINT), asked


def test_a_search_out_of_time_gets_the_hint_only_where_a_shape_had_no_plan_in_memory(monkeypatch):
    """The search's time runs out on the first shape it solves (its solve says so), the others have no plan that
    fits: shapes refused for memory, the hint. Every shape out of time: none for memory, no hint (raise --time-limit
    is what helps)."""
    real = pipeline_search._solve_shape_why
    out_of_time = ShapeSolve(None, timed_out=True, why="no plan of it was found in the 1 s it was given")
    for every in (False, True):
        calls = []

        def solve(problem, devices, *rest):
            calls.append(devices)
            return out_of_time if every or devices == calls[0] else real(problem, devices, *rest)

        monkeypatch.setattr(pipeline_search, "_solve_shape_why", solve)
        e = _refused(_small_stages())
        said = re.search(r"(\d+) tried: (\d+) fit no plan in memory, (\d+) ran out of the time", str(e))
        assert said is not None, str(e)
        tried, memory, late = map(int, said.groups())
        assert tried == len(calls) and late == (tried if every else calls.count(calls[0]))
        assert memory == (0 if every else len(set(calls) - {calls[0]})) and (every or memory >= 1), str(e)
        assert e.memory_refused == memory and str(e).endswith(_HINT) != every, str(e)


def test_a_batch_no_mix_of_shapes_runs_for_memory_gets_the_hint(monkeypatch):
    """NOTE [outer program]: the outer program proves that no mix runs the batch, each shape's plan holding the stash
    of at most 2 microbatches (test_a_batch_no_mix_of_shapes_can_run_is_refused_for_memory's): the refusal counts
    its solved shape, and `plan_with_baselines`, finding no baseline either, keeps the count."""
    from hetpart.partitioner.pipeline_outer import Candidate, solve_outer
    from hetpart.partitioner.pipeline_search import MachineKind, Shape

    kinds = [MachineKind("k0", (("gpu", 200),), (2,), ("n0", "n1"))]
    shape = Candidate(Shape(machines=(1,)), ("g0", "g1"), None, 2, 1, 2, 300, 100, [0, 0, 10, 10])
    with pytest.raises(PipelinesRefused) as outer:
        solve_outer(kinds, [shape], 5, 2, 5.0)
    assert outer.value.memory_refused == 1

    def search(*args, **kwargs):
        raise outer.value

    monkeypatch.setattr(pipeline_search, "_plan_and_facts", search)
    e = _refused(_small_stages())
    assert str(e).startswith(str(outer.value) + "; and none of the baselines") and str(e).endswith(_HINT)
    assert e.memory_refused == 1


def test_refusals_not_for_a_stages_memory_get_no_hint():
    """No set of the devices holds the model (TP adds no memory to the cluster), and a bad option (0 microbatches):
    no shape was refused for memory, the message is left as it is."""
    cluster = _refused(_problem(3, 50, "1f1b", 3))
    assert "no set of the 3 devices holds the model" in str(cluster) and cluster.memory_refused == 0
    assert not str(cluster).endswith(_HINT)
    with pytest.raises(HetpartError) as option:
        plan_data_parallel(_stash_too_big(), CompileOptions(parallel="data", microbatches=0, time_limit_s=3))
    assert "at least 1 microbatch" in str(option.value) and _HINT not in str(option.value)
    # The words alone, outside the search's refusal, decide nothing either.
    words = HetpartError("partitioner: none of the 2 pipeline shapes ... has a plan whose every stage fits")
    assert _OLD_REGEX.search(str(words)) and _tp_hint(words, CompileOptions(parallel="data")) is words


def test_a_reworded_memory_refusal_still_gets_the_hint(monkeypatch):
    """Negative control for the regex that decided before (`_OLD_REGEX`): the search's refusals reworded, none of
    its phrases left ("whose every stage fits", "N fit no plan in memory", "fills its memory"), still get the hint,
    the count being the search's. With `_tp_hint` matching the regex over the message instead, this test fails: the
    reworded refusals came back without the hint (checked by hand: see this commit's message)."""
    words = {"whose every stage fits": "with each stage inside its devices",
             "fit no plan in memory": "overflow their devices", "fills its memory": "overflows its devices"}

    class Reworded(PipelinesRefused):
        def __init__(self, message: str, memory_refused: int = 0) -> None:
            for old, new in words.items():
                message = message.replace(old, new)
            super().__init__(message, memory_refused)

    monkeypatch.setattr(pipeline_search, "PipelinesRefused", Reworded)
    every = _refused(_stash_too_big())
    real = pipeline_search._solve_shape_why
    calls = []

    def first_out_of_time(problem, devices, *rest):
        calls.append(devices)
        return ShapeSolve(None, timed_out=True) if devices == calls[0] else real(problem, devices, *rest)

    monkeypatch.setattr(pipeline_search, "_solve_shape_why", first_out_of_time)
    late = _refused(_small_stages())
    assert "none of the" in str(every) and "ran out of the time" in str(late)  # both paths of the search
    for e in (every, late):
        text = str(e).removesuffix(_HINT)
        assert not _OLD_REGEX.search(text) and any(new in text for new in words.values()), text
        assert e.memory_refused >= 1 and str(e).endswith(_HINT), str(e)


def test_the_search_solves_each_shape_once(monkeypatch):
    """The shapes' order put the first shape again among the LP's (reason19: the same devices solved twice, and
    counted twice among the "N tried" of an out-of-time refusal)."""
    real = pipeline_search._solve_shape_why
    calls = []

    def solve(problem, devices, *rest):
        calls.append(devices)
        return real(problem, devices, *rest)

    monkeypatch.setattr(pipeline_search, "_solve_shape_why", solve)
    for per_machine in (1, 2, 3):  # roomy GPUs: plans exist (4 calls for 3 shapes before, on 4 or 6 devices)
        calls.clear()
        plan_data_parallel(_problem(6, 10**6, "1f1b", per_machine),
                           CompileOptions(parallel="data", microbatches=4, time_limit_s=3))
        assert calls and len(calls) == len(set(calls)), calls
