"""Each problem node's module, as frameworks place them (NOTE [export modules])."""

from __future__ import annotations

from hetpart.export.layers import layer_order
from hetpart.export.modules import annotate_modules
from hetpart.passes import lower_to_problem


def modules_of(gm, cluster) -> list[str]:
    problem = lower_to_problem(gm, cluster)
    annotate_modules(gm, problem)
    return layer_order(problem)


def test_flat_model_modules_are_its_top_level_modules_and_blocks(annotated, mixed4):
    names = modules_of(annotated("gpt-small"), mixed4)
    assert names[0] == "wte" and names[-2:] == ["ln_f", "lm_head"]
    assert [n for n in names if n.startswith("blocks")] == ["blocks.0", "blocks.1"]


def test_nested_model_skips_the_modules_that_hold_the_blocks(annotated, mixed4):
    """As in an HF model (`model.transformer.h.0`): `model` and `model.transformer` contain the
    blocks, so they are nobody's module, while `model.transformer.wte` and `model.lm_head` are."""
    gm = annotated("gpt-small")
    saved = {n: n.meta.get("nn_module_stack") for n in gm.graph.nodes}

    def nest(path: str) -> list[str]:
        """blocks.0.attn.qkv -> the HF-style paths of its stack entry, T5-like lists in lists:
        model.transformer.blocks.0.layer.0 (the inner list's module), then ...layer.0.attn.qkv."""
        if path == "lm_head":
            return ["model.lm_head"]
        out = []
        if ".attn" in path or ".mlp" in path:
            inner = "layer.0" if ".attn" in path else "layer.1"
            block, _, rest = path.partition(".attn" if ".attn" in path else ".mlp")
            if rest == "":  # the attn/mlp module itself: its list entry comes first
                out.append(f"model.transformer.{block}.{inner}")
            path = f"{block}.{inner}" + path[len(block):]
        return out + [f"model.transformer.{path}"]

    try:
        for node, stack in saved.items():
            if stack:
                entries = [("model", "HF"), ("model.transformer", "T")]
                entries += [(p, kind) for path, kind in stack.values() if path for p in nest(path)]
                node.meta["nn_module_stack"] = {f"e{i}": entry for i, entry in enumerate(entries)}
        names = modules_of(gm, mixed4)
    finally:
        for node, stack in saved.items():
            node.meta["nn_module_stack"] = stack
    assert "model" not in names and "model.transformer" not in names
    assert names[0] == "model.transformer.wte" and names[-1] == "model.lm_head"
    assert "model.transformer.blocks.1" in names and "model.transformer.blocks" not in names
    assert not any(".layer." in n for n in names)  # the outer list's blocks, not the inner's
