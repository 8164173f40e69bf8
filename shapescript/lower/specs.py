"""The runtime's descriptions of data and model types, written as Python literals for the module.

They are translations of the checker's types, with each declared dim's size put in, and the .ss
location of every declaration so the runtime's errors can name it.
"""

from __future__ import annotations

from pathlib import Path

from ..dtypes import ELEMENTS
from ..errors import Span
from ..ir import nodes as ir
from ..names import spec_var
from ..shapes import dims as D
from ..shapes import value_types as T
from .text import literal

TORCH_DTYPES = {name: f"torch.{e.torch}" for name, e in ELEMENTS.items()}  # as the module writes them


def axis_sizes(c: ir.Module, t: T.TensorT, fixed: bool) -> list[tuple[str, int | None]]:
    out = []
    for a in t.axes:
        v = D.value(a.size, c.dims)
        if fixed and v is None:
            raise ValueError(f"axis {a.show()} has no size")  # the checker refuses such params
        out.append((a.show(), v))
    return out


def where(span: Span) -> str:
    return str(span)


def data_spec(c: ir.Module, data: T.DataT) -> str:
    fields = []
    for name, t in data.fields.items():
        node = data.field_nodes[name]
        bound = D.value(t.index, c.dims) if t.index is not None else None
        label = D.show(t.index) if t.index is not None else None
        fields.append(f"_rt.FieldSpec({literal(name)}, {literal(tuple(axis_sizes(c, t, False)))}, "
                      f"{TORCH_DTYPES[t.dtype]}, {literal(bound)}, {literal(label)}, {literal(where(node.span))}, "
                      f"{literal(t.show())})")
    return f"_rt.DataSpec({literal(data.name)}, ({', '.join(fields)}{',' if len(fields) == 1 else ''}), " \
           f"{literal(where(data.node.span))})"


def model_spec(c: ir.Module, model: T.ModelT) -> str:
    members = []
    for m in model.members.values():
        if m.model is not None:
            count = D.value(m.count, c.dims) if m.count is not None else None
            members.append(f"_rt.SubSpec({literal(m.name)}, {spec_var(m.model.name)}, {literal(where(m.node.span))}, "
                           f"{literal(count)})")
            continue
        assert m.tensor is not None
        shape = tuple(v for _, v in axis_sizes(c, m.tensor, True))
        args = tuple(sorted(m.init_args.items()))
        members.append(f"_rt.ParamSpec({literal(m.name)}, {literal(m.kind)}, {literal(shape)}, "
                       f"{TORCH_DTYPES[m.tensor.dtype]}, {literal(m.init)}, {literal(args)}, "
                       f"{literal(where(m.node.span))})")
    family = f", family={literal(model.family)}" if model.of is not None else ""
    return f"_rt.ModelSpec({literal(model.name)}, ({', '.join(members)}{',' if len(members) == 1 else ''}), " \
           f"{literal(where(model.node.span))}{family})"


def model_order(c: ir.Module) -> list[T.ModelT]:
    """Models with every sub-model before the models that contain it."""
    out: list[T.ModelT] = []

    def visit(m: T.ModelT) -> None:
        if m in out:
            return
        for mem in m.members.values():
            if mem.model is not None:
                visit(mem.model)
        out.append(m)

    for m in c.models:
        visit(m)
    return out


# The runtime modules a standalone build inlines, in dependency order. Each imports only torch,
# safetensors, the standard library and the modules before it.
STANDALONE_MODULES = ("errors.py", "names.py", "dtypes.py", "inits.py", "optimizers.py", "runtime/steps.py",
                      "runtime/sigint.py", "runtime/schedules.py",
                      "runtime/model.py", "runtime/collectives.py", "runtime/sharding.py", "runtime/heads.py",
                      "runtime/fused_step.py", "runtime/grads.py", "runtime/loss_scale.py", "runtime/optim.py", "runtime/autodiff.py", "runtime/products.py",
                      "runtime/data.py", "runtime/loops.py", "runtime/sinks.py", "runtime/checkpoint.py", "runtime/calls.py",
                      "runtime/patterns.py", "runtime/modes.py", "runtime/ops.py", "runtime/guards.py")


def standalone_prelude() -> str:
    """The runtime's source, inlined so that a standalone module imports no shapescript."""
    root = Path(__file__).resolve().parent.parent
    parts = []
    for rel in STANDALONE_MODULES:
        text = (root / rel).read_text()
        text = text.replace("from __future__ import annotations\n", "")
        text = _strip_package_imports(text)
        parts.append(f"# ---- inlined from shapescript/{rel} ----\n{text}")
    return "from __future__ import annotations\n" + "\n".join(parts)


def _strip_package_imports(text: str) -> str:
    out, skipping = [], False
    for line in text.splitlines():
        if skipping:
            skipping = not line.rstrip().endswith(")")
            continue
        if line.startswith(("from .", "from shapescript")) and " import " in line:
            skipping = "(" in line and ")" not in line  # a parenthesized import goes on to its ")"
            continue
        out.append(line)
    return "\n".join(out)
