"""plan.json carries the plan's certificate (NOTE [checked certificates])."""

from __future__ import annotations

from hetpart.compile import CompileOptions, plan_report
from hetpart.partitioner import solve
from hetpart.passes.lower import lower_to_problem
from tests.conftest import SMALL


def test_plan_json_names_the_bound_and_its_re_proof(annotated, mixed4):
    problem = lower_to_problem(annotated("mlp"), mixed4)
    plan = solve(problem, time_limit_s=10, check_certificate=True)
    stages = len(plan.device_of_stage)
    data = plan_report(SMALL["mlp"], mixed4, CompileOptions(), plan, 2, stage_flops=[0] * stages,
                       stage_param_bytes=[0] * stages, forward_ns=None, model_sha256=None, on_meta=False, gm_meta={},
                       baselines=[]).to_json()
    cert = data["certificate"]
    assert cert["bound_source"] == plan.certificate.bound_source != "none"
    assert data["solver_status"] == "OPTIMAL"  # a claim, so it was checked
    assert cert["verdict"] == "confirmed" and cert["checked_by"] in ("brute_force", "cpsat_no_presolve")
    assert cert["reproved_bound"] >= plan.lower_bound_ns
    unchecked = solve(problem, time_limit_s=10, check_certificate=False)
    assert unchecked.certificate.verdict == "not_checked" and unchecked.certificate.checked_by == ""
