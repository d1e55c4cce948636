"""The annotated FX graph coarsened to blocks for report.html.

NOTE [report blocks]: a block is a repeated layer where the model has them, else the
module one level under any wrapper. From a node's `nn_module_stack` (outermost first):
- the outermost path that ends in an index is its block: `blocks.3`, `model.layers.3`
  (HF Llama), `transformer.h.0` (GPT-2), `encoder.block.1` (T5, whose blocks hold indexed
  `layer.0` too: the outer index wins);
- else the outermost path that is not a wrapper, a wrapper being a module some block
  is under (`model`, `model.layers`, `encoder`): `wte`, `model.embed_tokens`, `lm_head`;
- else (code in a wrapper's own forward: HF's mask and rotary tables) the innermost path.
So `zoo:` models keep their `blocks.3`, and an HF model's one box `model` becomes its
embeddings, layers and head. Model inputs form `inputs`, the output `output`; a weight
joins its first reader's block; a node without a module (a scalar computation) joins its
first user's.
"""

from __future__ import annotations

import torch.fx as fx

from hetpart.ir import info
from hetpart.report.html import Block, BlockEdge, BlockGraph


def _module_paths(node: fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    return [path for path, _ in stack.values() if path and not path.startswith("_")]  # "_empty_nn_module..."


def _is_indexed(path: str) -> bool:
    return path.rpartition(".")[2].isdigit()


def _wrappers(gm: fx.GraphModule) -> set[str]:
    """Every module path that holds an indexed block below it (NOTE [report blocks])."""
    found: set[str] = set()
    for n in gm.graph.nodes:
        for path in _module_paths(n):
            if _is_indexed(path):
                parts = path.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts)))
                break
    return found


def _module_block(node: fx.Node, wrappers: set[str]) -> str | None:
    """The node's block (NOTE [report blocks]), or None when no module ran it."""
    paths = _module_paths(node)
    if not paths:
        return None
    indexed = next((p for p in paths if _is_indexed(p)), None)
    if indexed is not None:
        return indexed
    return next((p for p in paths if p not in wrappers), paths[-1])


def block_of_nodes(gm: fx.GraphModule) -> dict[str, str]:
    """node name -> block name."""
    block: dict[str, str] = {}
    deferred = []
    wrappers = _wrappers(gm)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            block[n.name] = "inputs"
        elif n.op == "output":
            block[n.name] = "output"
        elif (found := _module_block(n, wrappers)) is not None:
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
    wrappers = _wrappers(gm)
    by_stage: dict[str, dict[int, int]] = {}
    flops: dict[str, int] = {}
    for n in gm.graph.nodes:  # blocks in the order of their own ops (not of weights or borrowed scalars)
        if n.op in ("placeholder", "output") or _module_block(n, wrappers) is not None:
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
