"""The IR: a torch.fx GraphModule with one `NodeInfo` per node, and its printers."""

from hetpart.ir.info import FIELD_NAMES, META_KEY, NodeInfo, has_field, info
from hetpart.ir.printer import dump_dot, dump_text, graph_json

__all__ = ["FIELD_NAMES", "META_KEY", "NodeInfo", "dump_dot", "dump_text", "graph_json", "has_field", "info"]
