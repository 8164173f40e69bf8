"""Export a program's function for serving: `ss.export(prog.forward, m, path="mlp.onnx")`.

The function's model arguments are baked in (their params become the exported program's weights)
and so is every argument that isn't a tensor (a mode, `ss.Eval`; an int); its tensor arguments are
the exported program's inputs, in order, named as the .ss parameters. Each axis whose size the types
leave generic (the batch's `b`) is a dynamic dim of that name, and every declared dim is fixed: one
export serves every batch size. Example inputs are drawn from the types (floats from a normal,
`Index[C]` values below C, each generic dim a size of its own) unless given.

`torch.export` makes the ExportedProgram (`format="torch"`, saved with `torch.export.save` as a
.pt2 file) and torch's ONNX exporter (`dynamo=True`, on onnxscript) the ONNX model (`format="onnx"`).
On several devices, export from the program loaded on one device: the values are the same.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .api import Function
from .errors import ShapeError
from .runtime.guards import AxisCheck, KindGuard, TensorGuard
from .runtime.model import Model
from .runtime.modes import Mode

_SIZES = (3, 5, 7, 11, 13, 17, 19, 23)  # each generic dim's example size: a size of its own, never 0 or 1


class _Baked(torch.nn.Module):
    """The function with its non-tensor arguments fixed, as torch.export takes it: a module whose
    forward takes the tensors."""

    def __init__(self, fn: Any, args: Sequence[Any], tensor_places: Sequence[int]) -> None:
        super().__init__()
        self.fn, self.args, self.places = fn, list(args), tuple(tensor_places)

    def forward(self, *tensors: torch.Tensor) -> Any:
        args = list(self.args)
        for place, t in zip(self.places, tensors):
            args[place] = t
        with torch.no_grad():
            return self.fn(*args)


def _guards(fn: Function) -> tuple[Any, ...]:
    return tuple(fn.program.namespace["GUARDS"][fn.name])


def _example(guard: TensorGuard, sizes: dict[str, int], dims: dict[str, Any], device: torch.device
             ) -> tuple[torch.Tensor, dict[int, Any]]:
    """An input drawn from a parameter's type, and its dynamic dims by axis."""
    shape, dynamic = [], {}
    for k, a in enumerate(guard.axes):
        if a.size is not None:
            shape.append(a.size)
            continue
        name = _generic(a)
        if name not in sizes:
            sizes[name] = _SIZES[len(sizes) % len(_SIZES)]
            dims[name] = torch.export.Dim(name.replace("#", "_"), min=1)
        shape.append(sizes[name])
        dynamic[k] = dims[name]
    generator = torch.Generator().manual_seed(len(sizes))
    if guard.index_bound is not None:
        value = torch.randint(0, guard.index_bound, shape, generator=generator)
    elif guard.dtype.is_floating_point:
        value = torch.randn(shape, generator=generator, dtype=guard.dtype)
    elif guard.dtype == torch.bool:
        value = torch.rand(shape, generator=generator) > 0.5
    else:
        value = torch.randint(0, 10, shape, generator=generator, dtype=guard.dtype)
    return value.to(device), dynamic


def _generic(a: AxisCheck) -> str:
    if a.generic is None:
        raise ShapeError(f"export: an axis `{a.label}` is computed from other dims; export takes a function whose "
                         "tensors' axes are declared dims or bare generic dims, as `[b D]`")
    return a.generic


