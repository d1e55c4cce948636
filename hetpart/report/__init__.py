"""What a partition looks like to people: the plan table (terminal), `inspect` views, report.html.

    table.py    rich tables of plan.json (`partition` and `inspect` print the same one)
    inspect.py  `hetpart inspect DIR`: a stage's source, an IR dump, JSON for tools
    blocks.py   the annotated graph coarsened to top-level modules (reads FX nodes)
    html.py     report.html: self-contained, inline SVG, no scripts (never imports torch)
    progress.py a spinner for the long steps and the solver's progress, on a terminal only
"""

from hetpart.report.table import plan_summary, plan_table, print_plan

__all__ = ["plan_summary", "plan_table", "print_plan"]
