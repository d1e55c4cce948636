"""The `.pt2` half of a rank's files: each stage's program built from its split graph (NOTE
[stage programs]), saved without its weights (NOTE [weightless .pt2]) and byte-for-byte
deterministic (NOTE [deterministic .pt2]); a stage that cannot be built so is exported again
with `torch.export` from example inputs (NOTE [meta examples]), in parallel where CPUs are
idle (NOTE [parallel .pt2 writes])."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import time
import traceback
import zipfile
from pathlib import Path

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.value_ranges import ValueRanges

from hetpart.codegen.split import StageGraph, shared_weights_file
from hetpart.errors import HetpartError
from hetpart.frontend.fast_fake import fast_fake_kernels
from hetpart.timings import StepTimes
from hetpart.trust import sha256_file as sha256

def stage_examples(stages: list[StageGraph], inputs: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Each stage's inputs when the model runs on `inputs`, contiguous as the runtime sends them.

    NOTE [meta examples]: export reads only the examples' shapes and dtypes (it traces with
    fake tensors), so the stages run on fake tensors, weights and all (no arithmetic: a
    Llama's 6 s of forward became a fraction of a second; factory ops such as RoPE's `arange`
    stay on the device they name, which the meta device would not allow), and each example
    is zeros of the shape that came out. A stage that cannot run on fake tensors (an op
    without a fake kernel) makes them all run for real, as before.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        shapes = []
        with torch.no_grad(), fast_fake_kernels(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            values = tuple(mode.from_tensor(x) for x in inputs)
            for stage in stages:
                shapes.append([(v.shape, v.dtype) if isinstance(v, torch.Tensor) else v for v in values])
                values = tuple(stage.gm(*values))
        return [tuple(torch.zeros(v[0], dtype=v[1]) if isinstance(v, tuple) and isinstance(v[0], torch.Size) else v
                      for v in stage_values) for stage_values in shapes]
    except Exception:  # noqa: BLE001 (NOTE [meta examples]: the real run is the fallback)
        pass
    examples = []
    values = tuple(x.contiguous() for x in inputs)
    with torch.no_grad():
        for stage in stages:
            examples.append(values)
            values = tuple(v.contiguous() for v in stage.gm(*values))
    return examples


PT2_WEIGHTS = "hetpart_weights.json"  # in a .pt2's extra files: NOTE [weightless .pt2]


# NOTE [weightless .pt2]
# A stage's weights are in its weights.safetensors; torch.export.save would store them a
# second time in stage.pt2 (a 4-layer Llama's output was twice its weights). So the program
# is saved with every state_dict entry (all of a stage's weights and buffers: split.py
# registers each get_attr as one) swapped for a meta tensor of the same shape, dtype and
# Parameter-ness: torch 2.13's pt2 archive writes a tensor without storage as an empty record
# (`_get_raw_tensor_bytes`), and `torch.export.load` gives it back on the meta device. The
# archive's extra file `hetpart_weights.json` maps each state_dict key to its key in
# weights.safetensors (and names the earlier rank's file of a weight stored there: NOTE
# [weights stored once]); `hetpart.runtime.pt2.load_pt2` checks both files against the
# manifest and assigns the real tensors (`load_state_dict(assign=True)`). A bare
# `torch.export.load(...).module()` runs on meta: shapes only, no values.
def write_pt2(path: Path, stage: StageGraph, example: tuple[torch.Tensor, ...] | None = None) -> None:
    """The stage as a torch.export program with the model's dynamic dims (batch down to 1, sequence),
    without its weights (NOTE [weightless .pt2]): built from the stage's graph (NOTE [stage programs]),
    or, given `example` inputs, exported again from them (NOTE [stage dims]).

    See NOTE [deterministic .pt2].
    """
    save_pt2(path, stage, stage_program(stage) if example is None else _reexport(stage, example))


def save_pt2(path: Path, stage: StageGraph, ep: torch.export.ExportedProgram) -> None:
    """`ep`, the stage's program, as `path` without its weights (NOTE [weightless .pt2], [deterministic .pt2])."""
    unknown = sorted(set(ep.state_dict) - set(stage.weights))
    if unknown:  # a tensor the stage holds but weights.safetensors would not: it has no other home
        raise HetpartError(f"internal: stage {stage.index}'s program holds '{unknown[0]}', which is not one of "
                           "its weights (NOTE [weightless .pt2])")
    ep._state_dict = {key: _on_meta(t) for key, t in ep.state_dict.items()}
    keys = {key: stage.weights[key] for key in sorted(ep.state_dict)}
    where = {"file": "weights.safetensors", "keys": keys}
    if stage.stored_in:  # NOTE [weights stored once]: their file, relative to the rank's directory
        where["elsewhere"] = {fqn: shared_weights_file(k) for fqn, k in stage.stored_in.items()}
    raw = path.with_name(f".{path.stem}.raw.pt2")
    torch.export.save(ep, str(raw), extra_files={PT2_WEIGHTS: json.dumps(where, indent=1, sort_keys=True)})
    _rezip_deterministically(raw, path)
    raw.unlink()


