"""torchrun entry point and launcher: run the per-rank stages with torch.distributed.pipelining.

The launcher's names are imported on first use (PEP 562): every torchrun rank imports this package
for `hetpart.runtime.worker`, and the launcher's imports (codegen, the frontend, the emulator) cost
each rank seconds of startup it never uses.
"""

from __future__ import annotations

from typing import Any

_NAMES = {"RunOptions": "launch", "RunResult": "launch", "run_pipeline": "launch", "VERIFY_ATOL": "verify",
          "VERIFY_RTOL": "verify", "Tolerances": "verify", "Verification": "verify"}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'hetpart.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"hetpart.runtime.{_NAMES[name]}"), name)


__all__ = ["VERIFY_ATOL", "VERIFY_RTOL", "RunOptions", "RunResult", "Tolerances", "Verification", "run_pipeline"]
