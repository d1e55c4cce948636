"""Progress on a terminal: spinner text per step and the solver's objective and bound; quiet otherwise."""

import io

from rich.console import Console

from hetpart.report.progress import Progress


def test_quiet_when_not_a_terminal(partitioned):
    progress = Progress.for_console(Console(file=io.StringIO()))
    assert not progress.active
    with progress.step("solving"):
        progress.solver(2000, 1000)  # no status: nothing to update, nothing raised
    assert "solving" not in partitioned.stdout and "tracing" not in partitioned.stdout


def test_terminal_shows_step_and_solver_progress():
    progress = Progress.for_console(Console(file=io.StringIO(), force_terminal=True))
    assert progress.active
    with progress.step("solving"):
        assert str(progress._status.status) == "solving"
        progress.solver(136_000, 102_000)
        assert str(progress._status.status) == "solving: best bottleneck 136 us, bound 102 us, gap 25.00%"
    progress.update("after the step")  # no status any more: ignored
    assert progress._status is None
