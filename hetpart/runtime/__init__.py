"""torchrun entry point and launcher: run the per-rank stages with torch.distributed.pipelining."""

from hetpart.runtime.launch import RunOptions, RunResult, run_pipeline
from hetpart.runtime.verify import VERIFY_ATOL, VERIFY_RTOL, Tolerances, Verification

__all__ = ["VERIFY_ATOL", "VERIFY_RTOL", "RunOptions", "RunResult", "Tolerances", "Verification", "run_pipeline"]
