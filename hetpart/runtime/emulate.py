"""`hetpart run DIR --emulate`: rehearse a heterogeneous plan on one Linux machine.

Each rank is pinned to a core and throttled with a CPU quota to its device type's
speed relative to the fastest type of the plan, so CPU ranks behave as devices of
different speeds: plan for the cluster you will rent, rehearse here.

NOTE [emulated devices]
- Speed of a type: the model's whole time on the fastest type over its time on this
  type (plan.json's `type_model_us`, the sum over every node of the cost the plan was
  made with: the profile where `--profile` gave one for the type, else the roofline of
  the cost model; `speed_source` says which). The fastest type gets a whole core.
- Ranks, not stages: each rank of manifest.json gets a slot on its `planned_device` (a
  tensor-parallel stage's ranks one each; a virtual-stage rank one for its stages).
- Cores: the cluster file's `core = N` for a device, else round-robin (by rank) over the cores
  this process may run on (`os.sched_getaffinity`). Ranks that share a core must not
  wait for each other: when a core's shares sum above 1, every share is scaled down by
  the same factor (the ratios between devices are what the rehearsal keeps), and the
  launcher says so.
- Throttle: cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or v2 `cpu.max`, with
  a 10 ms period (a 100 ms period throttles in step-sized chunks). Each rank gets a
  cgroup of its own, `hetpart-emulate-<launcher pid>-rank<k>`, under the hierarchy's
  root (or under $HETPART_EMULATE_CGROUP, a cgroup delegated to you). Nothing else is
  written: in v2 the parent must already have `cpu` in cgroup.subtree_control.
  The quota caps a rank at its device's speed; to also get that speed while other jobs
  run on the machine, each cgroup weighs WEIGHT_FACTOR default tasks (v1 `cpu.shares`
  10240, v2 `cpu.weight` 1000). Its use is still capped by the quota, so other jobs
  keep the rest of the core; a load far above the core count still shows in the figures.
- Moving the ranks: a thread of the launcher polls /proc for processes that descend
  from it and carry its `HETPART_LAUNCHER_PID` and a `RANK` in their environment (the
  torchrun workers), writes each one's pid into its rank's cgroup.procs and pins every
  thread of it to the rank's core (threads it starts later inherit both). Only these
  processes and these cgroups are ever touched.
- Cleanup: on the way out (success, failure, Ctrl-C, SIGTERM), after the ranks are
  stopped, any process still in one of our cgroups is moved back to the parent and the
  cgroup removed; the cgroups never outlive the run.

NOTE [emulation by sleep]
`--emulate-by sleep` (no cgroups, no root): each rank pins itself to its core and, after every
forward and backward of its stage, sleeps until the action's wall time is its thread's CPU time in
it divided by its share (nothing where it already took longer). A quota caps a whole process over a
period: it slows the rank's Python between actions and gloo's I/O threads by 1/share as well (a
real slow device's host does not slow down), lets a rank that idled burst at full speed, and stops
one that spent its quota for the rest of the period wherever it is, a hand-off included (measured:
docs/benchmarks.md "Where pipelines lose time between stages"). Padding is exact per action and
leaves the host's work at full speed, as a GPU's host would. Ranks that share a core still get the
scaled shares of NOTE [emulated devices], so that each one's padding absorbs the other's compute.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hetpart.errors import HetpartError
from hetpart.plan_report import PlanReport

PERIOD_US = 10_000  # NOTE [emulated devices]: a 10 ms period
MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms
WEIGHT_FACTOR = 10  # NOTE [emulated devices]: a rank's cgroup weighs 10 default tasks against other jobs
CGROUP_ENV = "HETPART_EMULATE_CGROUP"  # a parent cgroup to create ours in (v1 cpu or v2)
V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
EMULATE_BY = ("quota", "sleep")  # NOTE [emulated devices], NOTE [emulation by sleep]
SLOTS_FILE = "emulation.json"  # in the run's --io directory: each rank's core and share (sleep mode)


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs when emulated: its core and its share of that core."""

    rank: int
    device: str
    device_type: str
    core: int
    share: float  # of a core, (0, 1]

    @property
    def quota_us(self) -> int:
        return max(MIN_QUOTA_US, round(self.share * PERIOD_US))