def traced(fn: Function, *args: Any) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], tuple[dict[int, Any], ...],
                                              list[str]]:
    """The module to export, its example inputs, their dynamic dims and their names. `args`: the
    function's arguments, a tensor's place given as None to draw it from its type."""
    if not isinstance(fn, Function):
        raise TypeError(f"export takes a function of a loaded program, as prog.forward, not {type(fn).__name__}")
    if fn.program.several:
        raise ShapeError(f"export: `{fn.name}` is loaded on several devices; load the program on one device "
                         "(ss.load(path, devices=\"cpu\")) to export it: the values are the same")
    guards = _guards(fn)
    if len(args) != len(guards):
        raise TypeError(f"export: `{fn.name}` takes {len(guards)} arguments ({', '.join(fn._names)}), given {len(args)}")
    values, places, inputs, dynamic, names = list(args), [], [], [], []
    sizes: dict[str, int] = {}
    dims: dict[str, Any] = {}
    for k, (guard, value) in enumerate(zip(guards, args)):
        if isinstance(guard, TensorGuard):
            if value is None:
                value, axes = _example(guard, sizes, dims, fn.program.device)
            else:
                value = guard(value, {})
                axes = {}
                for j, a in enumerate(guard.axes):
                    if a.size is None:
                        name = _generic(a)
                        dims.setdefault(name, torch.export.Dim(name.replace("#", "_"), min=1))
                        axes[j] = dims[name]
            values[k] = value
            places.append(k)
            inputs.append(value)
            dynamic.append(axes)
            names.append(fn._names[k])
        elif isinstance(guard, KindGuard) and guard.kind in ("model", "mode", "int", "float", "bool"):
            if guard.kind == "model" and not isinstance(value, Model):
                raise TypeError(f"export: `{fn._names[k]}` of `{fn.name}` is a model: give the model to bake in")
            if guard.kind == "mode" and not isinstance(value, Mode):
                raise TypeError(f"export: `{fn._names[k]}` of `{fn.name}` is a mode: give ss.Eval (or ss.Train(seed=...))")
            values[k] = guard(value, {})
        else:
            raise ShapeError(f"export: `{fn._names[k]}` of `{fn.name}` is a {guard.type_text if hasattr(guard, 'type_text') else 'value'} "
                             "that an exported model can't take: export a function of tensors, models and modes")
    return _Baked(fn._py, values, places), tuple(inputs), tuple(dynamic), names


def export(fn: Function, *args: Any, path: str | Path | None = None, format: str = "onnx") -> Any:
    """The function exported, `args` as a call takes them (None where a tensor is to be drawn from its
    type): an ExportedProgram (`format="torch"`) or an ONNX ModelProto (`format="onnx"`), saved to
    `path` if given."""
    if format not in ("onnx", "torch"):
        raise ValueError(f"export: format is \"onnx\" or \"torch\", not {format!r}")
    module, inputs, dynamic, names = traced(fn, *args)
    module.eval()  # nothing in it trains: the warning torch gives for a module in training mode is moot
    shapes = (tuple(d or None for d in dynamic),)  # forward(*tensors): one entry, a tuple of theirs
    if format == "torch":
        # AUTO: each generic axis dynamic within the range the function allows (nanoGPT's n <= T,
        # which its positions' `first` checks), as torch.export works it out
        auto = (tuple({k: torch.export.Dim.AUTO for k in d} or None for d in dynamic),)
        with warnings.catch_warnings():  # "a model attribute requires gradient": a param baked in, detached
            warnings.filterwarnings("ignore", module=r"torch\.")
            exported = torch.export.export(module, inputs, dynamic_shapes=auto, strict=False)
        if path is not None:
            torch.export.save(exported, str(path))
        return exported
    registry = logging.getLogger("torch.onnx")  # "torchvision is not installed. Skipping torchvision::..."
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # torch's own deprecations inside its exporter: nothing the user can change
            warnings.filterwarnings("ignore", module=r"torch\.")
            warnings.filterwarnings("ignore", category=FutureWarning)
            onnx_program = torch.onnx.export(module, inputs, dynamic_shapes=shapes, dynamo=True, input_names=names,
                                             output_names=["result"], verbose=False)
    finally:
        registry.setLevel(level)
    if onnx_program is None:
        raise RuntimeError("torch.onnx.export gave no ONNX program")
    model = _erf_in_f32(onnx_program.model_proto)
    if path is not None:
        import onnx  # torch's exporter needs it: there whenever the export got here
        onnx.save(model, str(path))
    return model


def _erf_in_f32(model: Any) -> Any:
    """The ONNX model with each f64 Gelu or Erf computed in f32 between two Casts: onnxruntime has no
    f64 Erf on the CPU (its Gelu is made of one), and f32's is within 1e-7 of it."""
    import onnx
    from onnx import TensorProto, helper

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             itertools.chain(inferred.graph.value_info, inferred.graph.input, inferred.graph.output)}
    nodes = []
    for node in model.graph.node:
        if node.op_type in ("Erf", "Gelu") and types.get(node.input[0]) == TensorProto.DOUBLE:
            narrow, wide = f"{node.input[0]}__f32", f"{node.output[0]}__f32"
            in_f32 = helper.make_node(node.op_type, [narrow], [wide], domain=node.domain)
            in_f32.attribute.extend(node.attribute)  # Gelu's `approximate`
            nodes += [helper.make_node("Cast", [node.input[0]], [narrow], to=TensorProto.FLOAT), in_f32,
                      helper.make_node("Cast", [wide], [node.output[0]], to=TensorProto.DOUBLE)]
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
