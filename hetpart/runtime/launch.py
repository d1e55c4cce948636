"""`hetpart run DIR`: launch torchrun on this machine, one CPU process per stage.

The launcher builds the example inputs from the model spec recorded in plan.json, starts torchrun (gloo,
loopback), collects the last rank's outputs and, with `verify=True`, runs the unpartitioned model on the same
inputs with the same weights and compares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hetpart.codegen.publish import foreign_log, is_measured_json, write_logs_marker
from hetpart.errors import HetpartError, Terminated
from hetpart.fsio import atomic_write, exclusive_file, fresh_dir
from hetpart.plan_report import PlanReport, as_json
from hetpart.frontend import ModelSpec, check_example_batch, load_model
from hetpart.frontend.hf import HFModel, OutputStructure
from hetpart.runtime.artifacts import check_rank_files, dim_size, load_manifest, symbol_sizes
from hetpart.runtime.tp import is_mixed, whole_weights
from hetpart.runtime.artifacts import check_listed_files, mesh_pipelines, model_spec_for_run, read_plan
from hetpart.runtime.checkpoint import CheckpointFlags, make_checkpoint_dir, run_checkpoints
from hetpart.runtime.resume import stopped_resume, with_resume_commands
from hetpart.runtime.measured import measurement
from hetpart.runtime.optimizers import resumed_optimizer
from hetpart.runtime.emulate import emulating, emulation_plan, find_hierarchy
from hetpart.runtime.schedules import SCHEDULES, check_schedule, default_schedule
from hetpart.runtime.stages import stage_entries
from hetpart.runtime.verify import Tolerances, Verification, check_tensor, rank_threads, reference_outputs
from hetpart.runtime.verify import reference_training, training_checks
from hetpart.trust import SIGNATURE_NAME, is_signed, read_key


@dataclass
class RunResult:
    outputs: tuple[torch.Tensor, ...]
    step_seconds: float
    max_abs_diff: float | None  # None without --verify
    grad_rel_err: float | None = None  # training with --verify: worst weight-gradient relative error
    measured: dict | None = None  # with --measure: the contents of measured.json
    all_step_seconds: list[float] | None = None
    structure: OutputStructure | None = None  # hf: models, dict and list outputs: how `outputs` rebuild them
    verification: Verification | None = None  # with --verify: every output and gradient compared

    def model_outputs(self) -> object:
        """The outputs in the model's own structure (hf: models: its ModelOutput), else the tuple."""
        return self.structure.rebuild(self.outputs) if self.structure is not None else self.outputs

    def described_outputs(self) -> str:
        """`CausalLMOutput(logits=8x16x128)` for hf: models, else the shapes: `8x64x2048`."""
        if self.structure is not None:
            return self.structure.describe(self.outputs)
        return ", ".join("x".join(map(str, o.shape)) for o in self.outputs)


def reference_model(out: Path, manifest: dict, spec: ModelSpec) -> tuple[torch.nn.Module, tuple]:
    """The unpartitioned model with the artifacts' weights, and the example inputs."""
    module, inputs = load_model(spec)
    shipped: dict[str, torch.Tensor] = {}
    loaded = [load_file(str(check_rank_files(out, entry) / "weights.safetensors"))
              for entry in stage_entries(manifest)]  # NOTE [virtual-stage manifest]
    for tensors in whole_weights(loaded, manifest):  # a TP stage's split weights, put together
        shipped.update(tensors)
    state = module.state_dict(keep_vars=True)
    alias: dict[int, str] = {}
    for key, tensor in state.items():  # tied weights ship under one of their names
        if key in shipped:
            alias[id(tensor)] = key
    new_state = {}
    for key, tensor in state.items():
        source = key if key in shipped else alias.get(id(tensor))
        new_state[key] = shipped[source] if source is not None else tensor
    module.load_state_dict(new_state, strict=True)
    return module, inputs


