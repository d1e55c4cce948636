"""`hetpart partition | run | replan | inspect | placement | profile | shard-weights | check | export | ...`.

User mistakes raise HetpartError: printed as one message (what, where, what to
do), exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import threading
import warnings
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart.cli_args import build_parser
from hetpart.errors import HetpartError, Terminated
from hetpart.plan_report import PlanReport


def _model_arg(model: str) -> str:
    """MODEL as recorded in specs: file models by absolute path."""
    if not model.startswith(("zoo:", "hf:")) and ":" in model:
        path, _, fn = model.rpartition(":")
        model = f"{Path(path).resolve()}:{fn}"
    return model


# NOTE [arguments before torch]
# Importing torch takes 5 to 20 s on a busy machine, and a mistyped preset, device type or zoo name
# should not wait for it. `_check_before_torch` checks what needs no torch first: the cluster
# (hetpart.devices is torch-free) and a zoo name (hetpart.names); the commands that take them
# call it before their first import of torch. tests/export/test_fast_cli.py checks that such an
# error leaves torch unimported.
def _check_before_torch(model: str, cluster: str | None) -> None:
    from hetpart.devices import load_cluster
    from hetpart.errors import did_you_mean
    from hetpart.names import ZOO_NAMES

    name = model.removeprefix("zoo:")
    if model.startswith("zoo:") and name not in ZOO_NAMES:
        raise HetpartError(f"unknown model 'zoo:{name}' (known: {', '.join(sorted(ZOO_NAMES))})"
                           f"{did_you_mean(name, ZOO_NAMES, 'zoo:')}; see `hetpart models`")
    if cluster is not None:
        load_cluster(cluster)


def _partition(args: argparse.Namespace, console: Console) -> int:
    _check_before_torch(args.model, args.cluster)  # NOTE [arguments before torch]
    from hetpart.tp_machines import degree_of_place, parse_tensor_parallel

    args.tensor_parallel, tp_machines = parse_tensor_parallel(args.tensor_parallel)  # T, or MACHINE=T pairs
    if tp_machines:
        from hetpart.devices import load_cluster

        degree_of_place(tp_machines, load_cluster(args.cluster))
    from hetpart.partitioner.schedule_choice import check_auto_options  # NOTE [schedule choice]

    check_auto_options(args.schedule, args.microbatches, args.max_microbatches, args.batch_size, args.mode,
                       args.virtual_stages, args.pipelines is not None or args.parallel == "data", args.strategy,
                       args.tensor_parallel > 1 or args.max_tensor_parallel > 1)
    pipelines = _pipelines_before_torch(args)
    from hetpart.compile import CompileOptions, compile_model
    from hetpart.frontend import ModelSpec
    from hetpart.report import print_plan
    from hetpart.report.progress import Progress
    from hetpart.report.schedule_choice import print_schedule_choice

    spec = ModelSpec(_model_arg(args.model), dict(args.overrides), args.batch_size, args.seq_len, args.seed)
    opts = CompileOptions(microbatches=args.microbatches, time_limit_s=args.time_limit, gap=args.gap, seed=args.seed,
                          force=args.force, pt2=args.pt2, meta=args.meta, print_ir_after=frozenset(args.print_ir_after),
                          verbose=args.verbose, dump_ir=args.dump_ir, mode=args.mode, schedule=args.schedule,
                          virtual_stages=args.virtual_stages,
                          optimizer_bytes_per_param=args.optimizer_bytes_per_param, profiles=tuple(args.profiles),
                          sign_key=args.sign_key, check_certificate=args.check_certificate,
                          strategy=args.strategy, align=args.align, tensor_parallel=args.tensor_parallel,
                          tensor_parallel_machines=tp_machines,
                          max_tensor_parallel=args.max_tensor_parallel,
                          tensor_parallel_per_machine=args.tensor_parallel_per_machine,
                          max_microbatches=args.max_microbatches, **pipelines)
    cluster = args.cluster
    if args.memory_reserve:  # NOTE [memory reserve]: taken off every device once, before anything plans
        from hetpart.devices import load_cluster
        from hetpart.devices.catalog import GiB
        from hetpart.devices.cluster import with_reserve

        cluster = with_reserve(load_cluster(args.cluster), round(args.memory_reserve * GiB))
    result = compile_model(spec, cluster, args.out, opts,
                           echo=lambda text: console.print(text, markup=False, highlight=False),
                           progress=Progress.for_console(console))
    print_plan(result.report, console)
    print_schedule_choice(result.report, console)  # --schedule/--microbatches auto (NOTE [schedule choice])
    _print_strategy(result.report, console)
    ranks = sum(len(s.devices) or 1 for s in result.report.stages)  # NOTE [tensor-parallel stages]: a group's
    dirs = "rank0" if ranks == 1 else f"rank0..rank{ranks - 1}"
    console.print(f"wrote {args.out}/ (plan.json, manifest.json, {dirs}, ir/, report.html)")
    return 0


def _pipelines_before_torch(args: argparse.Namespace) -> dict:
    """CompileOptions' `pipelines`, `pipeline_microbatches` and `parallel`, checked before torch (issue 19)."""
    from hetpart.devices import load_cluster
    from hetpart.pipeline_groups import check_pipeline_options, parse_pipeline_microbatches, parse_pipelines

    groups = (parse_pipelines(args.pipelines, [d.name for d in load_cluster(args.cluster).devices])
              if args.pipelines is not None else None)
    counts = parse_pipeline_microbatches(args.pipeline_microbatches) if args.pipeline_microbatches else None
    check_pipeline_options(groups, counts, args.microbatches, args.parallel)
    return {"pipelines": groups, "pipeline_microbatches": counts, "parallel": args.parallel}


