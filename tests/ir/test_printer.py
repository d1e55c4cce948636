"""Golden-file test: the IR dump of zoo:mlp after all analysis passes.

To update after an intended change: HETPART_UPDATE_GOLDEN=1 pytest tests/ir
"""

import os
from pathlib import Path

from hetpart.ir import dump_text, graph_json

GOLDEN = Path(__file__).parents[1] / "golden" / "mlp_after_op_cost.txt"


def test_mlp_dump_matches_golden(annotated):
    text = dump_text(annotated("mlp"), "IR after 04 op-cost")
    if os.environ.get("HETPART_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


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