class RunFailed(HetpartError):
    """A run that started but did not finish: a rank died, failed or timed out (exit status 1).

    A rank that stopped on a HetpartError of its own (its files are missing) keeps status 2.
    """

    exit_code = 1
    dead_device: str | None = None  # the planned device of a rank that died (not one that refused its input)


def _tail(path: Path, lines: int) -> list[str]:
    text = path.read_text(errors="replace").rstrip().splitlines() if path.is_file() else []
    return text[-lines:]


def _rank_logs(log_dir: Path, manifest: dict, as_nodes: bool, rank: int) -> list[Path]:
    """A rank's stdout and stderr logs: torchrun writes LOG_DIR/<run id>/attempt_<n>/<local rank>/."""
    entry = manifest["ranks"][rank]
    base = log_dir / f"node{entry['node_rank']}" if as_nodes else log_dir
    local = entry["local_rank"] if as_nodes else rank
    return sorted(base.glob(f"*/attempt_*/{local}/stdout.log")) + sorted(base.glob(f"*/attempt_*/{local}/stderr.log"))


def _rank_tail(log_dir: Path, manifest: dict, as_nodes: bool, rank: int, lines: int = 15) -> str:
    chunks = []
    for path in _rank_logs(log_dir, manifest, as_nodes, rank):
        tail = _tail(path, lines)
        if tail:
            chunks.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(chunks) or f"--- rank {rank}'s log is empty (it stopped before printing anything)"


def _without_tracebacks(lines: list[str]) -> list[str]:
    """torchrun's own log minus Python stack frames: the user needs the error, not torchrun's internals."""
    kept, in_trace = [], False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_trace = True
        elif in_trace and not line.startswith(" "):
            in_trace = False
        if not in_trace:
            kept.append(line)
    return kept


