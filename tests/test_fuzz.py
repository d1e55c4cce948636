"""Fuzzing: random DAG models on random clusters, through trace -> passes -> solve -> verify -> split.

Properties: the plan passes the independent verifier (hetpart.partitioner.verify_plan),
and the stages run back to back equal the original model, output for output, at the
traced batch and at another one. A cluster too small for the model must be refused
with the partitioner's memory explanation, never with anything else.

Profiles (HYPOTHESIS_PROFILE): "hetpart" (default) runs 60 examples, derandomized so
the suite is reproducible (sized to the suite's time budget: torch.export takes 4/5 of each
example); "long" runs 1,000 random ones (README, "Fuzzing"):

    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest -q tests/test_fuzz.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from hetpart.codegen import run_stages, split_stages, write_rank
from hetpart.devices.cluster import parse_cluster
from hetpart.errors import HetpartError
from hetpart.frontend import export_model
from hetpart.partitioner import solve, verify_plan
from hetpart.runtime.artifacts import load_stage
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from tests.fuzz_strategies import BATCH, NetSpec, build, cluster_tomls, contiguous_plans, example_inputs, net_specs

# No example database (nothing written to the checkout); no "explain" phase (minutes per failure).
_COMMON = dict(deadline=None, database=None, phases=[p for p in Phase if p is not Phase.explain],
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("hetpart", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=1000, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "hetpart"))

MICROBATCHES = 2
SOLVER_TIME_LIMIT_S = 2.0


@given(spec=net_specs(), toml=cluster_tomls(), seed=st.integers(0, 2**16), data=st.data())
def test_plans_verify_and_stages_equal_the_model(spec: NetSpec, toml: str, seed: int, data: st.DataObject):
    cluster = parse_cluster(toml, "fuzz.toml", "fuzz")
    module, inputs = build(spec, seed)
    gm = export_model(module, inputs)
    ctx = PassContext(device_types=cluster.device_types, batch_size=BATCH, microbatch_size=BATCH // MICROBATCHES)
    gm = PassManager(default_passes(), echo=lambda _: None).run(gm, ctx)
    problem = lower_to_problem(gm, cluster)
    try:
        plan = solve(problem, time_limit_s=SOLVER_TIME_LIMIT_S, seed=0)
    except HetpartError as err:
        assert str(err).startswith("partitioner: no plan fits in memory: "), str(err)
        event("refused: no plan fits in memory")
        return
    verify_plan(problem, plan)
    event(f"solver: {len(plan.device_of_stage)} stage(s) on {len(cluster.devices)} device(s)")
    _check_split(module, spec, gm, plan.stage_of, len(plan.device_of_stage), seed)
    # The solver seldom splits models this small: cut them at random too (any valid cut must run).
    stage_of = data.draw(contiguous_plans(problem.graph), label="random cut")
    num_stages = max(stage_of.values()) + 1
    event(f"random cut: {num_stages} stage(s)")
    _check_split(module, spec, gm, stage_of, num_stages, seed)


def _check_split(module, spec: NetSpec, gm, stage_of: dict[str, int], num_stages: int, seed: int) -> None:
    stages = split_stages(gm, stage_of, num_stages)
    for a, b in zip(stages, stages[1:]):
        assert a.outputs == b.inputs, "each stage sends exactly what the next receives"
    for batch in (BATCH, 3):  # the traced batch and another: the batch is dynamic
        x = example_inputs(spec, seed + 1, batch)
        with torch.no_grad():
            want, got = module(*x), run_stages(stages, *x)
        assert len(got) == len(want) == len(spec.outputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


@settings(max_examples=max(10, settings.default.max_examples // 8))
@given(spec=net_specs(max_ops=8), seed=st.integers(0, 2**16), data=st.data())
def test_generated_stage_files_equal_the_model(spec: NetSpec, seed: int, data: st.DataObject):
    """The shipped form: each stage as stage.py + weights.safetensors, imported as the runtime does."""
    cluster = parse_cluster('[[nodes]]\nname = "m"\ndevices = ["cpu", "cpu", "cpu", "cpu"]\n', "fuzz.toml", "fuzz")
    module, inputs = build(spec, seed)
    ctx = PassContext(device_types=cluster.device_types, batch_size=BATCH, microbatch_size=BATCH // MICROBATCHES)
    gm = PassManager(default_passes(), echo=lambda _: None).run(export_model(module, inputs), ctx)
    stage_of = data.draw(contiguous_plans(lower_to_problem(gm, cluster).graph), label="random cut")
    stages = split_stages(gm, stage_of, max(stage_of.values()) + 1)
    with tempfile.TemporaryDirectory(prefix="hetpart-fuzz-") as tmp:
        out = Path(tmp)
        loaded = []
        for s in stages:
            files = write_rank(out / f"rank{s.index}", s, f"fuzz stage {s.index}\n")
            loaded.append(load_stage(out, {"rank": s.index, "stage": s.index, "dir": f"rank{s.index}", "files": files}))
        x = example_inputs(spec, seed + 1, 3)
        with torch.no_grad():
            want, values = module(*x), x
            for stage in loaded:
                values = stage(*values)
    assert len(values) == len(want)
    for g, w in zip(values, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