def _reexport(stage: StageGraph, example: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    """The stage traced again by torch.export from example inputs (the way before NOTE [stage programs])."""
    with fast_fake_kernels():  # NOTE [fast fake kernels]
        ep = torch.export.export(stage.gm, example, dynamic_shapes=pt2_dynamic_shapes(stage), strict=False)
    for node in ep.graph.nodes:
        node.meta.pop("from_node", None)  # provenance: holds ids of in-memory graphs
    return ep


# NOTE [stage programs]
# A stage's graph is already a torch.export graph: split.py copies the model's exported ATen
# nodes, each with its fake-tensor `val` in the model's symbols (`s0` the batch, `s1` the
# sequence). So its program is built from it, not traced again (a re-export retraced every op
# and redid the shape arithmetic of the model's own trace; the figures are in docs/benchmarks.md,
# "Partition of swin_t under a quarter writing"): the graph in export's lifted form (a
# placeholder per weight, `p_<attr>` for a parameter, `b_<attr>` for a buffer, then the stage's
# inputs), its signature, and the range of each symbol its values use, from the model's shape
# env (a symbol that is dim 0 of an input, the batch, goes down to 1 as in NOTE [stage dims]).
# Relations between symbols that the model's trace guarded are not derived again: the program's
# input check tests each symbol's range, as stage.py's callers do. `ExportedProgram` checks the
# rest (the signature against the placeholders, every op with TrainingIRVerifier, the IR the
# model was exported in), and `torch.export.save` writes it as any other. Nodes keep only their
# `val` (and unbacked bindings), not export's module stacks, provenance (object ids) and stack
# traces, which nobody reads: the archive is a third smaller and saves faster. A graph that
# this refuses is exported again from example inputs (`write_pt2_files`), as before.
_KEPT_META = ("val", "unbacked_bindings")


def stage_program(stage: StageGraph) -> torch.export.ExportedProgram:
    """The stage's graph as an ExportedProgram, without tracing it again (NOTE [stage programs])."""
    from torch._export.verifier import TrainingIRVerifier
    from torch._guards import detect_fake_mode
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (
        ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument,
    )
    from torch.utils import _pytree as pytree

    gm = stage.gm
    params = {name for name, _ in gm.named_parameters()}
    fake_mode = detect_fake_mode([n.meta["val"] for n in gm.graph.nodes
                                  if isinstance(n.meta.get("val"), torch.Tensor)])
    if fake_mode is None:
        raise HetpartError(f"internal: stage {stage.index}'s graph has no fake values to build its program from")
    # Weights: parameters, then buffers, each a placeholder (export's lifted form).
    attrs = [a for a in stage.weights if a in params] + [a for a in stage.weights if a not in params]
    graph, env, inputs, weight_of = fx.Graph(), {}, [], {}
    for attr in attrs:
        kind, prefix = (InputKind.PARAMETER, "p_") if attr in params else (InputKind.BUFFER, "b_")
        weight_of[attr] = node = graph.placeholder(prefix + attr)
        node.meta["val"] = fake_mode.from_tensor(getattr(gm, attr), static_shapes=True)
        inputs.append(InputSpec(kind, TensorArgument(node.name), target=attr,
                                persistent=None if attr in params else True))
    users = []
    for old in gm.graph.nodes:
        if old.op == "placeholder":
            new = graph.placeholder(old.name)
            new.meta["val"] = old.meta["val"]
            users.append(new)
            inputs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(new.name), target=None))
        elif old.op == "get_attr":
            new = weight_of[old.target]
        elif old.op == "output":
            new = graph.output(tuple(env[a] for a in old.args[0]))
        else:
            new = graph.node_copy(old, lambda a: env[a])
            new.meta = {k: v for k, v in old.meta.items() if k in _KEPT_META}
        env[old] = new
    returned = graph.find_nodes(op="output")[0].args[0]
    outputs = [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n.name), target=None) for n in returned]
    # The range of every symbol the values use; the batch (dim 0 of an input) down to 1.
    batch = {u.meta["val"].shape[0].node.expr for u in users
             if u.meta["val"].dim() and isinstance(u.meta["val"].shape[0], torch.SymInt)}
    symbols = {sym for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)
               for d in n.meta["val"].shape if isinstance(d, torch.SymInt) for sym in d.node.expr.free_symbols}
    ranges = {}
    for sym in sorted(symbols, key=str):
        bounds = fake_mode.shape_env.var_to_range[sym]
        ranges[sym] = ValueRanges(1, bounds.upper) if sym in batch else bounds
    root = torch.nn.Module()
    for attr in attrs:
        if attr in params:
            root.register_parameter(attr, getattr(gm, attr))
        else:
            root.register_buffer(attr, getattr(gm, attr))
    signature = ModuleCallSignature(
        inputs=[], outputs=[], in_spec=pytree.tree_structure((tuple(range(len(users))), {})),
        out_spec=pytree.tree_structure(tuple(range(len(outputs)))), forward_arg_names=[u.name for u in users])
    return torch.export.ExportedProgram(
        root, graph, ExportGraphSignature(inputs, outputs), {a: getattr(gm, a) for a in attrs}, ranges,
        [ModuleCallEntry("", signature)], verifiers=[TrainingIRVerifier])