# "Root Cause (first observed failure):\n[0]:\n  time : ...\n  rank : 1 (local_rank: 1)\n  exitcode : -9 ..."
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
# Every failure torchrun lists: "rank : 1 (local_rank: 1)" then "exitcode : 2 (pid: ...)".
_ANY_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_PORT_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _failure(manifest: dict, log_dir: Path, as_nodes: bool, torchrun_log: Path, node: int | None,
             master_port: int | None) -> RunFailed:
    """Why a torchrun failed, from its log: the rank that failed first and the tail of its own log."""
    text = torchrun_log.read_text(errors="replace") if torchrun_log.is_file() else ""
    found = _ROOT_CAUSE.search(text)
    if found is not None:
        rank, code = int(found.group(1)), int(found.group(2))
        # torchrun's "first observed failure" is first by a clock of seconds: a rank that refused
        # its input (a HetpartError, status 2) and the peer it left in a collective (status 1) fail
        # in the same second, and the peer may be named. The refusing rank is the cause.
        refused = sorted(int(r) for r, c in _ANY_FAILURE.findall(text) if int(c) == HetpartError.exit_code)
        if code != HetpartError.exit_code and refused:
            rank, code = refused[0], HetpartError.exit_code
        entry = manifest["ranks"][rank] if rank < len(manifest["ranks"]) else {}
        of = f" of pipeline {entry['pipeline']}" if "pipeline" in entry else ""  # several pipelines (issue 19)
        where = f"stage {entry.get('stage', rank)}{of} on {entry.get('planned_device', '?')}"
        err = RunFailed(
            f"rank {rank} ({where}) {_exit_words(code)} during the run; every other rank was stopped.\n"
            f"{_rank_tail(log_dir, manifest, as_nodes, rank)}\n"
            f"every rank's log and torchrun's are in {log_dir}"
        )
        if code == HetpartError.exit_code:  # the rank reported a HetpartError of its own
            err.exit_code = HetpartError.exit_code
        else:  # a rank that died: its device, for the resume commands (NOTE [checkpoint layout])
            err.dead_device = entry.get("planned_device")
        return err
    if _PORT_IN_USE.search(text):
        port = f"port {master_port}" if master_port is not None else "the rendezvous port"
        return RunFailed(f"torchrun could not listen on {port} of 127.0.0.1: address already in use; pass a "
                         f"free --master-port, or leave it out to let hetpart pick one (torchrun's log: {torchrun_log})")
    lines = _without_tracebacks(text.rstrip().splitlines())[-20:]
    which = f"torchrun (node {node})" if node is not None else "torchrun"
    return RunFailed(f"{which} failed before any rank reported an error; the last lines of {torchrun_log}:\n"
                     + "\n".join(lines))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check_port_free(port: int) -> None:
    """Refuse a --master-port another process listens on, before starting any rank."""
    if not 1 <= port <= 65535:
        raise HetpartError(f"--master-port {port}: expected a TCP port between 1 and 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torchrun's store does: TIME_WAIT is free
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise HetpartError(f"--master-port {port}: 127.0.0.1:{port} is not free ({err.strerror}); pass another "
                               "port, or leave --master-port out to let hetpart pick a free one") from None


def _torchrun_commands(manifest: dict, log_dir: Path, as_nodes: bool, master_port: int | None,
                       forked: bool) -> list[list[str]]:
    """One torchrun for the whole plan, or one per planned node (NOTE [ranks are stages]), each ending where the
    worker's own arguments follow. Without --master-port a single torchrun rendezvouses on a port of its own
    choosing (`--standalone`). `forked`: the ranks are forks of one interpreter that imported the worker (NOTE
    [forked ranks] in agent.py)."""
    torchrun = [sys.executable, "-m", "hetpart.runtime.agent" if forked else "torch.distributed.run"]
    entry = (["--start-method", "forkserver", "--run-path", str(Path(__file__).with_name("worker.py"))] if forked
             else ["-m", "hetpart.runtime.worker"])
    if not as_nodes and master_port is None:
        return [torchrun + ["--standalone", "--nnodes=1", f"--nproc-per-node={manifest['world_size']}",
                            "--log-dir", str(log_dir), "--redirects", "3"] + entry]
    port = master_port if master_port is not None else _free_port()
    nodes = manifest["nodes"] if as_nodes else [{"node_rank": 0, "ranks": list(range(manifest["world_size"]))}]
    return [
        torchrun + [f"--nnodes={len(nodes)}", f"--node-rank={node['node_rank']}",
                    f"--nproc-per-node={len(node['ranks'])}", "--rdzv-backend=static",
                    "--master-addr=127.0.0.1", f"--master-port={port}",
                    "--log-dir", str(log_dir / f"node{node['node_rank']}" if as_nodes else log_dir),
                    "--redirects", "3"] + entry
        for node in nodes
    ]


def _stop(procs: list[subprocess.Popen], grace_s: float = 5) -> None:
    """SIGTERM every torchrun still running and its process group (each stops its ranks), SIGKILL
    what is left after `grace_s`.

    Each torchrun leads a session of its own (`_run_torchruns`), so the whole group is signalled,
    whatever signal reached hetpart; a worker whose torchrun is SIGKILLed notices and exits within a
    second (NOTE [orphaned ranks] in worker.py).
    """
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()
    # A rank may outlive its torchrun by a moment (NOTE [orphaned ranks]): "every rank was stopped" is said
    # only once no process of any group runs, SIGKILLed past the grace.
    for p in procs:
        while _group_running(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_running(p.pid):
            _signal_group(p, signal.SIGKILL)
            end = time.monotonic() + 5
            while _group_running(p.pid) and time.monotonic() < end:
                time.sleep(0.05)


def _group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (a zombie does not: it has ended, its parent reaps it)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: any member, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            state, _, group = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):  # gone meanwhile
            continue
        if state != "Z" and int(group) == pgid:
            return True
    return False


def _signal_group(p: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:  # the group is gone; the leader may still need reaping
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)


def _run_torchruns(cmds: list[list[str]], manifest: dict, log_dir: Path, opts: "RunOptions") -> None:
    """Start every torchrun and wait for all; a failure stops them all.

    NOTE [one rank fails]: torchrun stops the other ranks
    of its own node when one fails; the ranks of other nodes would wait for it in gloo, so the first
    torchrun to fail (or the --timeout) stops every other torchrun, and the error names the rank."""
    env = {**os.environ, "OMP_NUM_THREADS": str(rank_threads())}
    env["PYTHONSAFEPATH"] = "1"  # torchrun and the ranks never import from the working directory (it may be DIR)
    env["PYTHONUNBUFFERED"] = "1"  # a rank's lines reach its log as it prints them (torchrun's `python -u`)
    from hetpart.runtime.worker import LAUNCHER_PID_ENV

    env[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks exit when this process is gone: NOTE [orphaned ranks]
    log_dir.mkdir(parents=True, exist_ok=True)
    launcher_logs = [log_dir / f"torchrun{i}.log" for i in range(len(cmds))]
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + opts.timeout_s
    failed: int | None = None
    timed_out = False
    try:
        for cmd, log in zip(cmds, launcher_logs):
            with exclusive_file(log) as f:  # a file, not a pipe: a chatty torchrun cannot block on a full pipe
                procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                              start_new_session=True))  # its own group: `_stop` ends it all
        while any(p.poll() is None for p in procs):
            # The first torchrun to fail stops the rest (NOTE [one rank fails]).
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None:
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        _stop(procs)
    if failed is None:
        failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    if timed_out:
        tails = "\n".join(_rank_tail(log_dir, manifest, opts.as_nodes, r, lines=5)
                          for r in range(manifest["world_size"]))
        raise RunFailed(f"the run did not finish in {opts.timeout_s:g} s (--timeout); every rank was stopped. "
                        f"The ranks' logs:\n{tails}")
    if failed is not None:
        raise _failure(manifest, log_dir, opts.as_nodes, launcher_logs[failed],
                       failed if len(cmds) > 1 else None, opts.master_port)


