"""What hetpart says is true of the user's input and plan (ux20): error advice written for one caller
(`partition again`, "pipelines of different shapes") was printed for others where it was false, a run that
writes no checkpoint said nothing, a re-plan named the devices lost but not those added. And ux21's: `run --measure`
set a training stage's measured forward against the plan's forward plus backward; and the five ux21 left (ux22): a
re-plan's idle devices "in no pipeline", a 1-device pipeline not called optimal, no predicted step for pipelines or
virtual stages in training, a changed file's advice that failed as printed (the 1F1B advice said twice: in
tests/partitioner/test_pipeline_idle.py)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from hetpart.cli import _print_measured, main
from hetpart.errors import HetpartError
from hetpart.passes.manager import check_dump_dir
from hetpart.runtime.artifacts import load_manifest, read_plan
from hetpart.runtime.checkpoint import check_checkpoint_dir
from hetpart.runtime.launch import RunOptions
from hetpart.partitioner.simulate import simulate
from hetpart.plan_report import simulation_inputs
from hetpart.report.table import idle_lines, simulated_step
from hetpart.runtime.measured import measurement
from hetpart.runtime.worker import rank_said


def test_a_file_at_the_checkpoint_dir_asks_for_another_dir_not_a_new_partition(tmp_path):
    ck = tmp_path / "notes.txt"
    ck.write_text("mine")
    with pytest.raises(HetpartError, match="is not a directory") as err:
        check_checkpoint_dir(ck, 0, 2, 1)
    assert "pass another --checkpoint-dir" in str(err.value) and "partition again" not in str(err.value)
    assert ck.read_text() == "mine"


def test_a_file_at_dump_ir_asks_for_another_dir_not_a_new_partition(tmp_path, capsys):
    where = tmp_path / "notes.txt"
    where.write_text("mine")
    with pytest.raises(HetpartError, match="is not a directory") as err:
        check_dump_dir(where)
    assert "choose another --dump-ir DIR" in str(err.value) and "partition again" not in str(err.value)
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2",
                 "--no-pt2", "--out", str(out), "--dump-ir", str(where)]) == 2
    assert "choose another --dump-ir DIR" in capsys.readouterr().err
    assert where.read_text() == "mine" and not out.exists()


def test_resume_of_a_file_says_it_is_not_a_directory(tmp_path):
    from hetpart.runtime.checkpoint import find_checkpoint

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(HetpartError, match="--resume .*notes.txt: not a directory"):
        find_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(HetpartError, match="--resume .*gone: no such directory"):
        find_checkpoint(tmp_path / "gone")


@pytest.mark.parametrize("every, steps, silent", [(3, 2, False), (2, 2, True), (3, 4, True)])
def test_a_run_whose_checkpoint_every_writes_none_says_so(tmp_path, monkeypatch, capsys, every, steps, silent):
    """`run --checkpoint-every 3 --steps 2` wrote no checkpoint and said nothing; the note comes before any rank
    starts (the launch is stopped right after it here)."""
    import hetpart.runtime.launch as launch

    out = tmp_path / "mlp"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2",
                 "--no-pt2", "--mode", "training", "--out", str(out)]) == 0
    capsys.readouterr()

    def stop(_out):
        raise HetpartError("stopped here by the test")

    monkeypatch.setattr(launch, "is_signed", stop)
    assert main(["run", str(out), "--mode", "training", "--steps", str(steps), "--checkpoint-every", str(every),
                 "--checkpoint-dir", str(tmp_path / "ck")]) == 2
    got = capsys.readouterr()
    assert "stopped here by the test" in got.err
    note = f"note: --checkpoint-every {every}: no step of this run (1 to {steps}) is a multiple of it"
    assert (note not in got.out + got.err) == silent


def test_replan_names_the_devices_it_added_as_it_names_those_lost(tmp_path, capsys):
    """`replan --add cpu@local` printed "re-planned in ... (no trace)" and nothing of the device it added, where
    `--lose` is named ("; lost: local/2")."""
    old = tmp_path / "mlp"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2",
                 "--no-pt2", "--mode", "training", "--out", str(old)]) == 0
    capsys.readouterr()
    assert main(["replan", str(old), "--add", "cpu@local", "--lose", "local/0", "--out", str(tmp_path / "new")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("re-planned "))
    assert line.endswith("; lost: local/0; added: local/2"), line


def test_virtual_stages_summary_gives_memory_in_the_table_s_units(tmp_path, capsys):
    """Each device's line read "4.0 MiB of 262144.0 MiB" beside a table in KiB/MiB/GiB ("/ 128 GiB" a stage)."""
    assert main(["partition", "zoo:mlp", "--cluster", "preset:cpu-4", "--out", str(tmp_path / "v"), "--schedule",
                 "interleaved-1f1b", "--mode", "training", "--no-pt2"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  local/")]
    assert len(lines) == 4 and all(x.endswith(" of 256 GiB") for x in lines), lines


def test_measure_sets_a_training_stage_s_forward_against_the_plan_s_forward(tmp_path, capsys):
    """NOTE [measured forward]: each rank's forward timed at twice the plan's forward reads 2.00; it read the
    forward over the forward plus backward (about 0.9 here), so a cost model 2x slow looked 10% fast."""
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2",
                 "--mode", "training", "--no-pt2", "--out", str(out)]) == 0
    manifest = load_manifest(out)
    plan, io = read_plan(out, manifest), tmp_path / "io"
    io.mkdir()
    for rank, stage in enumerate(plan.stages):
        took = [[stage.forward_us * 2e-6] * plan.microbatches] * 2
        (io / f"timing{rank}.json").write_text(json.dumps({"step_s": [0.01, 0.01], "forward_s": took,
                                                            "forward_cpu_s": took}))
    measured = measurement(io, manifest["world_size"], plan.microbatches, plan,
                           RunOptions("training", steps=2, schedule=plan.schedule), 1)
    # the training step simulated as partition prints it (report.table.simulated_step): it was null in training
    assert measured["predicted_step_time_us"] == pytest.approx(simulated_step(plan).step_ns / 1000, abs=1e-3)
    forward, transfer, _ = simulation_inputs(plan.stages, training=True)
    forward_only = simulate(forward, transfer, plan.microbatches, plan.schedule).step_ns / 1000
    assert forward_only < 0.8 * measured["predicted_step_time_us"]  # the control: the backwards are in it
    for row, stage in zip(measured["stages"], plan.stages, strict=True):
        assert row["predicted_forward_us"] == pytest.approx(stage.forward_us, abs=1e-3)
        assert stage.forward_us < 0.8 * stage.compute_us  # the control: the backward is in compute_us
    capsys.readouterr()
    _print_measured(measured, Console(width=200))
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == len(plan.stages) and all(r[-1] == "2.00" for r in rows), rows


