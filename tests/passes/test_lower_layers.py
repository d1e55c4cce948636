"""`passes/lower.py` sets each problem node's layer (what the `equal-layers` baseline counts)."""

from hetpart.passes import lower_to_problem


def test_lower_sets_the_layer_of_each_op_from_nn_module_stack(annotated, mixed4):
    problem = lower_to_problem(annotated("gpt-small"), mixed4)
    layers = {problem.graph.nodes[v].get("layer") for v in problem.graph.nodes}
    # Two decoder blocks, the embeddings and the head; inputs and outputs have no module.
    assert {"blocks.0", "blocks.1", "wte"} <= layers
    assert not any(isinstance(name, str) and name.startswith("blocks.0.") for name in layers)