def _not_replanned(plan: PlanReport, manifest: dict) -> str | None:
    """What this plan runs that `hetpart replan` refuses (the advice after a rank died differs), or None."""
    # Tensor-parallel stages, of one degree or mixed per machine, are re-planned (NOTE [re-plan of mixed degrees]);
    # data-parallel pipelines at mixed degrees are not (NOTE [re-plan of tensor-parallel pipelines] in replan_tp.py).
    if plan.virtual_stages is not None:
        return "virtual stages"
    if plan.pipelines is not None and is_mixed(manifest):
        return "data-parallel pipelines at different tensor-parallel degrees"
    return None


def _check_own_outputs(out: Path, log_dir: Path, measure: bool) -> None:
    """An error, before anything runs, if the logs/ or measured.json this run replaces holds a file
    hetpart did not write (NOTE [what --force replaces] in hetpart/codegen/publish.py)."""
    foreign = foreign_log(log_dir) if log_dir.is_dir() and not log_dir.is_symlink() else None
    if foreign is not None:
        raise HetpartError(f"'{log_dir}' holds '{foreign}', which hetpart did not write; `run` replaces {log_dir} "
                           f"with this run's logs: move '{foreign}' out of it")
    measured = out / "measured.json"
    if measure and measured.exists() and not measured.is_symlink() and not is_measured_json(measured):
        raise HetpartError(f"'{measured}' is not a measured.json `run --measure` wrote, and this run would replace "
                           "it: move it out of the artifacts directory")