def _on_meta(t: torch.Tensor) -> torch.Tensor:
    """`t`'s shape, dtype and kind (Parameter or buffer) without its values."""
    meta = t.detach().to("meta")
    return torch.nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else meta


def pt2_dynamic_shapes(stage: StageGraph) -> tuple[dict | None, ...]:
    """`dynamic_shapes` for exporting a stage: each traced dim that is a symbol of the model's trace.

    NOTE [stage dims]: a stage input's traced shape is made of the model's symbols (the
    batch `s0`, the sequence `s1`) and integers: `s0`, `16*s0` (HF GPT-2 flattens [B, L, D] to
    [B*L, D] at a static length), `s0*s1` (the same at a dynamic one). Each symbol becomes one
    Dim shared by every input that has it, with the range export gave it (a batch that is the
    dim 0 of an input goes down to 1); a dim that is an integer multiple of one symbol is that
    multiple of its Dim; any other expression (`s0*s1`, `s1 + 1`) gets its own `Dim.AUTO`, which
    export relates to the others as the stage's code requires. Integer dims stay static.
    """
    placeholders = stage.gm.graph.find_nodes(op="placeholder")
    shapes = [getattr(p.meta.get("val"), "shape", None) for p in placeholders]
    symbols = [d for shape in shapes for d in shape or () if isinstance(d, torch.SymInt)]
    dims: dict[sympy.Symbol, torch.export.Dim] = {}
    lowest = {shape[0].node.expr for shape in shapes if shape and isinstance(shape[0], torch.SymInt)
              and isinstance(shape[0].node.expr, sympy.Symbol)}
    for d in symbols:
        for sym in sorted(d.node.expr.free_symbols, key=str):
            if sym in dims:
                continue
            bounds = d.node.shape_env.var_to_range.get(sym)
            upper = int(bounds.upper) if bounds is not None and bounds.upper.is_Integer else None  # int_oo is not
            lower = 1 if sym in lowest else max(1, int(bounds.lower)) if bounds is not None else 2
            dims[sym] = torch.export.Dim(f"d_{sym}", min=lower, **({"max": upper} if upper is not None else {}))

    def dim(size: torch.SymInt) -> object:
        coeff, rest = size.node.expr.as_coeff_Mul()
        if isinstance(rest, sympy.Symbol) and coeff.is_Integer and int(coeff) >= 1 and rest in dims:
            return dims[rest] if int(coeff) == 1 else int(coeff) * dims[rest]
        return torch.export.Dim.AUTO

    return tuple(
        {i: dim(d) for i, d in enumerate(shape) if isinstance(d, torch.SymInt)} or None if shape is not None else None
        for shape in shapes
    )


