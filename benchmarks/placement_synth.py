"""A 2,000-node training input for `hetpart placement`: bert_l-3 training with its middle encoder layer repeated.

The NeurIPS'20 benchmark's largest training graph (about 2,000 operators, 6 accelerators) is not
public here; this builds one of its shape from the public bert_l-3 training graph. Layer 1 (the
colour classes of the forward operators between the layer-0 and layer-1 output LayerNorms, with
their backward operators and the AccumulateGrad operators that only touch them) is copied between
layers 1 and 2, each copy wired to its neighbours as layer 1 is wired to layers 0 and 2 (found by
matching layer 1 onto layer 2 with networkx's isomorphism matcher); inputs shared by every layer
(the attention mask) feed every copy.

    .venv/bin/python benchmarks/placement_synth.py --nodes 2000 --fpgas 6 --out /tmp/bert_synth_training.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import networkx as nx
from networkx.algorithms.isomorphism import DiGraphMatcher

# The shared benchmark next to the checkout (../shared from the main checkout, ../../shared from a worktree).
BENCH = next((p / "shared" / "benchmarks" / "dnn-partitioning" for p in Path(__file__).resolve().parents
              if (p / "shared" / "benchmarks" / "dnn-partitioning").is_dir()), Path("../shared/benchmarks/dnn-partitioning"))
SOURCE = "OperatorGraphs/bert_l-3_training.json"
# Forward operator ids of encoder layers 1 and 2 in the source (MatMul10 .. LayerNormalization5_sa,
# MatMul18 .. LayerNormalization7_sa), read off its topological order.
LAYER_1, LAYER_2 = range(131, 176), range(176, 221)


def _block(data: dict, forward_ids: range) -> set[int]:
    """The nodes of the colour classes of `forward_ids`, and the classless nodes that only touch them."""
    classes = {n["colorClass"] for n in data["nodes"] if n["id"] in forward_ids and "colorClass" in n}
    block = {n["id"] for n in data["nodes"] if n.get("colorClass") in classes}
    near: dict[int, set[int]] = {}
    for e in data["edges"]:
        near.setdefault(e["sourceId"], set()).add(e["destId"])
        near.setdefault(e["destId"], set()).add(e["sourceId"])
    classless = {n["id"] for n in data["nodes"] if "colorClass" not in n}
    grown = True
    while grown:
        grown = False
        for v in classless - block:
            if near.get(v) and near[v] <= block | classless and near[v] & block:
                block.add(v)
                grown = True
    return block


def repeat_layers(data: dict, total_nodes: int, fpgas: int) -> dict:
    """`data` (bert_l-3 training) with layer 1 copied until it has about `total_nodes` nodes."""
    byid = {n["id"]: n for n in data["nodes"]}
    b1, b2 = _block(data, LAYER_1), _block(data, LAYER_2)
    g = nx.DiGraph()
    g.add_nodes_from(byid)
    g.add_edges_from((e["sourceId"], e["destId"]) for e in data["edges"])
    same = lambda a, b: (a["kind"] == b["kind"])  # noqa: E731
    for v in g:
        n = byid[v]
        g.nodes[v]["kind"] = (n["isBackwardNode"], round(n["fpgaLatency"], 6), round(n["cpuLatency"], 6),
                              n.get("size", 0.0), "colorClass" in n)
    matcher = DiGraphMatcher(g.subgraph(b1), g.subgraph(b2), node_match=same)
    phi = next(matcher.isomorphisms_iter())  # layer 1 -> layer 2
    inv = {w: v for v, w in phi.items()}
    copies = max(0, round((total_nodes - len(byid)) / len(b1)))
    next_id = max(byid) + 1
    next_class = max(n.get("colorClass", 0) for n in data["nodes"]) + 1
    nodes = [dict(n) for n in data["nodes"]]
    cost = {e["sourceId"]: e["cost"] for e in data["edges"]}
    edges = [(e["sourceId"], e["destId"]) for e in data["edges"] if not (e["sourceId"] in b1 and e["destId"] in b2)
             and not (e["sourceId"] in b2 and e["destId"] in b1)]
    prev = {v: v for v in b1}  # the block before the next copy: layer 1, then each copy
    for _ in range(copies):
        cid, cls = {}, {}
        for v in sorted(b1):
            cid[v] = next_id
            next_id += 1
            node = dict(byid[v], id=cid[v], name=f"{byid[v].get('name', v)}_copy{cid[v]}")
            if "colorClass" in node:
                cls.setdefault(node["colorClass"], next_class + len(cls))
                node["colorClass"] = cls[node["colorClass"]]
            nodes.append(node)
        next_class += len(cls)
        for v in b1:
            cost[cid[v]] = cost.get(v, 0.0)
        edges += [(cid[u], cid[v]) for u, v in g.subgraph(b1).edges]
        # Layer 1 -> layer 2 edges join the previous block to this copy, and back for the gradients.
        edges += [(prev[u], cid[inv[w]]) for u, w in g.edges if u in b1 and w in b2]
        edges += [(cid[inv[w]], prev[u]) for w, u in g.edges if w in b2 and u in b1]
        # Inputs and outputs shared with layer 2 (the attention mask) are shared by every copy.
        edges += [(z, cid[v]) for z, v in g.edges if v in b1 and z not in b1 | b2 and g.has_edge(z, phi[v])]
        edges += [(cid[v], z) for v, z in g.edges if v in b1 and z not in b1 | b2 and g.has_edge(phi[v], z)]
        prev = cid
    edges += [(prev[u], w) for u, w in g.edges if u in b1 and w in b2]
    edges += [(w, prev[u]) for w, u in g.edges if w in b2 and u in b1]
    return {"maxSizePerFPGA": data["maxSizePerFPGA"], "maxFPGAs": fpgas, "maxCPUs": data["maxCPUs"],
            "nodes": nodes, "edges": [{"sourceId": u, "destId": v, "cost": cost.get(u, 0.0)}
                                      for u, v in dict.fromkeys(edges)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, default=BENCH, help="the dnn-partitioning benchmark folder")
    ap.add_argument("--nodes", type=int, default=2000, help="about how many nodes")
    ap.add_argument("--fpgas", type=int, default=6, help="maxFPGAs of the new input")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write")
    args = ap.parse_args()
    data = repeat_layers(json.loads((args.bench / SOURCE).read_text()), args.nodes, args.fpgas)
    args.out.write_text(json.dumps(data))
    print(f"wrote {args.out}: {len(data['nodes'])} nodes, {len(data['edges'])} edges, {args.fpgas} accelerators")


if __name__ == "__main__":
    main()
