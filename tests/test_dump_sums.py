"""What a plan's partition dump (ir/NN-partition.txt) adds up to: each stage's `stage=K` lines give plan.json's
`node_count` (README: "Reading the plan table") and `compute_us`, tensor-parallel plans too (NOTE [tensor-parallel
costs] in hetpart/passes/tp_lower.py; review22 left both)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from hetpart.cli import main

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set",
       "block_size=32", "--batch-size", "4", "--seq-len", "16", "--microbatches", "2", "--no-pt2"]
TIME = {"us": 1.0, "ms": 1000.0}


def _partition_dump(out: Path) -> str:
    (dump,) = (p for p in (out / "ir").iterdir() if p.name.endswith("-partition.txt"))
    return dump.read_text()


def _stage_lines(dump: str, k: int) -> list[str]:
    return [line for line in dump.splitlines() if re.search(rf"\bstage={k}$", line)]


def _text_sum_us(lines: list[str], device_type: str) -> tuple[float, float]:
    """The sum of the lines' forward and backward costs on `device_type` as printed (3 figures), and how far the
    rounding may put it from the exact sum."""
    total = slack = 0.0
    for line in lines:
        for value, unit in re.findall(rf"(?:^|\s)(?:bwd:)?{re.escape(device_type)}=([\d.]+)(us|ms)", line):
            total += float(value) * TIME[unit]
            slack += 0.5 * 10 ** (math.floor(math.log10(float(value))) - 2) * TIME[unit]
    return total, slack


def _check_stage_sums(out: Path) -> list[dict]:
    """Every stage of pipeline 0 (the one the dump shows): its lines' costs on its type sum to compute_us (exactly in
    graph.json, within the printed rounding in the text) and its forward ones to forward_us, their flops to its
    flops; its lines less the getitems are its node_count."""
    plan = json.loads((out / "plan.json").read_text())
    stages = plan["pipelines"][0]["stages"] if plan.get("pipelines") else plan["stages"]
    graph = json.loads((out / "ir" / "graph.json").read_text())["nodes"]
    dump = _partition_dump(out)
    for s in stages:
        k, ty = s["index"], s["device_type"]
        mine = [n for n in graph if n.get("stage") == k]
        forward_ns = sum(n.get("cost_ns", {}).get(ty, 0) for n in mine)
        assert round((forward_ns + sum(n.get("bwd_cost_ns", {}).get(ty, 0) for n in mine)) / 1000, 3) == s[
            "compute_us"], (k, ty)
        assert sum(n.get("flops", 0) for n in mine) == s["flops"], k
        if s.get("forward_us") is not None:
            assert round(forward_ns / 1000, 3) == s["forward_us"], (k, ty)
        lines = _stage_lines(dump, k)
        total, slack = _text_sum_us(lines, ty)
        assert abs(total - s["compute_us"]) <= slack + 1e-9, (k, ty, total, s["compute_us"])
        assert len(lines) - sum("= operator.getitem(" in line for line in lines) == s["node_count"], k
    return stages


@pytest.mark.parametrize("flags", [
    ["--cluster", "preset:mixed-4", "--mode", "training"],  # the rule every plan kept before TP (the control)
    ["--cluster", "preset:cpu-4", "--mode", "training", "--schedule", "1f1b", "--tensor-parallel", "2"],
    ["--cluster", "preset:cpu-4", "--tensor-parallel", "2"],  # inference: no backward column
    ["--cluster", "preset:cpu-4", "--mode", "training", "--tensor-parallel", "2", "--pipelines",
     "local/0,local/1;local/2,local/3"],  # several pipelines of TP stages: the dump shows pipeline 0's
    ["--cluster", "preset:mixed-4", "--mode", "training", "--tensor-parallel", "a=2,b=1"],  # degrees per machine
], ids=["mixed-4", "tp2-training", "tp2-inference", "tp2-pipelines", "tp-per-machine"])
def test_a_stage_s_dump_lines_sum_to_its_compute_and_count_its_nodes(flags, tmp_path, capsys):
    """review22: a TP plan's dump showed one device's costs (`cpu=36.7us`) and no `cpu/tp2`, so its lines did not
    sum to a TP stage's compute_us; and the table's `nodes` was not the count of its `stage=K` lines."""
    out = tmp_path / "out"
    assert main(["partition", *GPT, *flags, "--out", str(out)]) == 0
    capsys.readouterr()
    stages = _check_stage_sums(out)
    if "--tensor-parallel" in flags:
        (tp_type,) = {s["device_type"] for s in stages} - {"t4-16g"}  # (b's devices, at degree 1)
        one = tp_type.split("/")[0]
        dump = _partition_dump(out)
        assert re.search(rf" {one}=\S+ {tp_type}=\S+ ", dump)  # the one device's cost stays, beside the slot's
        assert (f" bwd:{tp_type}=" in dump) == ("training" in flags)
