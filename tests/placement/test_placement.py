"""The NeurIPS 2020 device-placement benchmark: reader, cost model, solver, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.placement import placement_loads, placement_violations, read_placement, solve_placement
from tests.placement.placement_cases import brute_force_placement

BENCH = Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "dnn-partitioning"


def _write(tmp_path: Path, nodes: list[dict], edges: list[dict], *, k: int, cpus: int = 1,
           max_size: float = 1e9, name: str = "case.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"maxSizePerFPGA": max_size, "maxFPGAs": k, "maxCPUs": cpus,
                                "nodes": nodes, "edges": edges}))
    return path


def _node(i: int, fpga: float, cpu: float, *, size: float = 0.0, color=None, backward: bool = False,
          on_fpga: bool = True) -> dict:
    node = {"id": i, "supportedOnFpga": int(on_fpga), "cpuLatency": cpu, "fpgaLatency": fpga,
            "isBackwardNode": int(backward), "size": size}
    if color is not None:
        node["colorClass"] = color
    return node


def _edges(pairs: list[tuple[int, int]], cost: dict[int, float]) -> list[dict]:
    return [{"sourceId": u, "destId": v, "cost": cost[u]} for u, v in pairs]


def test_hand_made_chain_optimum(tmp_path):
    # a->b->c->d, 4 on an accelerator, 10 on the CPU, each output costs 1 to move.
    # Two accelerators of two nodes: 4+4 + b's cost on the sender and on the receiver = 9 each.
    # The CPU cannot help (one node = 10); 1/3 splits give 13; one accelerator 16.
    nodes = [_node(i, 4.0, 10.0, size=1.0) for i in range(4)]
    path = _write(tmp_path, nodes, _edges([(0, 1), (1, 2), (2, 3)], {0: 1.0, 1: 1.0, 2: 1.0}), k=2, max_size=2.0)
    problem = read_placement(path)
    result = solve_placement(problem, time_limit_s=10)
    assert result.max_load == pytest.approx(9.0)
    assert result.lower_bound == pytest.approx(9.0, abs=1e-5)
    assert result.status == "OPTIMAL"
    assert [sorted(ids) for _, ids in result.devices] == [[0, 1], [2, 3]]


def test_cpu_pays_no_transfer_and_receivers_pay_once(tmp_path):
    # 0 fans out to 1 and 2; the accelerator of 0 pays 0's cost once, each receiving
    # accelerator once, and a CPU receiver nothing.
    nodes = [_node(0, 1.0, 50.0), _node(1, 1.0, 50.0), _node(2, 1.0, 2.0), _node(3, 1.0, 50.0)]
    problem = read_placement(_write(tmp_path, nodes, _edges([(0, 1), (0, 2), (0, 3)], {0: 5.0}), k=2))
    devices = [("fpga", [0, 1]), ("cpu", [2]), ("fpga", [3])]
    assert placement_violations(problem, devices) == []
    assert placement_loads(problem, devices) == [2.0 + 5.0, 2.0, 1.0 + 5.0]


def test_violations_name_every_broken_rule(tmp_path):
    nodes = [_node(0, 1, 1, size=3, color=7), _node(1, 1, 1, size=3, color=7), _node(2, 1, 1, on_fpga=False)]
    problem = read_placement(_write(tmp_path, nodes, _edges([(0, 1), (1, 2)], {0: 0, 1: 0}), k=2, max_size=4))
    text = "\n".join(placement_violations(problem, [("fpga", [0]), ("fpga", [1, 2])]))
    assert "colour class 7 is split" in text
    assert "not supported on an accelerator" in text
    assert "nodes without a device" not in text
    cyc = read_placement(_write(tmp_path, [_node(i, 1, 1) for i in range(3)],
                                _edges([(0, 1), (1, 2)], {0: 1, 1: 1}), k=2, name="cyc.json"))
    assert any("no device order" in v for v in placement_violations(cyc, [("fpga", [0, 2]), ("fpga", [1])]))


@pytest.mark.parametrize("seed", range(6))
def test_random_dags_match_brute_force(tmp_path, seed):
    rng = random.Random(seed)
    n = 6
    pairs = sorted({(u, v) for v in range(1, n) for u in rng.sample(range(v), rng.randint(1, min(2, v)))})
    cost = {i: rng.choice([0.0, 0.5, 1.5, 3.0]) for i in range(n)}
    training = seed % 2 == 1
    nodes = []
    for i in range(n):
        # Training-like cases: node i pairs with node n-1-i (a forward/backward colour class).
        color = min(i, n - 1 - i) if training else None
        nodes.append(_node(i, rng.choice([1.0, 2.0, 4.0]), rng.choice([3.0, 6.0, 9.0]), size=rng.choice([1, 2]),
                           color=color, backward=training and i >= n // 2, on_fpga=rng.random() > 0.1))
    problem = read_placement(_write(tmp_path, nodes, _edges(pairs, cost), k=2, max_size=5))
    want = brute_force_placement(problem)
    got = solve_placement(problem, time_limit_s=10, workers=1)
    assert placement_violations(problem, got.devices) == []
    assert got.max_load == pytest.approx(want)
    assert got.lower_bound <= got.max_load + 1e-9
    assert got.lower_bound == pytest.approx(want, abs=1e-4)


def test_reader_reports_malformed_inputs(tmp_path):
    with pytest.raises(HetpartError, match="missing top-level field 'maxFPGAs'"):
        read_placement(_bad(tmp_path))
    with pytest.raises(HetpartError, match="unknown node id"):
        read_placement(_write(tmp_path, [_node(0, 1, 1)], [{"sourceId": 0, "destId": 9, "cost": 1}], k=1))
    with pytest.raises(HetpartError, match="no such file"):
        read_placement(tmp_path / "missing.json")


def _bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"maxSizePerFPGA": 1, "maxCPUs": 1, "nodes": [], "edges": []}))
    return path


@pytest.mark.skipif(not BENCH.is_dir(), reason="the shared benchmark is not checked out next to the repo")
def test_benchmark_file_through_the_cli(capsys):
    # bert24 training (LayerGraphs): the authors' DP optimum is 41.745812 (benchmark README).
    assert main(["placement", str(BENCH / "LayerGraphs" / "bert24_training.json"), "--time-limit", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"maxLoad", "fpgas", "cpus", "lowerBound", "seconds"}
    assert len(out["fpgas"]) == 6 and len(out["cpus"]) == 1
    assert out["lowerBound"] <= out["maxLoad"]
    assert out["maxLoad"] == max(d["load"] for d in out["fpgas"] + out["cpus"])
    assert out["maxLoad"] == pytest.approx(41.745812, rel=1e-3)
    placed = sorted(i for d in out["fpgas"] + out["cpus"] for i in d["nodes"])
    assert placed == sorted(n["id"] for n in json.loads((BENCH / "LayerGraphs" / "bert24_training.json")
                                                         .read_text())["nodes"])


def test_cli_error_is_one_line(tmp_path, capsys):
    assert main(["placement", str(tmp_path / "nope.json")]) == 2
    assert "hetpart: error:" in capsys.readouterr().err


@pytest.mark.skipif(not BENCH.is_dir(), reason="the shared benchmark is not checked out next to the repo")
def test_same_input_same_placement():
    problem = read_placement(BENCH / "LayerGraphs" / "bert24_training.json")
    runs = [solve_placement(problem, time_limit_s=10, workers=1).to_json(problem) for _ in range(2)]
    for run in runs:
        run.pop("seconds")
    assert runs[0] == runs[1]
