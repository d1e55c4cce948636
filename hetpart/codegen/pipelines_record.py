"""ir/pipelines.json: each data-parallel pipeline's cuts and devices, for `hetpart replan` to keep them
(NOTE [re-plan pipelines] in partitioner/replan_pipelines.py), and ir/shapes.json: the search's solved shapes,
for its search to start from (NOTE [shape memo] in partitioner/shape_memo.py). The manifest hashes both with
the rest of ir/."""

from __future__ import annotations

import json
from pathlib import Path

from hetpart.partitioner.pipelines import PipelinesPlan
from hetpart.partitioner.replan_pipelines import pipelines_to_json
from hetpart.partitioner.shape_memo import ShapeMemo

PIPELINES_RECORD = "ir/pipelines.json"
SHAPE_MEMO = "ir/shapes.json"


def write_pipelines_record(tmp: Path, pp: PipelinesPlan) -> None:
    """ir/pipelines.json in `partition`'s staging dir."""
    (tmp / PIPELINES_RECORD).write_text(json.dumps(pipelines_to_json(pp), sort_keys=True) + "\n")


def write_shape_memo(tmp: Path, memo: ShapeMemo) -> None:
    """ir/shapes.json in `partition`'s staging dir (NOTE [shape memo]); none when no search ran."""
    if not memo.fingerprint:
        return
    (tmp / SHAPE_MEMO).write_text(json.dumps(memo.to_json(), sort_keys=True, separators=(",", ":")) + "\n")
