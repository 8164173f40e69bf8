"""The compiler's stages, in order: the one place that runs them.

    parse       syntax/parser.py    the text → the tree, a span on every node
    check       check/checker.py    the items (dims, data, models, signatures), then each body's
                                    types and calls → `Checked`; last, elaboration
                                    (check/elaborate.py): the program as typed IR, each node
                                    with its type and its resolved call (`Checked.module`)
    plan        plan/passes.py      passes over the IR: where each function runs
                                    (plan/placement.py); on several devices the batch split
                                    (plan/split.py) and the layout options' plan
                                    (plan/layout.py), left on the IR's nodes
    passes      ir/passes.py        rewrites of the IR, in order: fusion (ir/fuse.py: spans
                                    torch has one kernel for), then the calls whose results a
                                    controller's loop only logs (ir/defer.py)
    print       lower/codegen.py    the IR → a Python module for a target (one device, the
                                    controller, a worker, standalone); the IR alone, once the
                                    checker has seen that every dim has its size (E0313)

Each stage reads only what the one before it gives; the front ends (api.py, cli.py, lsp.py, the
notebook) call these functions rather than the stages. The DeviceTable (plan/comms.py) is worked
out from the planned IR when first asked for (`device_table(checked)`): a build for one device
never needs it.
"""

from __future__ import annotations

import codecs
import errno
import numbers
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from .check.checker import check_program, require_sizes
from .check.program import Checked
from .devices import DeviceSet
from .errors import CompileError, Diagnostic, SourceWarning, Span
from .ir import nodes as ir
from .ir.passes import run_passes
from .lower.codegen import generate
from .lower.targets import Target, target_for
from .plan.choose import check_budget, choose
from .plan.passes import plan_program
from .syntax import tree as A
from .syntax.parser import parse


def check_source(source: str, file: str = "<input>", devices: DeviceSet | None = None,
          dims: dict[str, int] | None = None, python: bool = True) -> Checked:
    """Parse and check a program, and plan it on its devices (CompileError with every diagnostic if
    it is wrong); `python=False` refuses the program's own Python (E0701)."""
    tree = parse(source, file)
    checked = plan_program(check_program(tree, file, devices, dims, python))
    chosen = checked.device_set
    if not (chosen.auto or chosen.memory is not None):
        return checked
    budget, budget_from = devices_budget(chosen)
    if chosen.auto and chosen.count > 1:  # each layout checked and planned as if the program wrote it
        return choose(checked, lambda layout: plan_program(check_program(tree, file, layout, dims, python)),
                      budget, budget_from)
    if budget is not None:
        check_budget(checked, budget, budget_from)
    return checked


def devices_budget(devices: DeviceSet) -> tuple[int | None, str]:
    """The bytes each device may hold under `layout auto` or against `memory`, and where that comes
    from: `memory`'s amount; without it, this machine's memory shared by its workers (cpu), or the
    smallest listed GPU's here (cuda); None where the devices aren't this machine's or can't be seen."""
    if devices.memory is not None:
        return devices.memory, "its `memory` option"
    if devices.several_hosts:
        return None, "the cluster's memory isn't known here: write `memory` to give a budget"
    if devices.kind == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total // devices.per_host, f"this machine's memory shared by {devices.per_host} devices"
    import torch  # a cuda program's check looks at its GPUs only here, where it has no `memory`
    indices = devices.indices or (0,)
    if not torch.cuda.is_available() or max(indices) >= torch.cuda.device_count():
        return None, "its GPUs aren't visible here: write `memory` to give a budget"
    return min(torch.cuda.get_device_properties(i).total_memory for i in indices), "the smallest of its GPUs"


def typed_ir(checked: Checked, fused: bool = True) -> ir.Module:
    """The checked program as typed IR; `fused`: with torch's kernels where they fit."""
    return run_passes(checked.module, optimize=fused)


def python_module(checked: Checked, target: Target | None = None, *, standalone: bool = False,
                  check_types: bool = False, fused: bool = True) -> str:
    """The Python module of a checked program for `target` (by default one device's module;
    `standalone=True`: the standalone target). `check_types`: the debug build, which checks every
    value the program names against its type as it runs (so nothing is fused away)."""
    module = typed_ir(checked, fused and not check_types)
    target = target_for(module, target, standalone)  # a target that can't run is refused first
    require_sizes(checked)
    return generate(module, target, check_types=check_types)


def python_modules(checked: Checked, targets: tuple[Target, ...], *, check_types: bool = False,
                   fused: bool = True) -> list[str]:
    """A module for each of `targets` (a program on several devices: its controller's and its
    workers'), printed from one typed IR."""
    module = typed_ir(checked, fused and not check_types)
    chosen = [target_for(module, target, False) for target in targets]
    require_sizes(checked)
    return [generate(module, target, check_types=check_types) for target in chosen]


