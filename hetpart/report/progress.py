"""Progress of the long steps (export, passes, solve) on a terminal; silent when output is not one.

    progress = Progress.for_console(console)      # quiet unless console.is_terminal
    with progress.step("solving"):
        solve(problem, log_callback=progress.solver)

Never imports torch; `partition` makes one and hands it to `compile_model`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.status import Status


@dataclass
class Progress:
    """A rich spinner with a line of text, or nothing at all when `console` is None."""

    console: Console | None = None
    _status: Status | None = None

    @classmethod
    def for_console(cls, console: Console) -> Progress:
        return cls(console if console.is_terminal else None)

    @property
    def active(self) -> bool:
        return self.console is not None

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        """Show `text` with a spinner while the block runs."""
        if self.console is None:
            yield
            return
        with self.console.status(text) as status:
            self._status = status
            try:
                yield
            finally:
                self._status = None

    def update(self, text: str) -> None:
        """Replace the current step's text (no-op outside a step or when quiet)."""
        if self._status is not None:
            self._status.update(text)

    def solver(self, objective_ns: int, bound_ns: int) -> None:
        """`solve(..., log_callback=...)`: the best bottleneck found so far and the proven bound."""
        gap = (objective_ns - bound_ns) / objective_ns if objective_ns > 0 else 0.0
        self.update(f"solving: best bottleneck {objective_ns / 1000:.4g} us, bound {bound_ns / 1000:.4g} us, "
                    f"gap {max(gap, 0.0):.2%}")
