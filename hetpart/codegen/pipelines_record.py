"""ir/pipelines.json: each data-parallel pipeline's cuts and devices, for `hetpart replan` to keep them
(NOTE [re-plan pipelines] in partitioner/replan_pipelines.py). The manifest hashes it with the rest of ir/."""

from __future__ import annotations

import json
from pathlib import Path

from hetpart.partitioner.pipelines import PipelinesPlan
from hetpart.partitioner.replan_pipelines import pipelines_to_json

PIPELINES_RECORD = "ir/pipelines.json"


def write_pipelines_record(tmp: Path, pp: PipelinesPlan) -> None:
    """ir/pipelines.json in `partition`'s staging dir."""
    (tmp / PIPELINES_RECORD).write_text(json.dumps(pipelines_to_json(pp), sort_keys=True) + "\n")