def parse_devices(text: str | DeviceSet) -> DeviceSet:
    """`"cpu"`, `"cuda[0 1 2]"`, as a program's `devices` line spells them, read by the program's
    own grammar and checks (one spelling, one set of rules). TypeError or ValueError otherwise."""
    if isinstance(text, DeviceSet):
        return text
    if not isinstance(text, str):
        raise TypeError(f"devices is a str, as 'cpu', 'cpu[0 1]' or 'cuda[0 1 2]', not {type(text).__name__}")
    wrong = f"devices must be written as in a program, e.g. 'cpu', 'cpu[0 1]' or 'cuda[0 1 2]', not {text!r}"
    if "\n" in text or "\r" in text or not text.strip():
        raise ValueError(wrong)
    try:
        return check_source(f"devices {text.strip()}\n", "<devices>").device_set
    except CompileError as e:
        raise ValueError(f"{wrong}: {e.diagnostics[0].message}") from None


def read_program(path_or_source: str | os.PathLike[str], name: str | None = None) -> tuple[str, str]:
    """(source, file name): a path to a .ss file (a str ending in .ss, or a pathlib.Path), or the
    program's text itself."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name is the program's name in messages, a str, not {type(name).__name__}")
    if isinstance(path_or_source, os.PathLike) or (
            isinstance(path_or_source, str) and "\n" not in path_or_source
            and path_or_source.endswith(".ss")):
        path = Path(path_or_source)
        file = name or str(path)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "a folder, not a .ss file", str(path))
        return _text_of(path.read_bytes(), file), file  # a missing file: FileNotFoundError, naming it
    if not isinstance(path_or_source, str):
        hint = "; decode it first, as data.decode()" if isinstance(path_or_source, (bytes, bytearray)) else ""
        raise TypeError(f"load takes a path (a str ending in .ss, or a pathlib.Path) or a program's text "
                        f"(a str), not {type(path_or_source).__name__}{hint}")
    file = name or "<string>"
    return _text_of(path_or_source, file), file


def _text_of(data: bytes | str, file: str) -> str:
    """A program's text: UTF-8, with a byte-order mark at the start skipped (as Python reads source);
    bytes that aren't UTF-8, and NUL, as in a binary file, are an E0101 naming the file and place."""
    if isinstance(data, bytes):
        body = data.removeprefix(codecs.BOM_UTF8)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            before = body[:e.start].decode("utf-8", "replace")
            raise _not_text(f"byte 0x{body[e.start]:02x} is not UTF-8 text", before, file) from None
    else:
        text = data
    text = text.removeprefix("\ufeff")
    nul = text.find("\0")
    if nul >= 0:
        raise _not_text("a NUL byte (0x00), which is no part of a program's text", text[:nul], file)
    return text


def _not_text(message: str, before: str, file: str) -> CompileError:
    line = before.count("\n") + 1
    col = len(before) - (before.rfind("\n") + 1) + 1
    return CompileError([Diagnostic("E0101", message, Span(file, line, col, line, col + 1), "",
                                    ("a program is UTF-8 text; is this a binary file?",))])


def _dim_sizes(dims: Mapping[str, int] | None) -> dict[str, int] | None:
    """`dims=` checked: names, and positive whole sizes (a float, bool, str or tensor is refused, never
    rounded or read)."""
    if dims is None:
        return None
    if not isinstance(dims, Mapping):
        raise TypeError(f"dims is a dict of dim names and sizes, as {{\"V\": 65}}, not {type(dims).__name__}")
    sizes: dict[str, int] = {}
    for key, size in dims.items():
        if not isinstance(key, str):
            raise TypeError(f"dims: a dim's name is a str, not {type(key).__name__} {short_repr(key)}")
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"dims: the size of `{key}` must be a whole number (an int), not "
                            f"{type(size).__name__} {short_repr(size)}")
        if size <= 0:
            raise ValueError(f"dims: the size of `{key}` must be positive, not {size}")
        sizes[key] = int(size)
    return sizes


def short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _warn_replaced_dims(checked: Checked, dims: dict[str, int]) -> None:
    """Sizes given when loading replace those the program declares (examples/attention shrinks its
    model so); say so, since the program's text no longer tells its sizes."""
    replaced = [f"{item.name} = {dims[item.name]} (declared {item.value} at line {item.span.line})"
                for item in checked.program.items
                if isinstance(item, A.Dim) and item.value is not None and dims.get(item.name, item.value) != item.value]
    if replaced:
        warnings.warn(f"{checked.file}: sizes given when loading replace the program's: {', '.join(replaced)}",
                      stacklevel=4)


def compile_program(source: str, file: str, devices: DeviceSet | str | None = None,
                    dims: Mapping[str, int] | None = None, python: bool = True) -> Checked:
    if not isinstance(python, bool):  # "no" would be true: a refusal must be asked for plainly
        raise TypeError(f"python= is True or False, not {type(python).__name__}")
    sizes = _dim_sizes(dims)
    checked = check_source(source, file, parse_devices(devices) if devices is not None else None, sizes, python)
    for warning in checked.warnings:  # W0106: shown where Python shows warnings, the program still runs
        warnings.warn(warning.render(source), SourceWarning, stacklevel=3)
    if sizes:
        _warn_replaced_dims(checked, sizes)
    return checked


def build(path_or_source: str | os.PathLike[str], standalone: bool = False, devices: str | None = None,
          dims: dict[str, int] | None = None, target: Target | None = None) -> str:
    """The Python source a program lowers to: for `target` (lower/targets.py), by default one
    device's module (on several devices, what each worker runs)."""
    source, file = read_program(path_or_source)
    return python_module(compile_program(source, file, devices, dims), target, standalone=standalone)
