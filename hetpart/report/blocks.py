"""The annotated FX graph coarsened to blocks (top-level modules) for report.html.

A node's block is the first module under the root in its `nn_module_stack`
(`wte`, `ln_f`), or that module's child when the child is an index of it
(`blocks.3`: one block per layer, not one for the whole ModuleList). Model
inputs form `inputs`, the output `output`; a weight joins its first reader's
block; a node without a module (a scalar computation) joins its first user's.
"""

from __future__ import annotations

import torch.fx as fx

from hetpart.ir import info
from hetpart.report.html import Block, BlockEdge, BlockGraph


def _module_block(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    paths = [path for path, _ in stack.values() if path and not path.startswith("_")]  # "_empty_nn_module..."
    if not paths:
        return None
    first = paths[0]
    if len(paths) > 1 and paths[1].startswith(first + ".") and paths[1][len(first) + 1:].isdigit():
        return paths[1]
    return first


def block_of_nodes(gm: fx.GraphModule) -> dict[str, str]:
    """node name -> block name."""
    block: dict[str, str] = {}
    deferred = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            block[n.name] = "inputs"
        elif n.op == "output":
            block[n.name] = "output"
        elif (found := _module_block(n)) is not None:
            block[n.name] = found
        else:
            deferred.append(n)
    for n in reversed(deferred):  # users first, so chains of scalars resolve
        users = [block[u.name] for u in n.users if u.name in block]
        block[n.name] = users[0] if users else "(top)"
    return block


def coarsen_to_blocks(gm: fx.GraphModule) -> BlockGraph:
    """Blocks in the order their first node appears, and the activation bytes between them."""
    where = block_of_nodes(gm)
    by_stage: dict[str, dict[int, int]] = {}
    flops: dict[str, int] = {}
    for n in gm.graph.nodes:  # blocks in the order of their own ops (not of weights or borrowed scalars)
        if n.op in ("placeholder", "output") or _module_block(n) is not None:
            by_stage.setdefault(where[n.name], {})
    for n in gm.graph.nodes:
        b = where[n.name]
        by_stage.setdefault(b, {})
        flops[b] = flops.get(b, 0) + (info(n).flops or 0)
        stage = info(n).stage
        if stage is not None and n.op != "get_attr":
            by_stage[b][stage] = by_stage[b].get(stage, 0) + 1
    edges: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str]] = set()  # a value pays once per block that reads it
    for n in gm.graph.nodes:
        for a in n.all_input_nodes:
            src, dst = where[a.name], where[n.name]
            if a.op == "get_attr" or src == dst or (a.name, dst) in seen:
                continue
            seen.add((a.name, dst))
            edges[src, dst] = edges.get((src, dst), 0) + (info(a).out_bytes or 0)
    # Blocks with no staged node (a module whose only node is a weight read elsewhere) and edges
    # of scalars only (a batch size read by a view) carry nothing worth drawing: leave them out.
    blocks = [Block(name, dict(sorted(counts.items())), flops[name]) for name, counts in by_stage.items() if counts]
    kept = {b.name for b in blocks}
    return BlockGraph(blocks, [BlockEdge(s, d, nbytes) for (s, d), nbytes in edges.items()
                               if nbytes > 0 and s in kept and d in kept])
