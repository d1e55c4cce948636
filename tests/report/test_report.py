"""report.html: written by every partition, self-contained, and it renders in headless Chromium.

The Chromium test keeps a screenshot (pytest's tmp dir, and out/test-artifacts/report.png).
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hetpart.report.blocks import coarsen_to_blocks
from hetpart.plan_report import load_plan
from hetpart.report import html
from hetpart.report.html import Block, BlockEdge, BlockGraph
from hetpart.ir import info
from tests.ir.stages import staged

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).parents[2]


def test_report_is_self_contained_and_names_every_device(partitioned):
    page = (partitioned.out / "report.html").read_text()
    plan = json.loads((partitioned.out / "plan.json").read_text())
    assert page.startswith("<!DOCTYPE html>")
    for forbidden in ("<script", "<link", "@import", "src=", "https://"):
        assert forbidden not in page
    assert set(re.findall(r"http://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace only
    assert set(re.findall(r"url\(([^)]*)\)", page)) == {"#arrow"}
    for d in plan["cluster"]["devices"]:
        assert d["name"] in page
    assert page.count('<rect x="') > 10 and "Schedule (GPipe, simulated)" in page


def test_report_renderer_never_imports_torch():
    code = "import sys, hetpart.report.html; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def _plan(stages: int = 2, baselines=None) -> dict:
    devices = [{"name": f"m/{k}", "type": "gpu", "machine": "m", "mem_bytes": 1 << 30} for k in range(stages + 1)]
    plan = {
        "model": {"model": "zoo:toy", "overrides": {}, "batch_size": 6, "seq_len": 8, "seed": 0}, "cluster": {"name": "toy", "devices": devices}, "mode": "inference",
        "objective": "throughput", "microbatches": 3, "microbatch_size": 2, "bottleneck_us": 12.0,
        "lower_bound_us": 11.0, "gap": 0.0833, "solver_status": "FEASIBLE", "predicted_samples_per_s": 1e5,
        "stages": [{"index": k, "device": f"m/{k}", "device_type": "gpu", "machine": "m", "node_count": 3,
                    "flops": 10**9, "predicted_time_us": 12.0 - k, "compute_us": 10.0 - k, "comm_in_us": float(k),
                    "comm_out_us": 1.0 if k < stages - 1 else 0.0, "memory_bytes": 3 << 20,
                    "capacity_bytes": 1 << 30} for k in range(stages)],
    }
    if baselines is not None:
        plan["baselines"] = baselines
    return plan


def render_report(plan: dict, graph: BlockGraph) -> str:
    """The page of a plan.json's contents, read as `inspect` and `run` read it."""
    return html.render_report(load_plan(Path("plan.json"), plan), graph)


def test_report_shows_baselines_split_blocks_and_idle_devices():
    graph = BlockGraph([Block("embed", {0: 4}), Block("layers.0", {0: 2, 1: 5}, 10**6), Block("head", {1: 3})],
                       [BlockEdge("embed", "layers.0", 64), BlockEdge("embed", "head", 32)])
    page = render_report(_plan(baselines=[{"name": "equal-layers", "bottleneck_us": 24.0, "feasible": True},
                                          {"name": "fits-nowhere", "bottleneck_us": None, "note": "too big"}]),
                         graph)
    assert "baseline equal-layers: bottleneck 24 us (2.00x the plan&#x27;s)" in page
    assert "baseline fits-nowhere: no plan (too big)" in page
    assert "7 nodes · stage 0+1" in page  # layers.0 is split: striped
    assert "idle: 0 / 1 GiB" in page  # m/2 runs no stage
    assert "embed → head: 32 B per microbatch" in page  # the skip edge
    assert render_report(_plan(), graph) == render_report(_plan(), graph)
    assert "No baselines recorded" in render_report(_plan(), graph)


def test_training_plan_draws_its_schedule_with_backwards():
    plan = _plan(stages=3)
    for s in plan["stages"]:
        s["backward_us"] = 2 * s["compute_us"]
    plan["schedule"] = "1f1b"
    page = render_report(plan, BlockGraph())
    assert "Schedule (1F1B, simulated)" in page
    assert page.count("<title>bwd microbatch ") == 3 * plan["microbatches"]
    assert page.count("<title>fwd microbatch ") == 3 * plan["microbatches"]


def test_blocks_group_nodes_by_top_level_module(annotated):
    ops_kinds = ("placeholder", "call_function", "output")
    with staged(annotated("gpt-small"), 2, ops_kinds) as gm:
        graph = coarsen_to_blocks(gm)
    ops = [n for n in gm.graph.nodes if n.op in ops_kinds]
    names = [b.name for b in graph.blocks]
    assert names[0] == "inputs" and names[-1] == "output"
    assert {"blocks.0", "blocks.1", "wte", "ln_f"} <= set(names)
    assert sum(sum(b.nodes_by_stage.values()) for b in graph.blocks) == len(ops)
    assert sum(b.flops for b in graph.blocks) == sum(info(n).flops or 0 for n in gm.graph.nodes)
    assert any(len(b.nodes_by_stage) == 2 for b in graph.blocks)  # the cut falls inside one block
    assert all(e.bytes > 0 and e.src != e.dst for e in graph.edges)


def _chromium(page: Path, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--window-size=1400,1000",
             "--hide-scrollbars", *args, page.as_uri()],
            capture_output=True, text=True, timeout=90)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or ":CONSOLE" in line and "ERROR" in line]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: apt-get install -y chromium")
def test_report_renders_in_headless_chromium(partitioned, tmp_path):
    page = partitioned.out / "report.html"
    plan = json.loads((partitioned.out / "plan.json").read_text())
    shot = tmp_path / "report.png"
    proc = _chromium(page, "--dump-dom", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console_errors(proc.stderr) == []
    for d in plan["cluster"]["devices"]:
        assert d["name"] in proc.stdout  # the DOM as Chromium built it
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    try:
        artifacts = REPO / "out" / "test-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, artifacts / "report.png")
    except OSError:
        pass  # a read-only checkout still has the screenshot in pytest's tmp dir


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: apt-get install -y chromium")
def test_console_error_check_catches_a_broken_page(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script>ok</body></html>")
    assert _console_errors(_chromium(page, "--dump-dom").stderr)


def test_a_stage_near_its_devices_memory_is_named_with_the_way_to_leave_room(partitioned):
    """NOTE [memory the runtime adds]: a stage over 95% of its device's memory gets the note, one under does not."""
    import io
    import json

    from rich.console import Console

    from hetpart.plan_report import load_plan
    from hetpart.report.table import memory_note, print_plan

    data = json.loads((partitioned.out / "plan.json").read_text())
    assert memory_note(load_plan(partitioned.out / "plan.json", data)) is None  # the mixed-4 GPUs: far from full
    stage = data["stages"][-1]
    for share, noted in ((0.949, False), (0.951, True)):
        stage["capacity_bytes"] = int(stage["memory_bytes"] / share)
        plan = load_plan(partitioned.out / "plan.json", data)
        note = memory_note(plan)
        assert (note is not None) == noted, (share, note)
        buf = io.StringIO()
        print_plan(plan, Console(file=buf, width=300))
        assert ("plan over 95% of their device's memory" in buf.getvalue()) == noted
    assert f"stage {stage['index']} on {stage['device']}: 95.1% of its" in note and "`mem_GiB`" in note
