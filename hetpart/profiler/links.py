"""`hetpart profile-link`: measure the link between local processes, as the cost model will use it.

NOTE [measured links]
A cluster file's `link = { bandwidth_GBps, latency_us }` is what every transfer, all-reduce and
all-gather of a plan is costed with (`costs.transfer_ns`, `costs.allreduce_ns`). Between processes of
one machine talking gloo over loopback (the CPU presets, `run --emulate` rehearsals) the figures a
user would guess (memory bandwidth, microseconds) are far from what gloo takes: each step of a
collective wakes a thread and crosses the kernel's TCP stack. `profile-link` times the real
operation among `--ranks` spawned processes at several sizes (the median of `--repeats`, after a
warm-up), then fits latency and bandwidth by least squares to the cost model's own formula for that
operation: the formula is evaluated on two unit links (1 us latency and no bandwidth cost; no
latency and 1 GB/s), which gives each size's number of latency steps and bytes moved, so the fit
never restates a formula costs.py owns. `--op send-recv` fits one tensor's transfer, one message
(one latency: a stage boundary pays it once per tensor crossing it, NOTE [stage time] in costs.py);
`all-reduce` a tensor-parallel group's or a gradient sync's ring (2(r-1) latencies).
The printed `link = {...}` goes into the cluster file's machine; the per-size table shows how well
one latency and one bandwidth describe it.

NOTE [collectives between work]
A tensor-parallel rank does not call its all-reduces back to back behind a barrier: it computes a
few ms of ops, calls one, computes again (NOTE [collective skew] in runtime/collectives.py). On
this 2-core VM a call made that way costs several times one made back to back, and below 1 MiB
its time barely grows with the bytes: presumably the wake-ups of gloo's threads and of the peer,
not the transfer (figures in docs/benchmarks.md, "Issue 20: the TP-2 stage again (tpmeasure)").
`--gap-us G` times the op as the stage calls it: each timed call comes after G us of matmuls on
every rank (the all-reduce itself keeps the ranks in step; a send may run ahead of its recv by
what gloo buffers, as a pipeline stage's does), and what counts is the rank's round (from the end
of its last call to the end of this one) less its own matmuls: the call itself and the wait for a
peer that left the last call later, what the stage's forward pays for it. Such calls are fast or
slow (a few times apart), so the median of a size flips between the two from one run to the
next; a forward pays the sum of its calls, so with G > 0 a size's time is the mean of its calls,
not the median. G = 0 is the back-to-back timing (a barrier before each call, the median), a
gradient sync's buckets; the fit is the same either way.
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import allreduce_ns, transfer_ns
from hetpart.partitioner.problem import Link

OPS = ("all-reduce", "send-recv")
DEFAULT_SIZES = (4096, 65536, 262144, 1048576, 4194304)


@dataclass(frozen=True)
class LinkFit:
    """The fitted link and what it was fitted to: each size's measured median and the fit's prediction."""

    op: str
    ranks: int
    latency_us: float
    bandwidth_gbps: float
    measured_us: dict[int, float]
    fitted_us: dict[int, float]

    def toml(self) -> str:
        def three(x: float) -> str:  # 3 significant digits, never in exponent form
            return f"{float(f'{x:.3g}'):.10g}"

        return f"link = {{ bandwidth_GBps = {three(self.bandwidth_gbps)}, latency_us = {three(self.latency_us)} }}"


def _unit_terms(op: str, nbytes: int, ranks: int) -> tuple[float, float]:
    """(latency steps, microseconds at 1 GB/s) of one `op` of `nbytes`, from the cost model's formula."""
    cost = (lambda link: allreduce_ns(link, nbytes, ranks)) if op == "all-reduce" else (
        lambda link: transfer_ns(link, nbytes, tensors=1))  # one tensor, one message: the latency per tensor
    steps = cost(Link(bandwidth_bytes_per_us=10**15, latency_ns=1000)) / 1000  # 1 us a step, bytes free
    per_gbps_us = cost(Link(bandwidth_bytes_per_us=1000, latency_ns=0)) / 1000  # 1 GB/s, no latency
    return steps, per_gbps_us