# NOTE [deterministic .pt2]
# torch.export.save writes a random `.data/serialization_id` record, and node
# provenance (`from_node`) carries Python object ids, so two identical
# partitions would ship different .pt2 bytes (and manifest hashes). We drop the
# provenance and rewrite the archive with fixed timestamps and an id derived
# from the other records; torch.export.load reads it as before. The sample-inputs
# record is a torch.save pickle, which torch.export.load unpickles (retrying with
# weights_only=False when that fails): it is written empty, read back as no
# example inputs, so a .pt2 from hetpart holds JSON and raw tensor bytes only.
def _rezip_deterministically(src: Path, dst: Path) -> None:
    with zipfile.ZipFile(src) as z:
        records = [(i.filename, b"" if "/data/sample_inputs/" in i.filename else z.read(i.filename))
                   for i in z.infolist()]
    digest = hashlib.sha256()
    for name, data in records:
        if not name.endswith(".data/serialization_id"):
            digest.update(name.encode() + b"\0" + data)
    ident = str(int(digest.hexdigest(), 16))[:40].encode()
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)),
                       ident if name.endswith(".data/serialization_id") else data)


# NOTE [parallel .pt2 writes]
# Exporting a stage again, for the stages whose program cannot be built from the graph (NOTE
# [stage programs]; before it, every stage), is slow: torch.export retraces the stage, seconds per
# stage of an HF model. The stages are independent, so `write_pt2_files` exports them in forked
# children, up to one per idle CPU (`idle_cpus`: on 2 CPUs at load 9, forking was slower than one
# process, benchmarks/pt2_write.py): a child starts with the parent's memory
# (the stage's GraphModule and example inputs, no copy and no pickle), writes its one file,
# sends its seconds (or its error's text) up a pipe and leaves with os._exit. One idle CPU, or no
# os.fork (Windows), writes them in this process, one after another. The files are the same
# bytes either way (NOTE [deterministic .pt2]). A parent that is interrupted kills its children
# and waits for them before the staging directory goes.
def write_pt2_files(jobs: list[tuple[Path, StageGraph]], inputs: tuple[torch.Tensor, ...],
                    times: StepTimes | None = None, workers: int | None = None) -> dict[Path, str]:
    """Each job's stage.pt2, the jobs being every stage in order and `inputs` the model's example inputs
    (2 rows); {path: sha256}. Each program is built from its stage's graph (NOTE [stage programs]); a stage
    whose graph that refuses is exported again from example inputs, in forked children where CPUs are idle
    (NOTE [parallel .pt2 writes]). `times` gets a `pt2/<rank>` step per file, `examples` where a stage is
    exported again, and `write/stage.pt2 (all ranks)`, the wall time of them all."""
    times = times or StepTimes()
    again: list[tuple[Path, StageGraph]] = []
    with times.step("write/stage.pt2 (all ranks)"):
        for path, stage in jobs:
            with times.step(f"pt2/{path.parent.name}"):
                try:
                    program = stage_program(stage)
                except Exception:  # noqa: BLE001 (NOTE [stage programs]: exported again below)
                    again.append((path, stage))
                    continue
                save_pt2(path, stage, program)
        if again:
            with times.step("examples"):
                examples = stage_examples([stage for _, stage in jobs], inputs)
            _reexport_files([(path, stage, examples[stage.index]) for path, stage in again], times, workers)
    return {path: sha256(path) for path, _ in jobs}


