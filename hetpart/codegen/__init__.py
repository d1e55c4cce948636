"""Plan + annotated graph -> per-stage GraphModules -> the artifacts directory."""

from hetpart.codegen.artifacts import (
    FORMAT_VERSION, PlannedDevice, launch_groups, launch_script, manifest, sha256, write_json,
    write_manifest, write_rank,
)
from hetpart.codegen.publish import staging_dir
from hetpart.codegen.pt2 import stage_examples, write_pt2, write_pt2_files
from hetpart.codegen.source import stage_source
from hetpart.codegen.split import StageGraph, run_stages, split_stages

__all__ = [
    "FORMAT_VERSION", "PlannedDevice", "StageGraph", "launch_groups", "launch_script", "manifest", "run_stages", "sha256", "split_stages", "stage_examples", "stage_source", "write_pt2",
    "write_pt2_files",
    "staging_dir", "write_json", "write_manifest", "write_rank",
]