def fit_link(op: str, ranks: int, measured_us: dict[int, float]) -> LinkFit:
    """NOTE [measured links]: least squares of `t = steps x latency + us_at_1GBps / bandwidth` over the sizes."""
    terms = {n: _unit_terms(op, n, ranks) for n in measured_us}
    rows = [(a, b, measured_us[n]) for n, (a, b) in terms.items()]
    saa = sum(a * a for a, _, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    say = sum(a * y for a, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    det = saa * sbb - sab * sab
    lat, inv_bw = ((say * sbb - sby * sab) / det, (sby * saa - say * sab) / det) if det > 0 else (0.0, -1.0)
    if inv_bw <= 0:  # no size costs more than its latency: bandwidth unmeasurable at these sizes; fit latency only
        raise HetpartError(f"profile-link: the {op} times do not grow with the size "
                           f"({', '.join(f'{n} B {t:.0f} us' for n, t in sorted(measured_us.items()))}); "
                           "pass larger --sizes, or more --repeats on a quieter machine")
    if lat < 0:  # the bytes explain all of it: latency 0, bandwidth refitted alone
        lat, inv_bw = 0.0, sby / sbb
    fitted = {n: a * lat + b * inv_bw for n, (a, b) in terms.items()}
    return LinkFit(op, ranks, lat, 1 / inv_bw, dict(sorted(measured_us.items())), dict(sorted(fitted.items())))


def _work(a: "torch.Tensor", b: "torch.Tensor", gap_us: int) -> int:  # noqa: F821 - torch is imported in the worker
    """Matmuls for `gap_us` on this rank (NOTE [collectives between work]); the ns they took."""
    start = time.monotonic_ns()
    while time.monotonic_ns() - start < gap_us * 1000:
        a @ b
    return time.monotonic_ns() - start


def _worker(rank: int, ranks: int, port: int, op: str, sizes: list[int], repeats: int, out: str,
            gap_us: int = 0) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # as a `hetpart run` rank computes
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)

    def once(x: torch.Tensor) -> None:
        if op == "all-reduce":
            dist.all_reduce(x)
        elif rank == 0:
            dist.send(x, 1)
        elif rank == 1:
            dist.recv(x, 0)

    times = {}
    a, b = torch.randn(128, 256), torch.randn(256, 256)
    for n in sizes:
        x = torch.ones(max(1, n // 4))
        for _ in range(3):
            once(x)
        samples = []
        dist.barrier()
        end = time.monotonic_ns()
        for _ in range(repeats):
            if gap_us:  # as a TP rank calls it: after its ops (NOTE [collectives between work])
                worked = _work(a, b, gap_us)
                once(x)
                samples.append((time.monotonic_ns() - end - worked) / 1e9)
                end = time.monotonic_ns()
                continue
            dist.barrier()
            start = time.perf_counter()
            once(x)  # send-recv: rank 1's time is the transfer as the next stage waits for it
            samples.append(time.perf_counter() - start)
        # between work the calls are bimodal (NOTE [collectives between work]): a median flips between the modes
        # from run to run, and a forward pays the sum of its calls, so the mean counts there
        times[n] = (statistics.fmean(samples) if gap_us else statistics.median(samples)) * 1e6
    measured_by = 1 if op == "send-recv" else 0
    if rank == measured_by:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_link(op: str = "all-reduce", ranks: int = 2, sizes: tuple[int, ...] = DEFAULT_SIZES,
                 repeats: int = 20, gap_us: int = 0) -> LinkFit:
    """NOTE [measured links]: time `op` among `ranks` local gloo processes and fit the cost model's link to it;
    with `gap_us`, each call after that long of matmuls on every rank (NOTE [collectives between work])."""
    if op not in OPS:
        raise HetpartError(f"profile-link --op {op}: expected one of {', '.join(OPS)}")
    if ranks < 2 or (op == "send-recv" and ranks != 2):
        raise HetpartError(f"profile-link --ranks {ranks}: {op} needs {'exactly 2' if op == 'send-recv' else '>= 2'}")
    if len(set(sizes)) < 2 or min(sizes) < 4:
        raise HetpartError("profile-link --sizes: give at least two different sizes of 4 bytes or more")
    if gap_us < 0:
        raise HetpartError(f"profile-link --gap-us {gap_us}: give 0 (back to back) or more microseconds")
    import torch.multiprocessing as mp

    with socket.socket() as sock:  # a free loopback port for the process group
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="hetpart-link-") as tmp:
        out = str(Path(tmp) / "times.json")
        mp.start_processes(_worker, args=(ranks, port, op, sorted(set(sizes)), repeats, out, gap_us), nprocs=ranks,
                           start_method="spawn")
        measured = {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
    return fit_link(op, ranks, measured)


__all__ = ["DEFAULT_SIZES", "LinkFit", "OPS", "fit_link", "measure_link"]
