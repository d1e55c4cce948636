"""Golden-file tests: the IR dumps of the zoo models after each pass, and the DOT of a partition.

To update after an intended change: HETPART_UPDATE_GOLDEN=1 pytest tests/ir
"""

import os
from pathlib import Path

import pytest

from hetpart.compile import analyze
from hetpart.ir import dump_dot, dump_text, graph_json

from tests.conftest import SMALL
from tests.ir.stages import staged

GOLDEN = Path(__file__).parents[1] / "golden"


def golden(name: str, text: str) -> str:
    """The golden file `name`; rewritten from `text` when HETPART_UPDATE_GOLDEN is set."""
    path = GOLDEN / name
    if os.environ.get("HETPART_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path.read_text()


@pytest.mark.parametrize("model", ["mlp", "gpt-small"])
def test_dump_after_op_cost_matches_golden(annotated, model):
    text = dump_text(annotated(model), "IR after 04 op-cost")
    assert text == golden(f"{model.replace('-', '_')}_after_op_cost.txt", text)


def test_every_numbered_dump_of_mlp_matches_golden(tmp_path, mixed4):
    analyze(SMALL["mlp"], mixed4, 2, dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.glob("*.txt"))
    assert names == ["00-export.txt", "01-shape.txt", "02-flops.txt", "03-memory.txt", "04-op-cost.txt"]
    for name in names:
        text = (tmp_path / name).read_text()
        assert text == golden(f"mlp/{name}", text), name
    assert "partition.dot" not in {p.name for p in tmp_path.iterdir()}  # no stages yet


def test_partition_dot_matches_golden_and_is_well_formed(annotated):
    with staged(annotated("mlp"), 3) as gm:
        text = dump_dot(gm)
    assert text == golden("mlp_partition.dot", text)
    assert text.count("{") == text.count("}") and text.count("subgraph cluster_stage_") == 3
    declared = {line.split('"')[1] for line in text.splitlines() if "[label=" in line}
    assert declared == {n.name for n in gm.graph.nodes}
    edges = [line.strip().rstrip(";").split(" -> ") for line in text.splitlines() if " -> " in line]
    assert all(a.strip('"') in declared and b.strip('"') in declared for a, b in edges)
    assert len(edges) == sum(len(n.all_input_nodes) for n in gm.graph.nodes)


def test_dump_is_aligned_and_free_of_addresses(annotated):
    text = dump_text(annotated("gpt-small"))
    assert "0x" not in text and " at " not in text
    columns = {line.index("   # ") for line in text.splitlines() if "   # " in line}
    assert len(columns) == 1  # annotations in one right-hand column


def test_graph_json_has_edges_and_annotations(annotated):
    data = graph_json(annotated("mlp"))
    names = {n["name"] for n in data["nodes"]}
    assert all(e["src"] in names and e["dst"] in names for e in data["edges"])
    linear = next(n for n in data["nodes"] if n["target"] == "aten.linear")
    assert linear["flops"] > 0 and set(linear["cost_ns"]) == {"a100-80g", "t4-16g"}