def _reexport_files(jobs: list[tuple[Path, StageGraph, tuple[torch.Tensor, ...]]], times: StepTimes,
                    workers: int | None) -> None:
    """write_pt2 of each job from its example inputs, forked onto idle CPUs (NOTE [parallel .pt2 writes])."""
    workers = max(1, min(idle_cpus() if workers is None else workers, len(jobs)))
    if workers == 1 or not hasattr(os, "fork"):
        for path, stage, example in jobs:
            with times.step(f"pt2/{path.parent.name}"):
                write_pt2(path, stage, example)
    else:
        for path, seconds in _write_forked(jobs, workers).items():
            times.add(f"pt2/{path.parent.name}", seconds)


def idle_cpus() -> int:
    """The CPUs this process may use that the others leave idle: its affinity less the load average
    (beyond this process's own 1). On a machine that is busy already, forking only adds to the queue."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        others = max(os.getloadavg()[0] - 1.0, 0.0)
    except OSError:  # no load average on this platform
        others = 0.0
    return max(1, round(cpus - others))


def _write_forked(jobs: list[tuple[Path, StageGraph, tuple[torch.Tensor, ...]]], workers: int) -> dict[Path, float]:
    """write_pt2 of each job in a forked child, `workers` at a time; {path: seconds}. Waits only for its own
    children (by pid: a caller's other subprocesses are left alone)."""
    running: dict[int, tuple[Path, int]] = {}  # read end of its pipe -> (path, pid) of each child
    seconds: dict[Path, float] = {}
    pending = list(jobs)
    try:
        while pending or running:
            while pending and len(running) < workers:
                path, stage, example = pending.pop(0)
                read_fd, write_fd = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child: one file, one message, and out without the parent's cleanup
                    code, message = 1, "error no message"
                    try:
                        os.close(read_fd)
                        start = time.perf_counter()
                        write_pt2(path, stage, example)
                        code, message = 0, f"ok {time.perf_counter() - start}"
                    except HetpartError as err:
                        message = f"hetpart {err}"
                    except BaseException as err:  # noqa: BLE001 (the parent raises it)
                        message = "error " + "".join(traceback.format_exception(err))[-4000:]
                    finally:
                        with contextlib.suppress(BaseException):
                            os.write(write_fd, message.encode())
                        os._exit(code)
                os.close(write_fd)
                running[read_fd] = (path, pid)
            ready, _, _ = select.select(list(running), [], [])
            read_fd = ready[0]
            path, pid = running.pop(read_fd)
            with os.fdopen(read_fd, "rb") as pipe:  # to EOF: the child wrote its message and exited
                message = pipe.read().decode(errors="replace")
            os.waitpid(pid, 0)
            kind, _, rest = message.partition(" ")
            if kind == "ok":
                seconds[path] = float(rest)
            elif kind == "hetpart":
                raise HetpartError(rest)
            else:
                raise RuntimeError(f"writing {path} failed in a child process:\n{rest or 'no message (killed?)'}")
    finally:
        for read_fd, (_, pid) in running.items():  # an error or an interrupt: no child outlives the call
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                os.close(read_fd)
    return seconds
