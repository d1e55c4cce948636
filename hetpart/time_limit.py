"""The one cap on a time limit handed to OR-Tools, for library callers and the CLI's --time-limit alike.
Nothing here imports torch, nor anything else: the CLI reads it as it starts.
"""

from __future__ import annotations

# OR-Tools' linear solver (pywraplp `SetTimeLimit`) takes its limit as whole ms in an int64: a longer limit, or an
# infinite deadline, raised OverflowError (a traceback). A million seconds (11.6 days) is more than any solve here
# is worth waiting for; the CLI refuses a --time-limit (and `run --timeout`) above it.
TIME_LIMIT_MAX_S = 1e6


def linear_solver_limit_ms(seconds: float) -> int:
    """`seconds` as pywraplp's `SetTimeLimit` takes it: whole ms, at least 1, at most TIME_LIMIT_MAX_S (NaN too)."""
    return max(1, int(1000 * (seconds if seconds < TIME_LIMIT_MAX_S else TIME_LIMIT_MAX_S)))