def test_a_rank_s_error_names_its_rank_once(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    assert rank_said(HetpartError("rank 2: 'out/rank2/weights.safetensors' does not match")).count("rank 2: ") == 1
    assert rank_said(HetpartError("the batch is odd")) == "rank 2: the batch is odd"  # the control: named once


def _fake_timings(io, world: int, forwards_per_step: int) -> None:
    """timing{rank}.json as each rank of a 2-step run writes it, every forward at 1 ms."""
    io.mkdir()
    for rank in range(world):
        took = [[1e-3] * forwards_per_step] * 2
        (io / f"timing{rank}.json").write_text(json.dumps({"step_s": [0.01, 0.01], "forward_s": took,
                                                            "forward_cpu_s": took}))


@pytest.mark.parametrize("flags, mode", [
    (["--cluster", "preset:mixed-4", "--parallel", "data", "--mode", "training"], "training"),  # 1-stage pipelines
    (["--cluster", "preset:cpu-2", "--schedule", "interleaved-1f1b", "--mode", "training"], "training"),  # V = 2
    (["--cluster", "preset:cpu-2", "--mode", "training"], "inference"),  # an inference run of a training plan
    (["--cluster", "preset:cpu-2"], "training"),  # a training run of an inference plan: none, and why
])
def test_measure_predicts_the_step_of_pipelines_and_virtual_stages_or_says_why_not(tmp_path, capsys, flags, mode):
    """NOTE [predicted step] (ux21): measured.json's `predicted_step_time_us` was null in training for several
    data-parallel pipelines and for virtual stages, so `run --measure` printed the measured step alone; an inference
    run of a training plan played each stage's forward plus backward as its forward."""
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=3", "--batch-size", "24",
                 "--microbatches", "6", "--no-pt2", "--time-limit", "5", *flags, "--out", str(out)]) == 0
    manifest = load_manifest(out)
    plan, world = read_plan(out, manifest), manifest["world_size"]
    _fake_timings(tmp_path / "io", world, plan.microbatches * len(plan.stages) // world)
    measured = measurement(tmp_path / "io", world, plan.microbatches, plan,
                           RunOptions(mode, steps=2, schedule=plan.schedule), 1)
    got, what = measured["predicted_step_time_us"], measured["predicted_step"]
    capsys.readouterr()
    _print_measured(measured, Console(width=300))
    step_line = capsys.readouterr().out.splitlines()[-1]
    if "--parallel" in flags:  # 1-stage pipelines: the schedule is each one's share of forwards and backwards,
        # so the prediction is the plan's iteration, the slowest pipeline + the gradient sync, as partition prints
        assert all(len(q.stages) == 1 for q in plan.pipelines) and len(plan.pipelines) > 1 and plan.grad_sync_us > 0
        assert got == pytest.approx(plan.iteration_us, abs=2e-3) and "gradient sync" in what
    elif plan.virtual_stages:  # the step partition simulates for the plan, over 2 ranks of 2 stages each
        assert world == 2 and len(plan.stages) == 4
        assert got == pytest.approx(simulated_step(plan).step_ns / 1000, abs=1e-3) and "2 ranks of 2" in what
    elif mode == "inference":  # forwards only: under the plan's step of forwards and backwards
        forward, transfer, _ = simulation_inputs(plan.stages, training=True)
        assert got == pytest.approx(simulate(forward, transfer, plan.microbatches).step_ns / 1000, abs=1e-3)
        assert got < 0.6 * simulated_step(plan).step_ns / 1000  # the control: what it read before, backwards in
    else:
        assert got is None and "partitioned for inference" in what
        assert step_line.endswith(f"({what})"), step_line
    if got is not None:
        assert f"simulated {got / 1e3:.2f} ms ({what}" in step_line, step_line


@pytest.fixture(scope="module")
def p4_replan(tmp_path_factory):
    """ux21's `p4` (2 pipelines of 2 stages on cpu-4, training) re-planned after local/3 died: the printed lines of
    the re-plan and its plan.json."""
    import contextlib
    import io

    old = tmp_path_factory.mktemp("p4") / "p4"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--cluster", "preset:cpu-4", "--mode",
                 "training", "--pipelines", "local/0,local/1;local/2,local/3", "--no-pt2", "--out", str(old)]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["replan", str(old), "--lose", "local/3", "--out", f"{old}-replan"]) == 0
    return printed.getvalue(), json.loads((old.parent / "p4-replan" / "plan.json").read_text())