@dataclass(frozen=True)
class Emulation:
    slots: list[RankSlot]
    speed_source: str  # "profile", "cost model (roofline)", or "profile and cost model (roofline)"
    scale: float  # every share was multiplied by this so that no core is oversubscribed (1.0: none)
    mode: str = "quota"  # or "sleep": NOTE [emulation by sleep]

    def to_json(self) -> dict:
        return {"mode": self.mode, "period_us": PERIOD_US, "speed_source": self.speed_source,
                "scale": round(self.scale, 4),
                "ranks": [{"rank": s.rank, "device": s.device, "device_type": s.device_type, "core": s.core,
                           "share": round(s.share, 4), "quota_us": s.quota_us} for s in self.slots]}

    def describe(self) -> list[str]:
        how = (f"CPU quotas with a {PERIOD_US // 1000} ms period" if self.mode == "quota"
               else "each forward and backward padded with a sleep to its share")
        lines = [f"emulating {len(self.slots)} device(s), speeds from the {self.speed_source}, {how}:"]
        lines += [f"  rank {s.rank} ({s.device}, {s.device_type}): core {s.core}, {s.share:.1%} of it"
                  for s in self.slots]
        if self.scale < 1:
            lines.append(f"  (every share scaled by {self.scale:.3f}: ranks that share a core must not wait "
                         "for each other; the ratios between devices are kept)")
        return lines


def emulation_plan(plan: PlanReport, cores: list[int] | None = None, rank_devices: list[str] | None = None,
                   mode: str = "quota") -> Emulation:
    """The core and share of every rank of `plan` (plan.json), NOTE [emulated devices].

    `rank_devices`: the cluster device each rank runs on (manifest.json's `planned_device`: a
    tensor-parallel stage has several ranks, a virtual-stage rank several stages); by default
    one rank per stage, on the stage's device.
    """
    info = plan.emulation
    if not info or not info.get("type_model_us"):
        raise HetpartError("--emulate: this plan.json has no device speeds (`emulation`); partition it again with "
                           "this hetpart")
    model_us = info["type_model_us"]
    type_of = {d.name: d.type for d in plan.cluster.devices} | {s.device: s.device_type for s in plan.stages}
    devices = rank_devices if rank_devices is not None else [s.device for s in plan.stages]
    used = [type_of[d] for d in devices]
    fastest = min(model_us[t] for t in used)
    profiled = set(info.get("profiled_types", ())) & set(used)
    source = ("profile" if profiled == set(used) else "cost model (roofline)" if not profiled
              else "profile and cost model (roofline)")
    available = sorted(os.sched_getaffinity(0)) if cores is None else cores
    pinned = {d.name: d.core for d in plan.cluster.devices if d.core is not None}
    slots = []
    for k, device in enumerate(devices):
        core = pinned.get(device, available[k % len(available)])
        if core not in available:
            raise HetpartError(f"--emulate: the cluster file puts device {device} on core {core}, but this "
                               f"process may only run on cores {', '.join(map(str, available))}; change its `core`")
        share = fastest / model_us[type_of[device]] if model_us[type_of[device]] else 1.0
        slots.append(RankSlot(k, device, type_of[device], core, share))
    load: dict[int, float] = {}
    for s in slots:
        load[s.core] = load.get(s.core, 0.0) + s.share
    scale = min(1.0, 1.0 / max(load.values()))
    if scale < 1:
        slots = [RankSlot(s.rank, s.device, s.device_type, s.core, s.share * scale) for s in slots]
    if mode not in EMULATE_BY:
        raise HetpartError(f"--emulate-by {mode}: expected one of {', '.join(EMULATE_BY)}")
    return Emulation(slots, source, scale, mode)


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    parent: Path

    def create(self, name: str, quota_us: int) -> Path:
        """Our cgroup `name` with its quota; on any failure it is removed again and the error names the setting."""
        path = self.parent / name
        path.mkdir()
        settings = ({"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota_us),
                     "cpu.shares": str(1024 * WEIGHT_FACTOR)} if self.version == 1 else
                    {"cpu.max": f"{quota_us} {PERIOD_US}", "cpu.weight": str(100 * WEIGHT_FACTOR)})
        try:
            for file, value in settings.items():
                try:
                    (path / file).write_text(value)
                except OSError as err:  # v1: EINVAL for a quota above the parent's
                    raise HetpartError(
                        f"--emulate: could not write {value!r} to {path / file} ({err.strerror}); does the parent "
                        f"cgroup {self.parent} allow less CPU than that? Point {CGROUP_ENV} at a cgroup without a "
                        "lower quota, or pass --emulate-by sleep") from None
        except BaseException:
            _remove(path, self.parent)  # a signal included: no cgroup outlives the run
            raise
        return path