@dataclass(frozen=True)
class RunOptions:
    mode: str = "inference"  # or "training": loss on the last stage, an optimizer step on every rank
    schedule: str | None = "gpipe"  # or "1f1b", "interleaved-1f1b", "interleaved-zb"; None: the plan's (schedules.py)
    microbatches: int | None = None  # default: the plan's
    steps: int = 1
    verify: bool = False
    timeout_s: float = 600
    optimizer: str | None = None  # training: --optimizer, --lr (None: left out; NOTE [the run's optimizer])
    lr: float | None = None
    as_nodes: bool = False  # one torchrun per planned node on loopback (a multi-node rehearsal)
    measure: bool = False  # write DIR/measured.json
    emulate: bool = False  # each rank on a core, throttled to its device's speed (NOTE [emulated devices])
    emulate_by: str = "quota"  # or "sleep": NOTE [emulation by sleep] in runtime/emulate.py
    master_port: int | None = None  # the rendezvous port on 127.0.0.1 (default: a free one)
    batch_size: int | None = None  # run at this batch (default: the traced one); the batch is always dynamic
    seq_len: int | None = None  # run at this sequence length, where the plan's is dynamic (default: the traced one)
    model: str | None = None  # a file model's FILE.py:FN (NOTE [model files] in artifacts.py)
    trust_model_file: bool = False  # import the model file though it is not the one plan.json hashed
    key: Path | None = None  # refuse a directory whose manifest.json.hmac is missing or wrong (hetpart/trust.py)
    tolerances: Tolerances = Tolerances()  # --verify's --rtol/--atol (NOTE [verify tolerances])
    checkpoints: CheckpointFlags = CheckpointFlags()  # training: save and resume (NOTE [checkpoint layout])


def _check_options(opts: RunOptions, batch_size: int, world: int, m: int, manifest: dict | None = None) -> None:
    if opts.mode not in ("inference", "training"):
        raise HetpartError(f"--mode {opts.mode}: expected inference or training")
    if manifest is not None:
        check_schedule(opts.schedule, manifest, m)  # and what a virtual-stage plan runs: runtime/schedules.py
    elif opts.schedule not in SCHEDULES:
        raise HetpartError(f"--schedule {opts.schedule}: expected one of {', '.join(SCHEDULES)}")
    if m < 1 or batch_size % m:
        raise HetpartError(f"--microbatches {m} must be >= 1 and divide the batch size {batch_size}; "
                           "pass a --batch-size that --microbatches divides, or other --microbatches")
    pipelines = mesh_pipelines(manifest) if manifest is not None else []
    if len(pipelines) > 1:  # several data-parallel pipelines: the batch split is the plan's (NOTE [the mesh])
        planned = sum(q.microbatches or 0 for q in pipelines)
        if m != planned:
            raise HetpartError(f"--microbatches {m}: this plan's {len(pipelines)} pipelines split the batch into "
                               f"{planned} microbatches ({' + '.join(str(q.microbatches) for q in pipelines)}); "
                               f"leave --microbatches out, or partition again with --microbatches {m}")
        short = [q for q in pipelines if opts.schedule == "1f1b" and (q.microbatches or 0) < len(q.stages)]
        if short:
            raise HetpartError(f"--schedule 1f1b needs at least as many microbatches as stages in each pipeline; "
                               f"pipeline {short[0].index} has {len(short[0].stages)} stages and "
                               f"{short[0].microbatches} microbatch(es): run with --schedule gpipe, or partition "
                               "again with a --pipeline-microbatches that gives it more")
    elif opts.schedule == "1f1b" and m < (stages := len(pipelines[0].stages) if pipelines else world):
        raise HetpartError(f"--schedule 1f1b needs at least as many microbatches as stages ({stages}); "
                           f"got --microbatches {m}")
    if opts.steps < 1:
        raise HetpartError(f"--steps must be >= 1 (got {opts.steps})")
    if opts.timeout_s <= 0:
        raise HetpartError(f"--timeout must be positive (got {opts.timeout_s:g})")
    if opts.master_port is not None:
        _check_port_free(opts.master_port)
    for flag, value in (("--rtol", opts.tolerances.rtol), ("--atol", opts.tolerances.atol)):
        if not value >= 0:
            raise HetpartError(f"{flag} must be >= 0 (got {value:g})")