def test_a_data_parallel_re_plan_says_why_each_idle_device_is_idle(p4_replan):
    """NOTE [re-plan idle reasons] (ux21): "idle: local/1, local/2: in no pipeline" in the output and plan.json."""
    printed, plan = p4_replan
    idle = plan["devices_idle"]
    assert set(idle) == {"local/0", "local/1", "local/2"} - set(plan["devices_used"]) and idle, plan["devices_used"]
    kinds = ("memory", "not planned", "stage limit", "too slow to help", "left out", "microbatches", "link", "bytes",
             "not shown to help")
    assert all(why.split(":")[0] in kinds for why in idle.values()), idle
    words = " ".join(printed.split())  # (rich wraps the lines)
    assert all(" ".join(line.split()) in words for line in idle_lines(idle)), printed


def test_a_pipeline_on_one_device_is_optimal_at_its_time(p4_replan):
    """NOTE [a pipeline's own bound] (ux21): a 1-stage pipeline printed "(solver FEASIBLE)" and plan.json's
    `lower_bound_us` 0.0, where its one plan is optimal."""
    printed, plan = p4_replan
    one = [q for q in plan["pipelines"] if len(q["devices"]) == 1]
    assert one, plan["pipelines"]  # the re-plan: one pipeline, on local/0
    for q in one:
        assert q["solver_status"] == "OPTIMAL" and q["lower_bound_us"] == q["time_us"] > 0
        assert f"pipeline {q['index']}: 1 stage(s)" in printed
    assert "(solver FEASIBLE)" not in printed and all(q["lower_bound_us"] != 0 for q in plan["pipelines"])


def test_the_advice_for_a_changed_rank_file_is_a_partition_that_replaces_the_directory(tmp_path, capsys):
    """ux21: "rank 1: '.../weights.safetensors' does not match its sha256 in manifest.json ...; re-run `hetpart
    partition`", which, run again on that --out, ends "already exists; pass --force to replace it"."""
    import shlex

    from hetpart.runtime.artifacts import check_listed_files, check_rank_files

    args = ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "64", "--microbatches", "2",
            "--cluster", "preset:cpu-2", "--no-pt2"]  # two ranks (test_errors.py's)
    out = tmp_path / "my plan"  # a space: the printed command quotes it
    assert main(["partition", *args, "--out", str(out)]) == 0
    weights = out / "rank1" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rank1/weights.safetensors' does not match its sha256" in err, err
    printed = err.split("re-run `", 1)[1].split("`", 1)[0]
    assert printed.startswith("hetpart partition ... --out "), err
    argv = shlex.split(printed.replace("...", shlex.join(args)))  # the model and flags in place of its "..."
    assert main(argv[1:]) == 0, capsys.readouterr().err  # as printed: no "already exists"
    manifest = load_manifest(out)
    check_listed_files(out, manifest)
    for entry in manifest["ranks"]:
        check_rank_files(out, entry)  # every file as the manifest says: the changed one replaced