def _run(args: argparse.Namespace, console: Console) -> int:
    from hetpart.runtime import RunOptions, Tolerances, run_pipeline
    from hetpart.runtime.checkpoint import CheckpointFlags

    opts = RunOptions(mode=args.mode, schedule=args.schedule, microbatches=args.microbatches, steps=args.steps,
                      verify=args.verify, timeout_s=args.timeout, as_nodes=args.as_nodes, master_port=args.master_port,
                      measure=args.measure, batch_size=args.batch_size, seq_len=args.seq_len, emulate=args.emulate,
                      emulate_by=args.emulate_by, optimizer=args.optimizer, lr=args.lr,
                      model=_model_arg(args.model) if args.model else None, trust_model_file=args.trust_model_file,
                      key=args.key, checkpoints=CheckpointFlags(args.checkpoint_dir, args.checkpoint_every,
                                                                args.keep_checkpoints, args.resume),
                      tolerances=Tolerances(**{k: v for k, v in (("rtol", args.rtol), ("atol", args.atol))
                                               if v is not None}))
    result = run_pipeline(args.out, opts, echo=console.print)
    console.print(f"pipeline step: {_step_said(result.all_step_seconds or [result.step_seconds])}; "
                  f"outputs: {result.described_outputs()}")
    if result.measured is not None:
        _print_measured(result.measured, console)
    if result.verification is None:
        return 0
    for line in result.verification.report():
        print(line)
    return 0 if result.verification.verdict == "PASS" else 1


def _replan(args: argparse.Namespace, console: Console) -> int:
    from hetpart.replan import replan
    from hetpart.report import print_plan
    from hetpart.trust import SIGNATURE_NAME, is_signed

    result = replan(args.old, args.out, cluster=args.cluster, lose=tuple(args.lose), add=tuple(args.add),
                    slack=args.slack, time_limit_s=args.time_limit, seed=args.seed, force=args.force,
                    echo=lambda text: console.print(text, markup=False, highlight=False), model=args.model,
                    trust_model_file=args.trust_model_file, checkpoint=args.checkpoint, sign_key=args.sign_key)
    print_plan(result.report, console)
    console.print(f"wrote {args.out}/ (plan.json with `replan`: the bytes to move per link, beside the from-scratch "
                  "plan's)" + (f", signed ({SIGNATURE_NAME})" if args.sign_key is not None else ""),
                  markup=False, highlight=False)
    if args.sign_key is None and is_signed(args.old):  # NOTE [re-plan of a signed plan]
        console.print(f"note: {args.old} is signed ({SIGNATURE_NAME}), {args.out} is not: `hetpart run {args.out} "
                      "--key KEY` refuses it; re-plan with --sign-key KEY to sign it", markup=False, highlight=False)
    if args.sign_key is not None and not is_signed(args.old):  # NOTE [re-plan of a signed plan]: nothing to check
        console.print(f"note: {args.old} is not signed ({SIGNATURE_NAME}), so only its files' sha256 against its "
                      f"manifest.json were checked: {args.out}'s signature vouches for a plan made from it; make sure "
                      f"{args.old} is the plan you meant (`hetpart inspect {args.old}`) before you run {args.out}",
                      markup=False, highlight=False)
    return 0


