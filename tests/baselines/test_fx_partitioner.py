import dataclasses

from hetpart.partitioner.verify import plan_violations
from hetpart.passes import lower_to_problem
from hetpart.baselines.fx_partitioner import _bytes_of, fx_baselines, fx_partition


def _tight(problem, gm, parts: int):
    """The same problem with devices that each hold about 1/parts of what the fx partitioner counts."""
    total = sum(_bytes_of(n) for n in gm.graph.nodes if n.op != "output")
    return dataclasses.replace(problem, devices=[dataclasses.replace(d, capacity_bytes=total // parts)
                                                 for d in problem.devices])


def test_real_memories_give_one_stage_on_the_largest_device(annotated, mixed4):
    gm = annotated("mlp")
    problem = lower_to_problem(gm, mixed4)
    size, kl = fx_baselines(gm, problem)
    assert [size.name, kl.name] == ["fx-size-based", "fx-kl-based"]
    for b in (size, kl):
        assert b.feasible and len(b.plan.device_of_stage) == 1
        biggest = max(problem.devices, key=lambda d: d.capacity_bytes)
        assert b.plan.device_of_stage == [biggest.name]


def test_tight_memory_splits_into_a_valid_pipeline(annotated, mixed4):
    gm = annotated("mlp")
    problem = _tight(lower_to_problem(gm, mixed4), gm, 3)
    for mode in ("fx-size-based", "fx-kl-based"):
        b = fx_partition(gm, problem, mode)
        assert b.plan is not None and len(b.plan.device_of_stage) > 1, b.note
        # Whatever fits the fx partitioner's byte count is costed and checked by our verifier.
        assert b.violations == plan_violations(problem, b.plan)
        assert b.bottleneck_ns == b.plan.bottleneck_ns > 0
        assert sorted(b.plan.stage_of) == sorted(problem.graph.nodes)


def test_not_enough_memory_is_the_partitioners_own_error(annotated, mixed4):
    gm = annotated("mlp")
    problem = _tight(lower_to_problem(gm, mixed4), gm, 100)
    b = fx_partition(gm, problem, "fx-size-based")
    assert not b.feasible and b.plan is None and "enough memory" in b.note


def test_kl_is_skipped_on_big_graphs(annotated, mixed4, monkeypatch):
    from hetpart.baselines import fx_partitioner as fxb

    gm = annotated("gpt-small")
    monkeypatch.setattr(fxb, "KL_MAX_NODES", len(gm.graph.nodes) - 1)
    b = fx_partition(gm, _tight(lower_to_problem(gm, mixed4), gm, 3), "fx-kl-based")
    assert b.plan is None and b.note.startswith("skipped")