def run_spec(spec: ModelSpec, dynamic: dict | None, opts: RunOptions) -> ModelSpec:
    """The model spec at the run's --batch-size and --seq-len; an error where the plan's dims are static.

    NOTE [run sizes]: the batch is always dynamic; the sequence length is where plan.json's
    `dynamic.seq_len` says so (NOTE [dynamic sequence length] in frontend/export.py), within
    the range it was traced for. Every symbol of the manifest's shapes is then a size of this run
    (`symbol_sizes`), which the launcher passes on to each rank.
    """
    dynamic = dynamic or {"batch": True, "seq_len": False, "why": "planned before dynamic sequences"}
    batch, seq = opts.batch_size or spec.batch_size, opts.seq_len or spec.seq_len
    if batch < 2:
        raise HetpartError(f"--batch-size must be at least 2 (got {batch}): the model's inputs are built at it")
    if seq != spec.seq_len:
        if not dynamic.get("seq_len"):
            why = f" ({dynamic['why']})" if dynamic.get("why") else ""
            raise HetpartError(f"--seq-len {seq}: this plan's sequence length is static, {spec.seq_len}{why}; "
                               f"run at --seq-len {spec.seq_len}, or partition again at --seq-len {seq}")
        top = dynamic.get("seq_len_max")
        if seq < 2 or (top is not None and seq > top):
            raise HetpartError(f"--seq-len {seq}: this plan runs sequences of 2 to {top or 'any length'} tokens")
    return dataclasses.replace(spec, batch_size=batch, seq_len=seq)