def find_hierarchy() -> Hierarchy:
    """The cgroup to create ours under, or a HetpartError that says why there is none."""
    override = os.environ.get(CGROUP_ENV)
    candidates = [Path(override)] if override else [V1_ROOT, V2_ROOT]
    why = []
    for parent in candidates:
        if (parent / "cpu.cfs_quota_us").exists() or (override and (parent / "tasks").exists()):
            version = 1
        elif (parent / "cgroup.controllers").exists():
            version = 2
            control = parent / "cgroup.subtree_control"
            if "cpu" not in (control.read_text().split() if control.exists() else []):
                why.append(f"{parent} (cgroup v2) does not enable the cpu controller for its children "
                           f"(`cpu` is not in {control})")
                continue
        else:
            why.append(f"{parent} is not a cgroup with the cpu controller")
            continue
        if not os.access(parent, os.W_OK):
            why.append(f"{parent} is not writable by this user (uid {os.getuid()}): run as root, or point "
                       f"{CGROUP_ENV} at a cgroup delegated to you")
            continue
        return Hierarchy(version, parent)
    raise HetpartError("--emulate needs a writable cgroup with the cpu controller (v1 cpu.cfs_quota_us or v2 "
                       f"cpu.max) to throttle the ranks: {'; '.join(why)}. Run without --emulate, or on a Linux "
                       "machine where you may create cgroups")


def _own_ranks(launcher_pid: int) -> dict[int, int]:
    """pid -> RANK of the processes that descend from `launcher_pid` and carry its marker (torchrun workers)."""
    from hetpart.runtime.worker import LAUNCHER_PID_ENV

    parent: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text()
            parent[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    marker = f"{LAUNCHER_PID_ENV}={launcher_pid}".encode()
    found = {}
    for pid in parent:
        p, hops = parent.get(pid), 0
        while p not in (None, 0, 1, launcher_pid) and hops < 16:
            p, hops = parent.get(p), hops + 1
        if p != launcher_pid:
            continue
        with contextlib.suppress(OSError, ValueError):
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            if marker in env:
                rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
                if rank is not None:
                    found[pid] = rank
    return found


class _Mover(threading.Thread):
    """Moves each rank into its cgroup and onto its core as soon as it appears (NOTE [emulated devices])."""

    def __init__(self, cgroups: dict[int, Path], cores: dict[int, int], poll_s: float = 0.02) -> None:
        super().__init__(name="hetpart-emulate", daemon=True)
        self.cgroups, self.cores, self.poll_s = cgroups, cores, poll_s
        self.placed: dict[int, int] = {}  # pid -> rank
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def place(self, pid: int, rank: int) -> None:
        (self.cgroups[rank] / "cgroup.procs").write_text(str(pid))
        for task in (Path("/proc") / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), {self.cores[rank]})
        self.placed[pid] = rank

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for pid, rank in _own_ranks(os.getpid()).items():
                    if pid not in self.placed and rank in self.cgroups:
                        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                            self.place(pid, rank)
                self.stop.wait(self.poll_s if len(set(self.placed.values())) < len(self.cgroups) else 0.5)
        except BaseException as err:  # reported by `emulated` after the run
            self.error = err


