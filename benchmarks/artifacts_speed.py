"""Where `partition` of torchvision's swin_t spends its time, and the share spent writing artifacts (issue 23).

    PYTHONPATH=TV .venv/bin/python benchmarks/artifacts_speed.py [--before CHECKOUT] [--repeat N]

Runs `python -m hetpart partition benchmarks/artifacts_speed.py:swin_t --cluster preset:mixed-4
--time-limit 10` (this file is also the model file: `swin_t` below) with this checkout's hetpart and,
with `--before`, with another checkout's (`git worktree add ../base <commit>`), in turn, `--repeat`
times, so both share the machine's load. Prints each run's steps from timings.json (seconds), the
part spent writing (every `write/` step, plus `examples`, which only fed the .pt2 exports before
NOTE [stage programs]), `untimed` (total_s less every step: before this change, the IR dumps), the
output's bytes and the load average.

torchvision is not a dependency of hetpart; it needs no install into the venv: `pip install --no-deps
--target TV torchvision==0.28.0 pillow` and PYTHONPATH=TV. Its wheel's C extension is built for CUDA
torch and does not load on the CPU build; swin_t uses none of its ops, so `_torchvision` imports it
without registering their fake kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _torchvision():
    """torchvision, its C ops' fake-kernel registrations skipped (the CUDA wheel's _C does not load here)."""
    import torch

    register = torch.library.register_fake
    torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
    try:
        import torchvision
    finally:
        torch.library.register_fake = register
    return torchvision


def swin_t(batch_size: int = 8):
    """The model file's function: torchvision's swin_t (28.3M parameters) with random weights, 224x224 images."""
    import torch

    torch.manual_seed(0)
    model = _torchvision().models.swin_t().eval()
    return model, (torch.randn(int(batch_size), 3, 224, 224),)


COLUMNS = ("trace", "passes", "solve", "split", "examples", "weights", "stage.py", "stage.pt2", "ir dumps",
           "report+manifest", "baselines", "untimed", "total_s", "writing", "share")


def row(steps: dict[str, float], total_s: float) -> dict[str, float]:
    """The table's columns from timings.json's steps."""
    pick = lambda *prefixes: sum(s for name, s in steps.items() if name.startswith(prefixes))  # noqa: E731
    out = {
        "trace": pick("trace/"), "passes": pick("pass/"), "solve": pick("lower", "solve", "verify"),
        "split": pick("split"), "examples": pick("examples"),
        "weights": sum(s for name, s in steps.items() if name.startswith("write/rank") and "weights" in name),
        "stage.py": sum(s for name, s in steps.items() if name.startswith("write/rank") and name.endswith("stage.py")),
        "stage.pt2": pick("write/stage.pt2"), "ir dumps": pick("write/ir/"),
        "report+manifest": pick("write/report.html", "write/manifest.json"), "baselines": pick("baselines"),
    }
    counted = sum(s for name, s in steps.items() if not name.startswith("pt2/"))  # pt2/<rank> is inside stage.pt2
    out["untimed"] = max(total_s - counted, 0.0)
    out["total_s"] = total_s
    out["writing"] = pick("write/") + out["examples"]
    out["share"] = out["writing"] / total_s
    return out


def partition(checkout: Path, out: Path) -> tuple[dict[str, float], float, int]:
    """One `partition` with `checkout`'s hetpart: the row, the wall seconds and the output's bytes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hetpart", "partition", f"{Path(__file__).resolve()}:swin_t",
                    "--cluster", "preset:mixed-4", "--time-limit", "10", "--out", str(out), "--force"],
                   check=True, env=env, cwd=checkout, stdout=subprocess.DEVNULL)
    wall_s = time.perf_counter() - start
    timings = json.loads((out / "timings.json").read_text())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return row(timings["steps_s"], timings["total_s"]), wall_s, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout of hetpart, run in turn with this one")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    _torchvision()  # fails here, not in a child, without torchvision on PYTHONPATH
    codes = [("before", args.before.resolve())] if args.before else []
    codes.append(("after", ROOT))
    print(f"{os.cpu_count()} CPUs; `uptime`'s load is printed per run")
    print("| code | run | " + " | ".join(COLUMNS) + " | wall s | output bytes | load (1 min) |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 3))
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, checkout in codes:
                columns, wall_s, size = partition(checkout, Path(tmp) / f"{name}-{r}")
                cells = [f"{columns[c]:.0%}" if c == "share" else f"{columns[c]:.2f}" for c in COLUMNS]
                print(f"| {name} | {r} | " + " | ".join(cells) + f" | {wall_s:.1f} | {size:,} | "
                      f"{os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
