"""Plan + annotated graph -> per-stage GraphModules -> the artifacts directory."""

from hetpart.codegen.artifacts import FORMAT_VERSION, manifest, sha256, staging_dir, write_json, write_rank
from hetpart.codegen.source import stage_source
from hetpart.codegen.split import StageGraph, run_stages, split_stages

__all__ = [
    "FORMAT_VERSION", "StageGraph", "manifest", "run_stages", "sha256", "split_stages", "stage_source",
    "staging_dir", "write_json", "write_rank",
]
