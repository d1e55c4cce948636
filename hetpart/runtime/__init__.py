"""torchrun entry point and launcher: run the per-rank stages with torch.distributed.pipelining."""

from hetpart.runtime.launch import VERIFY_ATOL, VERIFY_GRAD_RTOL, RunOptions, RunResult, run_pipeline

__all__ = ["VERIFY_ATOL", "VERIFY_GRAD_RTOL", "RunOptions", "RunResult", "run_pipeline"]
