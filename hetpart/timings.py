"""Wall time of each step of `partition`, for timings.json and `--verbose`.

    times = StepTimes(echo=print)               # echo=None: record only
    with times.step("export"):
        gm = export_model(...)
    times.to_json()  # {"steps_s": {"export": 1.23, ...}, "total_s": ..., "write_s": ...}

Steps are named `trace/build`, `trace/export`, `pass/<name>`, `lower`, `solve`, `verify`, `split`,
`baselines`, `pt2/<rank>` (a stage.pt2's program built and saved; `examples` where a stage is exported
again: NOTE [stage programs] in codegen/pt2.py),
`write/<file>` (one per file written: `write/rank0/weights.safetensors`, `write/report.html`; `write/ir/ (dumps)`
all of ir/, written as the passes end;
`write/stage.pt2 (all ranks)` is the wall time of every rank's .pt2). A step that runs twice adds up. Stdlib only: any layer may time itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Seconds per named step, in the order the steps first ran."""

    echo: Callable[[str], None] | None = None  # called with "<step>: <ms> ms" as each step ends
    seconds: dict[str, float] = field(default_factory=dict)
    _start_s: float = field(default_factory=time.perf_counter)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the block as step `name` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float, quiet: bool = False) -> None:
        """Record `seconds` for step `name`; `quiet`: not echoed (the pass manager echoes its own)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if self.echo is not None and not quiet:
            self.echo(f"{name}: {seconds * 1e3:.1f} ms")

    def to_json(self) -> dict:
        """The steps, the time since this object was made (`total_s`) and the part of it spent writing files."""
        return {
            "steps_s": {name: round(s, 4) for name, s in self.seconds.items()},
            "write_s": round(sum(s for name, s in self.seconds.items() if name.startswith("write/")), 4),
            "total_s": round(time.perf_counter() - self._start_s, 4),
        }