def _step_said(seconds: list[float]) -> str:
    """NOTE [the step printed]: the step `run` prints, of the last rank's step times (seconds)."""
    if len(seconds) == 1:
        return f"{seconds[0] * 1e3:.1f} ms"
    import statistics

    rest = "the run's second step" if len(seconds) == 2 else f"the median of the run's last {len(seconds) - 1} steps"
    return f"{statistics.median(seconds[1:]) * 1e3:.1f} ms ({rest}; its first, which warms up, took {seconds[0] * 1e3:.1f} ms)"


# NOTE [the step printed]: `pipeline step:` was the run's first step, which warms up (pipelining's shape inference,
# the first allocations, gloo's first connections), whatever --steps said: `run --steps 3 --measure` printed it
# above the measured step, two different figures for one step (docs/benchmarks.md, "ux21"). Past one step it is
# the median of the steps after the first, the figure measured.json's `step_time_us` is (runtime/measured.py),
# and the first is named.
def _print_measured(measured: dict, console: Console) -> None:
    table = Table(box=box.SIMPLE_HEAD, title=f"measured vs predicted ({measured['schedule']}, "
                                             f"{measured['microbatches']} microbatches, per microbatch)")
    # NOTE [measured forward] in runtime/measured.py: a rank's forward, against the plan's forward
    for col in ("rank", "device", "measured forward", "CPU time", "predicted forward", "CPU / predicted"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for s in measured["stages"]:
        cpu, predicted = s["measured_cpu_time_us"], s["predicted_forward_us"]
        ratio = cpu / predicted if predicted else float("nan")
        table.add_row(str(s["index"]), s["device"], f"{s['measured_time_us']:.1f} us", f"{cpu:.1f} us",
                      f"{predicted:.1f} us", f"{ratio:.2f}")
    console.print(table)
    predicted, what = measured["predicted_step_time_us"], measured.get("predicted_step")  # NOTE [predicted step]
    console.print(f"step: measured {measured['step_time_us'] / 1e3:.2f} ms"
                  + (f", simulated {predicted / 1e3:.2f} ms" if predicted is not None else "")
                  + (f" ({what}" + ("; the optimizer step is in the measured step only)" if measured["mode"] ==
                                    "training" and predicted is not None else ")") if what else ""),
                  markup=False, highlight=False)


def _print_strategy(report: PlanReport, console: Console) -> None:
    """A plan of a baseline (`--strategy NAME`) says so below its table (NOTE [--strategy] in baselines.py)."""
    if report.strategy != "optimal":
        console.print(f"strategy {report.strategy}: the artifacts run this baseline's plan, not the optimised one")


def _inspect(args: argparse.Namespace, console: Console) -> int:
    from hetpart.report import print_plan
    from hetpart.runtime.artifacts import load_manifest, read_plan
    from hetpart.trust import read_key

    if args.tp_rank is not None and args.stage is None:
        raise HetpartError(f"--tp-rank {args.tp_rank} goes with --stage K: it picks a rank of stage K's "
                           "tensor-parallel group")
    manifest = load_manifest(args.out, read_key(args.key, args.out) if args.key is not None else None)
    plan = read_plan(args.out, manifest)
    if args.json:
        import json

        from hetpart.report.inspect import inspect_json

        print(json.dumps(inspect_json(args.out, manifest, plan), indent=1))
    elif args.stage is not None:
        from hetpart.report.inspect import stage_text

        print(stage_text(args.out, manifest, plan, args.stage, args.tp_rank), end="")
    elif args.ir is not None:
        from hetpart.report.inspect import ir_dump

        print(ir_dump(args.out, args.ir, manifest), end="")
    else:
        from hetpart.report.schedule_choice import print_schedule_choice

        print_plan(plan, console)
        print_schedule_choice(plan, console)  # a plan made with --schedule/--microbatches auto: its candidates
        _print_strategy(plan, console)
    return 0


def _profile(args: argparse.Namespace, console: Console) -> int:
    _check_before_torch(args.model, args.cluster)  # NOTE [arguments before torch]
    from hetpart.devices import load_cluster
    from hetpart.frontend import ModelSpec
    from hetpart.profiler.measure import check_profile_type, profile_model
    from hetpart.profiler.siblings import ranks_sharing_a_machine
    from hetpart.profiler.table import check_output_path

    cluster = load_cluster(args.cluster) if args.cluster is not None else None
    check_profile_type(args.device_type, cluster)  # an unknown type is an error that lists the known ones
    check_output_path(args.out)
    spec = ModelSpec(_model_arg(args.model), dict(args.overrides), args.batch_size, args.seq_len, args.seed)
    concurrent = args.concurrent
    if cluster is not None:
        concurrent = ranks_sharing_a_machine(cluster, args.device_type)
    prof = profile_model(spec, args.microbatches, args.device_type, device=args.device, repeats=args.repeats,
                         warmup=args.warmup, threads=args.threads, backward=args.backward, concurrent=concurrent)
    prof = prof.scaled(args.speed_scale)
    prof.save(args.out)
    total_us = sum(prof.forward_ns.values()) / 1e3
    console.print(f"profiled {len(prof.forward_ns)} distinct ops"
                  + (f" ({len(prof.backward_ns)} backwards)" if args.backward else "") + f" of {spec.model} on {args.device} "
                  f"({prof.threads} thread(s)" + (f", {prof.concurrent} processes side by side" if prof.concurrent > 1
                                                   else "") + f") as device type '{prof.device_type}'"
                  + (f" ({prof.speed_scale:g}x this machine's speed)" if prof.speed_scale != 1 else "") + ": "
                  f"{total_us:.1f} us over one of each; wrote {args.out}", markup=False, highlight=False)
    return 0


def _profile_link(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from hetpart.profiler.links import DEFAULT_SIZES, measure_link

    fit = measure_link(args.op, args.ranks, tuple(args.sizes or DEFAULT_SIZES), args.repeats, args.gap_us)
    between = f"mean of {args.repeats}, each after {args.gap_us} us of matmuls" if args.gap_us else \
        f"median of {args.repeats}"
    table = Table(title=f"gloo {fit.op} among {fit.ranks} local processes ({between})")
    for col in ("bytes", "measured us", "fitted us"):
        table.add_column(col, justify="right")
    for n, t in fit.measured_us.items():
        table.add_row(f"{n:,}", f"{t:,.1f}", f"{fit.fitted_us[n]:,.1f}")
    console.print(table)
    console.print(f"fitted to the cost model's {fit.op} formula: latency {fit.latency_us:.1f} us, "
                  f"{fit.bandwidth_gbps:.3f} GB/s; for the machine's entry in a cluster file:\n{fit.toml()}",
                  markup=False, highlight=False)
    return 0


def _placement(args: argparse.Namespace) -> int:
    import json

    from hetpart.placement import read_placement, solve_placement

    if args.workers < 1:
        raise HetpartError(f"--workers must be at least 1 (got {args.workers})")
    problem = read_placement(args.input)
    result = solve_placement(problem, time_limit_s=args.time_limit, workers=args.workers, gap=args.gap,
                             check_certificate=args.check_certificate)
    if result.certificate is not None and result.certificate.warning:
        print(f"hetpart: warning: {result.certificate.warning}", file=sys.stderr)
    print(json.dumps(result.to_json(problem)))
    return 0


def _shard_weights(args: argparse.Namespace, console: Console) -> int:
    from hetpart.codegen.weights import shard_weights
    from hetpart.runtime.artifacts import check_before_shard
    from hetpart.units import format_bytes

    key = check_before_shard(args.out, args.sign_key)  # what it reads, and the signature it replaces
    result = shard_weights(args.out, args.checkpoint, allow_cast=args.allow_cast, sign_key=key,
                           echo=lambda text: console.print(text, markup=False, highlight=False))
    console.print(f"wrote weights.safetensors for {result.ranks} rank(s): {result.tensors} tensor(s), "
                  f"{format_bytes(result.bytes_written)}, {result.from_checkpoint} from {args.checkpoint}"
                  + (f" ({result.cast} converted)" if result.cast else ""))
    return 0


def _check(args: argparse.Namespace, console: Console) -> int:
    from hetpart.devices import load_cluster
    from hetpart.devices.show import print_cluster

    print_cluster(load_cluster(args.cluster), console)  # torch-free: NOTE [arguments before torch]
    return 0


def _export(args: argparse.Namespace) -> int:
    from hetpart.export import export_plan

    file = None if args.file is not None and str(args.file) == "-" else args.file  # `--out -`: stdout, as without
    result = export_plan(args.out, args.format, file, args.key, args.force)
    for note in result.notes:
        print(note, file=sys.stderr)
    if file is None:
        print(result.text, end="")
    else:
        wrote = [str(file)] * result.main_file + [str(file.with_suffix(s)) for s in result.extra_files]
        print(f"wrote {', '.join(wrote)}", file=sys.stderr)
    return 0


def _devices(console: Console) -> int:
    from hetpart.devices import CATALOG

    table = Table(title="device catalog")
    for col in ("name", "description", "fp32 TFLOP/s", "fp16/bf16 TFLOP/s", "memory GiB", "bandwidth GB/s"):
        table.add_column(col)
    for t in CATALOG.values():
        half = max(t.flops_per_s("fp16"), t.flops_per_s("bf16"))
        table.add_row(t.name, t.description, f"{t.flops_per_s('fp32') / 1e12:g}", f"{half / 1e12:g}",
                      f"{t.mem_bytes / (1 << 30):g}", f"{t.mem_bw_bytes_per_s / 1e9:g}")
    console.print(table)
    return 0


def _models(console: Console) -> int:
    from hetpart.models import ZOO

    for m in ZOO.values():
        print(f"zoo:{m.name:<12} {m.domain:<22} {m.description}")
    return 0


TERMINATING = (signal.SIGTERM, signal.SIGHUP)  # raised as errors.Terminated by _terminate


def _terminate(signum: int, frame: object) -> None:
    for sig in TERMINATING:  # once: a second signal must not cut the cleanup short
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


# NOTE [closed stdout]
# `hetpart inspect DIR --json | head -1` closes the pipe before hetpart is done writing. A plain print then
# raised BrokenPipeError (a traceback, exit 1), and rich's Console turned it into SystemExit(1), which the CLI
# took for the model's code exiting ("the model's code called sys.exit(1)", exit 2). Both now end quietly
# with 141 (128 + SIGPIPE, what `cat` or `git log` give a shell there), stdout pointed at /dev/null so that
# the interpreter's last flush does not complain. Only when stdout is really closed: a BrokenPipeError of
# another pipe (a sibling process's stdin) is still a bug with its traceback.
SIGPIPE_EXIT = 128 + signal.SIGPIPE


class _Console(Console):
    """rich's Console whose closed stdout raises BrokenPipeError instead of SystemExit (NOTE [closed stdout])."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("stdout closed")


def _stdout_closed() -> bool:
    """Whether this process's stdout is a pipe whose reader has gone (NOTE [closed stdout])."""
    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if in_main_thread:
        for sig in TERMINATING:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # under nohup SIGHUP stays ignored
                previous[sig] = signal.signal(sig, _terminate)
    try:
        return _main(argv)
    except Terminated as err:
        with contextlib.suppress(OSError):  # the terminal that hung up may be gone
            print(("hetpart: terminated" if err.signum == signal.SIGTERM else "hetpart: hangup")
                  + getattr(err, "resume_note", ""), file=sys.stderr)
        return 128 + err.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    # torch's own deprecation notices (pytree LeafSpec) are not the user's to act on.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # Tables keep their shape in pipes and logs (rich would wrap them at 80 columns).
    console = _Console() if sys.stdout.isatty() else _Console(width=160)
    args = None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "partition":
            return _partition(args, console)
        if args.command == "run":
            return _run(args, console)
        if args.command == "inspect":
            return _inspect(args, console)
        if args.command == "replan":
            return _replan(args, console)
        if args.command == "profile":
            return _profile(args, console)
        if args.command == "profile-link":
            return _profile_link(args, console)
        if args.command == "placement":
            return _placement(args)
        if args.command == "shard-weights":
            return _shard_weights(args, console)
        if args.command == "export":
            return _export(args)
        if args.command == "check":
            return _check(args, console)
        if args.command == "devices":
            return _devices(console)
        return _models(console)
    except HetpartError as err:
        print(f"hetpart: error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe than stdout: a bug in hetpart, with its traceback
        _silence_stdout()  # NOTE [closed stdout]
        return SIGPIPE_EXIT
    except KeyboardInterrupt as err:  # a training run's last checkpoint and resume command, where it has them
        print("hetpart: interrupted" + getattr(err, "resume_note", ""), file=sys.stderr)
        return 130
    except BaseException as err:
        if isinstance(err, (Exception, Terminated)):
            raise  # a bug in hetpart (its traceback), or SIGTERM for main's cleanup
        if isinstance(err, SystemExit) and args is None:
            raise  # --help, --version
        # The model's own code (its forward, as it is traced) exited: NOTE [user code exits] in frontend/load.py.
        from hetpart.frontend.load import describe_exit, exit_location

        print(f"hetpart: error: {exit_location(err)}: the model's code {describe_exit(err)}; a model must not exit "
              "or raise BaseException while hetpart builds or traces it", file=sys.stderr)
        return 2