def _target(manifest: dict, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """The training target: random, shaped like the model's first output at the full batch."""
    first = stage_entries(manifest)[-1]["outputs"][0]  # the last stage's
    shape = [dim_size(d, symbol_sizes(manifest, batch_size, seq_len)) for d in first["shape"]]
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randn(shape, generator=generator)


def _outputs(io_dir: Path, manifest: dict) -> tuple[torch.Tensor, ...]:
    """The first step's outputs: the last rank's, or every pipeline's last rank's concatenated in batch order."""
    from hetpart.runtime.worker import outputs_file

    pipelines = mesh_pipelines(manifest)
    several = len(pipelines) > 1
    parts = []
    for q in pipelines:
        last = manifest["ranks"][q.stages[-1][0]] if several else stage_entries(manifest)[-1]
        got = load_file(str(io_dir / outputs_file(q.index if several else None)))
        parts.append([got[o["name"]] for o in last["outputs"]])
    return tuple(torch.cat(column) if several else column[0] for column in zip(*parts))


def output_names(structure: OutputStructure | None, count: int) -> list[str]:
    """How verify names each flat output: its key in the model's output (`'logits'`), else `0`, `1`, ..."""
    if structure is not None and len(structure.keys) == count:
        return [repr(k) for k in structure.keys]
    return [str(i) for i in range(count)]


def _plan_structure(plan: PlanReport) -> OutputStructure | None:
    """A dict or list output's structure, from plan.json's `outputs` (NOTE [model outputs] in frontend/export.py)."""
    recorded = plan.outputs or {}
    kinds = {"dict": dict, "list": list}
    if recorded.get("type") not in kinds:
        return None  # a tensor or a tuple: the flat tuple is the model's own output
    return OutputStructure(recorded["type"], tuple(recorded["names"]), kinds[recorded["type"]])


def run_pipeline(out: Path, opts: RunOptions = RunOptions(), echo: Callable[[str], None] = print) -> RunResult:
    # Nothing of `out` runs before all of it is checked (NOTE [artifacts are code] in hetpart/trust.py).
    key = read_key(opts.key, out) if opts.key is not None else None
    manifest = load_manifest(out, key)
    plan = read_plan(out, manifest)
    check_listed_files(out, manifest)
    for entry in stage_entries(manifest):  # every stage's, a rank's virtual ones too
        check_rank_files(out, entry)
    if opts.schedule is None:
        opts = dataclasses.replace(opts, schedule=default_schedule(plan.schedule, opts.mode))
    spec = run_spec(model_spec_for_run(plan, opts.model, opts.trust_model_file, echo), plan.dynamic, opts)
    m = opts.microbatches or plan.microbatches
    world = manifest["world_size"]
    _check_options(opts, spec.batch_size, world, m, manifest)
    emulation = emulation_plan(plan, rank_devices=[r["planned_device"] for r in manifest["ranks"]],
                               mode=opts.emulate_by) if opts.emulate else None  # NOTE [emulated devices] in runtime/emulate.py: one slot per rank
    ckpt = run_checkpoints(manifest, as_json(plan.model), spec, m, opts, echo)  # NOTE [checkpoint layout]
    first_step = ckpt.first_step if ckpt is not None else 0
    optim = resumed_optimizer(opts, ckpt)  # NOTE [the run's optimizer]: the checkpoint's on a resume
    if ckpt is not None and ckpt.every and first_step // ckpt.every == (first_step + opts.steps) // ckpt.every:
        echo(f"note: --checkpoint-every {ckpt.every}: no step of this run ({first_step + 1} to "
             f"{first_step + opts.steps}) is a multiple of it, so it writes no checkpoint")
    if emulation is not None and emulation.mode == "quota":
        find_hierarchy()  # a writable cgroup, before anything runs
    if key is None and is_signed(out):
        echo(f"note: {out} is signed ({SIGNATURE_NAME}); pass --key FILE to check the signature")
    if opts.verify:
        module, inputs = reference_model(out, manifest, spec)
    else:  # only the inputs are needed: a plan traced without weights (--meta) is not built with them
        module, inputs = load_model(spec, meta=plan.weights == "manifest")
    check_example_batch(spec, inputs)  # a file model at another --batch-size: NOTE [file model batch]
    structure = module.output_structure() if isinstance(module, HFModel) else _plan_structure(plan)
    training = opts.mode == "training"
    log_dir = out / "logs"
    _check_own_outputs(out, log_dir, opts.measure)
    if log_dir.is_symlink():  # hetpart's own output name: the link itself is replaced, never followed
        log_dir.unlink()
    fresh_dir(log_dir, "the run's logs")  # NOTE [safe writes]
    write_logs_marker(log_dir)  # listing nothing yet: NOTE [what --force replaces]
    with tempfile.TemporaryDirectory(prefix="hetpart-run-") as io:
        io_dir = Path(io)
        names = [i["name"] for i in manifest["ranks"][0]["inputs"]]
        save_file({n: x.contiguous() for n, x in zip(names, inputs)}, str(io_dir / "inputs.safetensors"))
        target = _target(manifest, spec.batch_size, spec.seq_len, spec.seed) if training else None
        if target is not None:
            save_file({"target": target}, str(io_dir / "target.safetensors"))
        worker_args = [str(out), "--io", str(io_dir), "--microbatches", str(m),
                       "--mode", opts.mode, "--schedule", opts.schedule, "--steps", str(opts.steps),
                       *optim.worker_args(), "--timeout", f"{opts.timeout_s:g}",
                       "--batch-size", str(spec.batch_size), "--seq-len", str(spec.seq_len),
                       "--device", "auto" if torch.cuda.is_available() and not opts.emulate else "cpu"]
        if opts.key is not None:
            worker_args += ["--key", str(opts.key.resolve())]
        if opts.verify and training:
            worker_args += ["--dump-weights"]  # the weights after the last step, for --verify
        worker_args += ["--checkpoint", ckpt.to_json()] if ckpt is not None else []
        worker_args += ["--timeline"] if opts.measure else []  # NOTE [action timeline] in runtime/timeline.py
        make_checkpoint_dir(ckpt)  # not before: a run refused leaves no folder behind
        cmds = _torchrun_commands(manifest, log_dir, opts.as_nodes, opts.master_port, forked=not opts.emulate)
        where = (f"{len(cmds)} torchrun node(s) on loopback" if opts.as_nodes else "one torchrun")
        pipelines = mesh_pipelines(manifest)
        if len(pipelines) > 1:  # several data-parallel pipelines (issue 19)
            where += (f" of {len(pipelines)} pipelines ({' + '.join(str(len(q.stages)) for q in pipelines)} stages, "
                      f"{' + '.join(str(q.microbatches) for q in pipelines)} microbatches)")
        backend = manifest["backend"] if torch.cuda.is_available() and not opts.emulate else "gloo on CPU"
        echo(f"launching {where}: {world} rank(s), {backend}, {opts.mode} with {opts.schedule}"
             f"{f' and {optim.said()}' if training else ''}, "
             f"{m} microbatch(es), {opts.steps} step(s); logs in {log_dir}")
        try:
            with emulating(emulation, io_dir, echo) if emulation is not None else contextlib.nullcontext():
                _run_torchruns([c + worker_args for c in cmds], manifest, log_dir, opts)
        except RunFailed as err:  # a rank died: the last checkpoint and how to resume (NOTE [checkpoint layout])
            raise with_resume_commands(err, out, ckpt, opts, _not_replanned(plan, manifest)) from None
        except (KeyboardInterrupt, Terminated) as err:  # the user stopped it: the last checkpoint, how to go on
            err.resume_note = stopped_resume(out, ckpt, opts)  # printed by the CLI after "interrupted"
            raise
        finally:
            write_logs_marker(log_dir)  # every file torchrun wrote, which the next run or --force may remove
        outputs = _outputs(io_dir, manifest)
        step_s = [float(x) for x in (io_dir / "step_seconds").read_text().split()]
        measured = measurement(io_dir, world, m, plan, opts, rank_threads()) if opts.measure else None
        if measured is not None and emulation is not None:
            measured["emulation"] = emulation.to_json()
            if measured["predicted_step_time_us"] is not None:  # the plan's step at the emulated speeds
                measured["emulation"]["predicted_step_time_us"] = round(
                    measured["predicted_step_time_us"] / emulation.scale, 3)
        if measured is not None:
            atomic_write(out / "measured.json", json.dumps(measured, indent=2) + "\n")  # NOTE [safe writes]
        verification = None
        if opts.verify:
            ref_flat: list = []  # the outputs of the run's first step: before the reference trains, or resumed
            take = lambda: ref_flat.extend(reference_outputs(module, inputs))  # noqa: E731 (NOTE [checkpoint layout])
            reference = reference_training(module, inputs, target, m, first_step + opts.steps, optim,
                                           rank_threads(), first_step, take, opts.tolerances) if training else take()
            if len(ref_flat) != len(outputs):
                raise HetpartError(f"verification: the model returns {len(ref_flat)} outputs, the pipeline {len(outputs)}")
            checks = training_checks(io_dir, manifest, reference, opts.tolerances) if training else None
            verification = Verification(
                [check_tensor(f"output {n}", a, b, opts.tolerances)
                 for n, a, b in zip(output_names(structure, len(outputs)), outputs, ref_flat)],
                checks.grads if checks else [], opts.tolerances, losses=checks.losses if checks else [],
                weights=checks.weights if checks else [], replayed=bool(training and reference.initial),
                resumed=checks.resumed if checks else [],  # NOTE [verify a resume]
                resume_told=reference.resume_told if training else True)
    return RunResult(outputs=outputs, step_seconds=step_s[0],
                     max_abs_diff=verification.max_abs_diff if verification else None,
                     grad_rel_err=verification.max_grad_rel_err if verification else None,
                     all_step_seconds=step_s, measured=measured, structure=structure, verification=verification)
