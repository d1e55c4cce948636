"""nn.Module + example inputs -> FX GraphModule, through torch.export with a dynamic batch (and sequence)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.fx as fx
from torch.export import Dim
from torch.utils import _pytree as pytree

from hetpart.errors import HetpartError
from hetpart.frontend.batch_mixing import batch_mixing
from hetpart.frontend.fast_fake import fast_fake_kernels
from hetpart.frontend.load import SequenceAxes, user_code


def export_model(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                 seq: SequenceAxes | None = None) -> fx.GraphModule:
    """Export non-strict with dim 0 of every input dynamic; returns the unlifted GraphModule.

    With `seq`, dim 1 of the inputs it marks is one dynamic sequence length too, where
    the model allows it (NOTE [dynamic sequence length]); `gm.meta["dynamic"]` records
    which dims are dynamic and why the sequence is not. Weights stay attributes (get_attr
    nodes); the runtime guard submodule export adds is dropped: the stages check their own inputs.
    """
    dynamic_seq = seq is not None and any(seq.inputs)
    record = {"batch": True, "seq_len": False, "why": seq.why if seq is not None else None}
    if dynamic_seq:
        assert seq is not None
        try:
            gm = _export(module, inputs, _dynamic_shapes(module, inputs, seq))
            record["seq_len"] = True
            if seq.max is not None:
                record["seq_len_max"] = seq.max
        except Exception as err:  # noqa: BLE001 - any refusal: trace again with a static sequence
            record["why"] = _why_static(err)
    if not record["seq_len"]:
        gm = _export(module, inputs, _dynamic_shapes(module, inputs, None))
    gm.meta["dynamic"] = record
    mixing = batch_mixing(gm)
    if mixing:  # where in the model: a second trace, with stack traces (NOTE [batch mixing])
        lines = _source_lines(module, inputs, _dynamic_shapes(module, inputs, seq if record["seq_len"] else None))
        mixing = [dataclasses.replace(m, where=lines.get(m.node)) for m in mixing]
    gm.meta["batch_mixing"] = mixing
    follow_input_devices(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


# NOTE [dynamic sequence length]
# Text models export with dim 1 of their token ids and masks dynamic too: one named Dim
# `seq` shared by every input that has the sequence (hetpart.frontend.load.sequence_axes
# finds them by asking the input factory for a longer sequence), bounded by the model's
# position table where its config has one (HF BERT slices a position-id buffer, which
# export accepts only for lengths up to its size). Where export refuses (a model that
# unrolls its time steps in Python, like zoo:lstm, specializes the length), the model is
# traced again with a static sequence length: the plan records why ("dynamic" in
# plan.json), the user sees no error. A refusal costs a second trace.
def _why_static(err: BaseException) -> str:
    """The line of a refused dynamic-sequence export that says why (`... specialized it to be a constant (16)`)."""
    err = err.__context__ or err  # _export's HetpartError keeps one line; torch's own error says why
    lines = [ln.strip(" -") for ln in str(err).strip().splitlines() if ln.strip()]
    telling = [ln for ln in lines if "seq" in ln and ("special" in ln or "guard" in ln or "range" in ln)]
    first = (telling or lines or [type(err).__name__])[0]
    return f"torch.export refused a dynamic sequence length: {type(err).__name__}: {first}"[:400]


def _dynamic_shapes(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], seq: SequenceAxes | None) -> tuple:
    seq_dim = Dim("seq", min=2, max=seq.max) if seq is not None and seq.max is not None else Dim("seq", min=2)
    dynamic = tuple(None if x.dim() == 0 else {0: Dim.DYNAMIC, 1: seq_dim} if seq is not None and seq.inputs[i]
                    else {0: Dim.DYNAMIC} for i, x in enumerate(inputs))
    params = list(inspect.signature(module.forward).parameters.values())
    star = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    if star is not None and star <= len(dynamic):  # `forward(self, x, *rest)`: export wants `rest`'s as one tuple
        dynamic = (*dynamic[:star], dynamic[star:])
    return dynamic


def _source_lines(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dynamic: tuple) -> dict[str, str]:
    """Node name -> `path/to/model.py:12 in forward (`code`)`, the model's own line that made it, from an export
    with stack traces (the innermost frame outside torch and hetpart)."""
    gm = _export(module, inputs, dynamic, stack_traces=True)
    torch_dir, own = str(Path(torch.__file__).parent), str(Path(__file__).parents[1])
    lines = {}
    for node in gm.graph.nodes:
        frames = [f for f in _FRAME.findall(node.meta.get("stack_trace") or "")
                  if not f[0].startswith((torch_dir, own, "<"))]
        if frames:
            path, line, fn, code = frames[-1]
            lines[node.name] = f"{path}:{line} in {fn} (`{code.strip()}`)"
    return lines


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n(.*)')


def _export(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dynamic: tuple,
            stack_traces: bool = False) -> fx.GraphModule:
    """torch.export non-strict, unlifted, without export's guard submodule; HetpartError where it fails."""
    try:
        with user_code("the model's forward, traced,"), _tracing(stack_traces):  # NOTE [user code exits]
            ep = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
    except HetpartError:
        raise
    except Exception as err:  # torch raises many types; the user needs the first lines
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = model_source_line(err)
        if "data-dependent" in str(err) or "DataDependent" in type(err).__name__:
            hint = "remove data-dependent Python control flow (if/for/while on tensor values; torch.cond)"
        else:
            shapes = ", ".join(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" for x in inputs)
            hint = (f"check that the example inputs ({shapes}) are what the model's forward expects, "
                    "and that the batch dimension (dim 0) is independent of the other dimensions")
        raise HetpartError(
            f"torch.export could not trace the model{f' at {where}' if where else ''}: {type(err).__name__}: {first}\n"
            f"  what to try: {hint}"
        ) from None
    if _mutates(ep):
        with _tracing():
            ep = ep.run_decompositions({})
    gm = ep.module()
    gm.meta["outputs"] = model_outputs(ep.call_spec.out_spec, next(n for n in gm.graph.nodes if n.op == "output"),
                                       f"{type(module).__name__}.forward")
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    if hasattr(gm, "_guards_fn"):
        delattr(gm, "_guards_fn")
    return gm


# NOTE [model outputs]
# A stage graph returns a flat tuple of tensors, and the last rank's are the model's outputs,
# flattened by torch.export's pytree (`out_spec`). A model may return a tensor, or a tuple,
# list or dict of tensors: the dict's values (in its order) or the list's items are the flat
# outputs, and plan.json's `outputs` records the type and the keys, so that `hetpart run`
# rebuilds the dict or list and `--verify` names each output by its key. Anything else (a
# None, an int, a shape, or a nested container) is refused at partition time: a nested one
# would run, but its keys would be paths the user never wrote; non-tensors cannot cross a
# pipeline. (hf: models are wrapped to return the flat tensors of their ModelOutput.)
def model_outputs(out_spec: pytree.TreeSpec, output: fx.Node, forward: str = "the model") -> dict:
    """plan.json's `outputs`: {"type": "tensor" | "tuple" | "list" | "dict", "names": [...]} (NOTE [model outputs])."""
    values = list(output.args[0])
    if not values:
        raise HetpartError(f"{forward} returns nothing; return a tensor or a tuple of tensors")
    kind = "tensor" if out_spec.is_leaf() else out_spec.type.__name__ if out_spec.type in (tuple, list, dict) else None
    if out_spec.type is dict:
        names = [str(k) for k in out_spec.context]
    else:
        names = [f"[{i}]" for i in range(len(values))] if kind != "tensor" else [""]
    nested = kind is None or any(not out_spec.child(i).is_leaf() for i in range(out_spec.num_children))
    if nested:
        raise HetpartError(f"{forward} returns a nested structure, {pytree.treespec_pprint(out_spec)} (* is a value): "
                           "hetpart runs models that return a tensor or a flat tuple, list or dict of tensors; "
                           "flatten the output in forward (e.g. `return (a, *rest)`)")
    for name, value in zip(names, values):
        val = value.meta.get("val") if isinstance(value, fx.Node) else value
        if not isinstance(val, torch.Tensor):
            where = f"output {name}" if name else "output"
            raise HetpartError(f"{forward}'s {where} is {type(val).__name__} ({val!r}), not a tensor: a pipeline's last "
                               "stage returns tensors only; return it as a tensor, or leave it out of the outputs")
    return {"type": kind, "names": names}


def _mutates(ep: torch.export.ExportedProgram) -> bool:
    """The exported graph writes in place into a tensor that only others read (NOTE [in-place writes])."""
    return any(node.op == "call_function" and not node.users
               and getattr(getattr(node.target, "_schema", None), "is_mutable", False) for node in ep.graph.nodes)


# NOTE [in-place writes]
# torch.export's default IR keeps in-place ops: HF RWKV fills `output[:, t] = ...` in a
# loop, which export records as `aten.copy_` into a `select` view of `output`, nodes with
# no users. A graph split by data dependencies does not order such a write before the
# reads of `output` in another stage, so the stages would compute something else. A
# graph with such a write (a mutating node without users: its effect is seen only through
# the tensor it wrote into) is functionalized (`run_decompositions({})`: the writes become
# `select_scatter`/`slice_scatter` values that the reads depend on; composite ops such as
# linear and SDPA stay whole). In-place ops whose result is used, like T5's
# `relative_buckets += ...`, order their readers through that result and stay; graphs
# without in-place writes, nearly every model, are kept as export made them.
@contextlib.contextmanager
def _tracing(stack_traces: bool = False) -> Iterator[None]:
    """How hetpart runs torch.export: no autograd, torch's stderr held back, no node stack traces (unless
    asked for), shape-only kernels (NOTE [fast fake kernels])."""
    traces = contextlib.nullcontext() if stack_traces else _no_stack_traces()
    with torch.no_grad(), _torch_quiet_unless_ok(), traces, fast_fake_kernels():
        yield


@contextlib.contextmanager
def _torch_quiet_unless_ok() -> Iterator[None]:
    """Hold back what torch writes to stderr while exporting (logged tracebacks, a failed export's
    partial graph): the HetpartError says what failed; after a successful export it is shown."""
    held = io.StringIO()
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        logging.disable(logging.NOTSET)
    sys.stderr.write(held.getvalue())


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Export without node stack traces: a tenth of a 7B model's tracing time, and nothing reads them."""
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def model_source_line(err: BaseException) -> str | None:
    """`path/to/model.py:192 in forward: code`, the innermost frame of the model's own code.

    Non-strict export runs the model's Python, so the traceback holds the model's frames
    between export's and torch's own; the innermost of them is the line that failed.
    """
    torch_dir = Path(torch.__file__).parent
    own = Path(__file__).parent
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not Path(f.filename).is_relative_to(torch_dir) and not Path(f.filename).is_relative_to(own)
              and not f.filename.startswith("<")]  # code torch generated (`<string>`, `<eval_with_key>`)
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}" + (f" (`{f.line.strip()}`)" if f.line else "")


def follow_input_devices(gm: fx.GraphModule) -> None:
    """Drop the tracing machine's device from the graph, so each op runs where its stage runs.

    NOTE [baked devices]: export records the device the model was traced on (`cpu`, or `meta`
    for a model traced without its weights) wherever the model named one:
    - `x.to(device=x.device, dtype=...)` (HF rotary embeddings, masks) becomes
      `aten.to.device(x, cpu, ...)`, and export adds `_assert_tensor_metadata(x, device=cpu)`
      checks: `to.device` becomes `to.dtype`, `to.dtype_layout` and the check lose `device=`,
      so the op follows its input.
    - factory ops (`arange(T, device=tokens.device)`, `zeros`, `full`) and `*_like`/`new_*` ops
      get `device=cpu`: the kwarg is dropped from every op, so factory ops create on the default
      device of the process that runs the stage (the runtime sets it to the rank's device) and
      the others follow their input.
    The analysis passes run factory ops on meta (`passes/meta.py`).
    """
    aten = torch.ops.aten
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.to.device:
            x, _device, *rest = node.args
            node.target, node.args = aten.to.dtype, (x, *rest)
        elif "device" in node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
