"""NOTE [per-machine pipelines candidates] (hetpart/pipelines_per_machine.py): `--parallel data --max-tensor-parallel
N --tensor-parallel-per-machine` tries each kind of machine at the other end of the best uniform degree, keeps the
fastest plan of everything searched, and bounds it by the least of the bounds searched."""

import json
import re

import pytest

from hetpart.cli import main
from hetpart.devices import load_cluster
from hetpart.pipelines_per_machine import place_kinds


def test_places_of_one_kind_are_the_machines_alike():
    kinds = place_kinds(load_cluster("preset:hetero-64"))
    assert len(kinds) == 8 and len(set(kinds.values())) == 4  # h, a, s, l: two machines each
    assert kinds["h-0:h100-80g"] == kinds["h-1:h100-80g"] != kinds["l-0:l4-24g"]


def test_the_search_tries_each_kind_at_the_other_degree_and_keeps_the_fastest(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
                 "--set", "block_size=32", "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2",
                 "--mode", "training", "--schedule", "1f1b", "--cluster", "preset:mixed-4", "--parallel", "data",
                 "--max-tensor-parallel", "2", "--tensor-parallel-per-machine", "--time-limit", "20",
                 "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # (the console wraps long lines)
    num = lambda v: float(v.replace(",", ""))  # noqa: E731
    uniform = {int(t): num(v) for t, v in re.findall(r"degree (\d): ([\d,.]+) us, \d+ pipeline", text)}
    best = min(uniform.values())
    tried = re.findall(r"tensor parallel per machine: (a \(a100-80g\) TP (\d), b \(t4-16g\) TP (\d)): ([\d,.]+) us "
                       r"\(bound ([\d,.]+) us\)", text)
    # A degree pruned by its bound (NOTE [degrees share the time limit] 4) has no plan: it is not the best.
    pruned = {int(t) for t in re.findall(r"degree (\d): pruned \(bound", text)}
    assert set(uniform) | pruned == {1, 2} and set(uniform) != pruned
    other = 1 if uniform.get(2, best + 1) < uniform.get(1, best + 1) else 2  # each kind at the best degree's other
    # To TP 1 the slowest link (b's PCIe) first, to TP 2 the fastest (a's NVLink) first; the second kind is tried
    # from the first's assignment where that won, and that is uniform (searched already): skipped.
    first = (other, 3 - other) if other == 2 else (3 - other, other)
    degrees = [(int(a), int(b)) for _, a, b, _, _ in tried]
    values = [best] + [num(v) for *_, v, _ in tried]
    assert degrees == [first, first[::-1]] if values[1] >= best else degrees == [first]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["iteration_us"] == pytest.approx(min(values), abs=0.1)  # the echo rounds to 0.1 us
    assert plan["lower_bound_us"] <= min(num(b) for *_, b in tried) and "per-machine pipelines" in plan["bound_note"]
    assert ("kept degree" in text) == (plan["iteration_us"] == pytest.approx(best, abs=0.1))