def _remove(path: Path, parent: Path, timeout_s: float = 10) -> None:
    """Remove one of our cgroups; processes still in it (ours, being stopped) go back to `parent`."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(pid)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def emulated(emulation: Emulation, echo=print) -> Iterator[_Mover]:
    """Create the ranks' cgroups, move the ranks in while the block runs, remove every cgroup after."""
    hierarchy = find_hierarchy()
    for line in emulation.describe():
        echo(line)
    created: list[Path] = []
    mover = None
    cgroups = {}
    try:
        try:
            for s in emulation.slots:
                path = hierarchy.create(f"hetpart-emulate-{os.getpid()}-rank{s.rank}", s.quota_us)
                created.append(path)
                cgroups[s.rank] = path
        except OSError as err:
            raise HetpartError(f"--emulate: could not create the cgroup {err.filename} ({err.strerror}); run as "
                               f"root, or point {CGROUP_ENV} at a cgroup delegated to you") from None
        mover = _Mover(cgroups, {s.rank: s.core for s in emulation.slots})
        mover.start()
        yield mover
    finally:
        if mover is not None:
            mover.stop.set()
            mover.join()
        for path in reversed(created):
            _remove(path, hierarchy.parent)
    if mover.error is not None:
        raise HetpartError(f"--emulate: could not move a rank into its cgroup ({mover.error})")
    missing = sorted(set(cgroups) - set(mover.placed.values()))
    if missing:
        echo(f"warning: --emulate: rank(s) {', '.join(map(str, missing))} ran without their quota "
             "(never seen by the launcher's watcher)")


@contextlib.contextmanager
def emulating(emulation: Emulation, io_dir: Path, echo=print) -> Iterator[None]:
    """The run's emulation while the ranks run: cgroups (`quota`) or each rank's slot in `io_dir` (`sleep`)."""
    if emulation.mode == "quota":
        with emulated(emulation, echo):
            yield
        return
    for line in emulation.describe():
        echo(line)
    (io_dir / SLOTS_FILE).write_text(json.dumps(emulation.to_json()))
    yield


class SleepPadding:
    """One rank's NOTE [emulation by sleep]: pins the process to its core; `pad` stretches an action."""

    def __init__(self, core: int, share: float) -> None:
        self.core, self.share = core, share

    @staticmethod
    def for_rank(io_dir: Path, rank: int) -> SleepPadding | None:
        """This rank's padding, where the launcher asked for sleep emulation (else None)."""
        path = io_dir / SLOTS_FILE
        if not path.exists():
            return None
        slot = next(r for r in json.loads(path.read_text())["ranks"] if r["rank"] == rank)
        return SleepPadding(slot["core"], slot["share"])

    def pin(self) -> None:
        """Pin this process (and the threads it starts later: gloo's) to the rank's core."""
        os.sched_setaffinity(0, {self.core})

    def pad(self, wall_start_s: float, cpu_start_s: float) -> None:
        """Sleep until the action begun at `wall_start_s` (perf_counter) / `cpu_start_s` (thread_time) has
        taken its CPU time / share of wall time."""
        cpu_s = time.thread_time() - cpu_start_s
        left_s = cpu_s / self.share - (time.perf_counter() - wall_start_s)
        if left_s > 0:
            time.sleep(left_s)

    def wrap(self, stage: object, name: str) -> None:
        """Pad every call of `stage.name` (a PipelineStage's backward actions)."""
        method = getattr(stage, name)

        def padded(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.pad(wall, cpu)

        setattr(stage, name, padded)
