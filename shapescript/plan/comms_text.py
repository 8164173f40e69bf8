"""The DeviceTable in words and as data: the sentences a hover shows, `shapescript comms`'s report
(the same sentences, for the whole file) and its JSON. Nothing here works anything out: it all
comes from plan/comms.py's table."""

from __future__ import annotations

from typing import Any

import sympy

from ..check.program import Checked
from ..shapes import dims as D
from ..shapes.plans import Where
from .choice_text import choice_json, choice_lines, option_lines
from .comms import DeviceTable, device_table
from .records import FnPlan, Layout, LineItem, Sent, ValueKind
from .sizes_text import bytes_text, number_text

# How `shapescript comms` is told a batch size where no `batches(n)` gives one; the notebook's
# table names its own way (notebook/device_table.py).
CLI_BATCH_HINT = "use --batch N to see the shares"


def shares_text(table: DeviceTable, batch: int | None = None) -> str:
    parts = table.shares_text(batch)
    n = batch if batch is not None else table.batch
    if parts is None:
        return "each holding its share of the batch"
    where = f", from batches({n}) at line {table.batch_span.line}" if batch is None and table.batch_span else ""
    return f"each holding its share of the batch ({parts} for a batch of {n}{where})"


def devices_words(table: DeviceTable) -> str:
    """"the 4 devices"; on several hosts, "the 8 devices on 2 hosts"."""
    return f"the {table.count} devices" + (f" on {table.hosts} hosts" if table.crosses_hosts else "")


def hosts_note(table: DeviceTable) -> str:
    """What a multi-host devices line means for the collectives; "" on one host."""
    if not table.crosses_hosts:
        return ""
    return (f"{table.count} devices: {table.hosts} hosts × {table.per_host} devices each. Every collective runs "
            f"over all {table.count} and crosses hosts")


CROSSES_HOSTS = " — crosses hosts"  # after each collective of a multi-host table


# -- hovers ------------------------------------------------------------------------------------------

def share_word(count: int) -> str:
    """One device's share of N: "half", "a third", "a quarter", "1/5"."""
    return {2: "half", 3: "a third", 4: "a quarter"}.get(count, f"1/{count}")


def value_text(table: DeviceTable, v: Layout, batch: int | None = None) -> str:
    head = f"`{v.name}`: {v.type}"
    if table.count == 1:
        return f"{head}, on {table.devices}" + (f": {bytes_text(v.bytes)}" if v.bytes is not None else "")
    if v.kind == ValueKind.MODEL and v.sharded:
        assert v.bytes is not None and v.buffers is not None
        buffers = f", and its buffers whole: {bytes_text(v.buffers)}" if v.buffers != 0 else ""
        model = v.type.rpartition(" ")[2]  # a stack's `[L] Block`: Block
        if not table.shard_params:
            return (f"{head}, its params with {table.heads} split along it ({split_names(v)}), the others whole on "
                    f"every device: {bytes_text(v.bytes)} of params on each device{buffers}")
        return (f"{head}, sharded: each device holds {share_word(table.count)} of every param of {model}"
                f"{with_heads(table, v)}, {bytes_text(v.bytes)} of its params{buffers}")
    if v.kind == ValueKind.MODEL:
        assert v.bytes is not None  # a model's size is always known
        return f"{head}, a copy on every device: {bytes_text(v.bytes)} of params and buffers each"
    if v.kind == ValueKind.OPTIMIZER and v.sharded and not table.shard_params:  # `split H` alone
        state = (f": {bytes_text(v.bytes)} of state each ({v.state} per param value the device holds)"
                 if v.bytes is not None else "")
        return (f"{head}, on every device, beside its model's params: the state of the params with {table.heads} "
                f"({split_names(v)}) split along {table.heads} as they are, the others' state whole{state}")
    if v.kind == ValueKind.OPTIMIZER and v.sharded:
        state = f": {bytes_text(v.bytes)} of state each ({v.state} per value of its pieces)" if v.bytes is not None else ""
        return f"{head}, on every device, beside its pieces of the model's params{with_heads(table, v)}{state}"
    if v.kind == ValueKind.WHOLE and v.sharded and not table.shard_params:  # gradients, `split H` alone
        assert v.bytes is not None
        return (f"{head}, split along {table.heads}: the gradients of the params with {table.heads} "
                f"({split_names(v)}), each device holding its part of them; the others whole on every device: "
                f"{bytes_text(v.bytes)} on each device")
    if v.kind == ValueKind.WHOLE and v.sharded:  # gradients
        assert v.bytes is not None
        return (f"{head}, sharded: each device holds its piece of every gradient{with_heads(table, v)}, "
                f"{bytes_text(v.bytes)}")
    if v.kind == ValueKind.OPTIMIZER:
        state = f": {bytes_text(v.bytes)} of state each ({v.state} per param value)" if v.bytes is not None else ""
        return f"{head}, on every device, beside each copy of the model{state}"
    if v.kind == ValueKind.CONTROLLER:
        fn = table.fns.get(v.fn or "")
        why = f" (`{fn.name}` runs there: it {fn.reason})" if fn is not None and fn.reason else ""
        return f"{head}, in the controller{why}"
    if v.kind == ValueKind.HEADS:
        assert v.per_example is not None
        return (f"{head}, split along {heads_text(table, v)}: "
                f"{bytes_text(v.per_example)} of it on each device")
    if v.kind == ValueKind.SPLIT:
        size = f"; {bytes_text(v.per_example)} per example" if v.per_example is not None else ""
        fn = table.fns.get(v.fn or "")
        if fn is not None and fn.placement == Where.CONTROLLER:
            return (f"{head}, a batch the workers load in parts: it is split across {devices_words(table)} "
                    f"along {v.axis}, {shares_text(table, batch)}{size}")
        return (f"{head}, split across {devices_words(table)} along {v.axis}, "
                f"{shares_text(table, batch)}{size}")
    return f"{head}, whole on every device" + (f": {bytes_text(v.bytes)}" if v.bytes is not None else "")


def split_names(v: Layout) -> str:
    """The params split along H of a model, its gradients or its optimizer: "`w_o`, `blocks.attn.w_o`"."""
    return ", ".join(f"`{p}`" for p in v.split_params)


def with_heads(table: DeviceTable, v: Layout) -> str:
    """With both options, which params are split along H rather than cut into pieces:
    " (`w_o` split along H, the others in pieces)"; "" where none are."""
    return f" ({split_names(v)} split along {table.heads}, the others in pieces)" if v.split_params else ""


def heads_text(table: DeviceTable, v: Layout) -> str:
    """"H: each device holds 4 of H = 12"; for a group, "(H Dh), a block of whole heads: ..."."""
    heads, size = table.heads or "H", table.heads_size
    share = (f"each device holds {size // table.count} of {heads} = {size}" if size is not None else
             f"each device holds {heads} / {table.count} of {heads}")
    return f"{heads}: {share}" if v.axis == heads else f"{v.axis}, a block of whole heads: {share}"


def fn_text(table: DeviceTable, f: FnPlan) -> str:
    where = {Where.CONTROLLER: "in the controller", Where.WORKERS: "on the workers"}.get(f.placement, "anywhere")
    text = f"`fn {f.name}` runs {where}" + (f": it {f.reason}" if f.reason else "")
    if table.count == 1 or f.placement == Where.CONTROLLER:
        return text + "."
    if not f.sent and not f.sent_differentiated:
        return text + f". It sends nothing between {devices_words(table)}."
    text += f". Each call sends {f.bytes_text} between {devices_words(table)}, its calls included"
    if f.differentiated and f.sent_differentiated != f.sent:
        text += f"; under value_and_grad, {bytes_text(sum_bytes(f.sent_differentiated))}, with the backward pass"
    return text + "."


def sum_bytes(sent: tuple[Sent, ...]) -> sympy.Expr:
    return sympy.Add(*(s.bytes for s in sent))


def item_lines(table: DeviceTable, item: LineItem) -> list[str]:
    """One line of text per collective (or call that sends): each marked as crossing hosts where it does."""
    lines = _item_lines(table, item)
    if item.repeats != 1:  # inside a loop: the line runs once a pass
        times = item.repeats
        lines.append(f"- {number_text(times)} times in each call of `{item.fn}`, once a pass of its loop"
                     if times.is_Integer else f"- once a pass of its loop, in each call of `{item.fn}`")
    return [text + CROSSES_HOSTS for text in lines] if table.crosses_hosts else lines


def _item_lines(table: DeviceTable, item: LineItem) -> list[str]:
    if item.collective is not None:
        c = item.collective
        text = f"- {c.op} of {c.what}: {number_text(c.count)} × {c.dtype} = {c.bytes_text}"
        fn = table.fns.get(c.fn)
        if fn is not None and fn.differentiated and item.backward is not None:
            b = item.backward
            again = " gathers it again (it is freed after use) and" if item.again else ""
            text += (f"; when value_and_grad differentiates `{c.fn}`, the backward pass{again} sends a {b.op} of "
                     f"{b.what}: {number_text(b.count)} × {b.dtype} = {bytes_text(b.bytes)}")
        elif fn is not None and fn.differentiated and c.dtype in ("f16", "bf16", "f32", "f64"):
            text += f"; as much again in the backward pass when value_and_grad differentiates `{c.fn}`"
        return [text]
    out = []
    own = [s for s in item.sent if not s.via]
    for s in own:  # value_and_grad's gradients
        c = s.collective
        out.append(f"- {c.op} of {c.what}: {number_text(c.count)} × {c.dtype} = {c.bytes_text}")
    inner = tuple(s for s in item.sent if s.via)
    if inner:
        both = " (forward and backward)" if item.differentiated else ""
        caller = table.fns.get(item.fn)
        if own or (caller is not None and caller.placement != Where.CONTROLLER):
            out.append(f"- inside `{item.callee}`{both}: {bytes_text(sum_bytes(inner))} per call")
        else:
            out.append(f"- `{item.callee}` on the workers: {bytes_text(sum_bytes(inner))} per call")
    return out


def line_text(table: DeviceTable, line: int) -> str | None:
    items = table.line(line)
    if not items:
        return None
    out = [f"Sent between {devices_words(table)} by this line, each time it runs:", ""]
    for item in items:
        out.extend(item_lines(table, item))
    total = sympy.Add(*(i.bytes for i in items))
    out += ["", f"In all: {bytes_text(total)}."]
    return "\n".join(out)


def hover_text(checked: Checked, line: int, column: int) -> str | None:
    """Markdown for a hover at 1-based (line, column): the function or value under the cursor, and
    what the line sends; None where there is nothing to say."""
    table = device_table(checked)
    if table.choice is not None and line in option_lines(checked):  # `layout auto` and `memory`
        return "\n".join(choice_lines(table.choice))
    parts = []
    f = table.fn_at(line, column)
    if f is not None:
        parts.append(fn_text(table, f))
    else:
        v = table.value_at(line, column)
        if v is not None:
            parts.append(value_text(table, v))
        else:
            model = next((m for m in table.models.values() if m.span.line == line), None)
            if model is not None:
                parts.append(value_text(table, model))
    sent = line_text(table, line)
    if sent:
        parts.append(sent)
    return "\n\n".join(parts) or None


# -- the whole file ----------------------------------------------------------------------------------

def report(checked: Checked, batch: int | None = None, batch_hint: str = CLI_BATCH_HINT) -> str:
    """`shapescript comms`: every function, model, value and line that sends, in words. `batch_hint`
    says how to give a batch size when neither `batch` nor the program's batches(n) does."""
    return table_report(device_table(checked), checked.file, checked.source, batch, batch_hint)


def table_report(table: DeviceTable, file: str, program_text: str, batch: int | None = None,
                 batch_hint: str = CLI_BATCH_HINT) -> str:
    """`report` of a table met without its program: `file` is named, `program_text` quoted."""
    out = [f"{file} on {table.devices}"]
    if table.count > 1 and table.heads:
        out[0] += f": split along {table.heads}, every device holding whole batches"
    elif table.count > 1:
        parts = table.shares_text(batch)
        n = batch if batch is not None else table.batch
        out[0] += (f": a batch of {n} splits {parts}" if parts else
                   f": no batches(n) gives a batch size ({batch_hint})")
    if table.crosses_hosts:
        out.append(hosts_note(table) + ".")
    if table.choice is not None:
        out += ["", *choice_lines(table.choice)]
    out += ["", "Functions"]
    out += [f"  {f.span.line:>4}  {fn_text(table, f)}" for f in table.fns.values()]
    if table.models:
        out += ["", "Models"]
        out += [f"  {m.span.line:>4}  {value_text(table, m)}" for m in table.models.values()]
    out += ["", "Values"]
    out += [f"  {v.span.line:>4}  in `{v.fn}`: {value_text(table, v, batch)}" for v in first_values(table)]
    if table.count > 1:
        out += ["", "Lines that send"]
        if not table.lines:
            out.append("  none: nothing is sent between the devices")
        for line in sorted(table.lines):
            text = line_text(table, line) or ""
            lines = program_text.splitlines()
            source = lines[line - 1].strip() if line <= len(lines) else ""
            out.append(f"  {line:>4}  {source}")
            out += [f"        {t}" if t else "" for t in text.splitlines()[2:]]
    return "\n".join(out).replace("\n\n\n", "\n\n")


def first_values(table: DeviceTable) -> list[Layout]:
    """Each function's values once, where they are first named (a parameter, or a first assignment)."""
    seen: set[tuple[str | None, str]] = set()
    out = []
    for v in table.values:
        if (v.fn, v.name) not in seen:
            seen.add((v.fn, v.name))
            out.append(v)
    return out


def layout_text(table: DeviceTable, v: Layout, batch: int | None = None) -> str:
    """A value's layout in a few words: "split along b: 32/32 of 64", "whole", "in the controller"."""
    if table.count == 1:
        return f"on {table.devices}"
    if v.kind == ValueKind.SPLIT:
        parts = table.shares_text(batch)
        n = batch if batch is not None else table.batch
        return f"split along {v.axis}" + (f": {parts} of {n}" if parts else "")
    if v.kind == ValueKind.HEADS:
        return f"split along {heads_text(table, v)}"
    if v.sharded and not table.shard_params:  # `split H` alone: only what belongs to params with H is split
        heads = table.heads
        return {ValueKind.MODEL: f"params with {heads} split along it",
                ValueKind.OPTIMIZER: f"beside its model: the state of params with {heads} split along it, "
                "the others' whole"}.get(v.kind, f"gradients of params with {heads} split along it, the others whole")
    if v.sharded:
        return {ValueKind.MODEL: f"sharded: {share_word(table.count)} of every param on each device",
                ValueKind.OPTIMIZER: "beside each device's pieces of its model"}.get(v.kind, "a piece of each on every device")
    return {ValueKind.MODEL: "a copy on every device", ValueKind.OPTIMIZER: "beside each copy of its model",
            ValueKind.CONTROLLER: "in the controller"}.get(v.kind, "whole on every device")


def size_json(expr: sympy.Expr | None) -> dict[str, Any] | None:
    if expr is None:
        return None
    expr = sympy.expand(expr)
    return {"bytes": int(expr) if expr.is_Integer else None, "expr": D.show(expr), "text": bytes_text(expr)}


def sent_json(s: Sent) -> dict[str, Any]:
    c = s.collective
    return {"op": c.op, "what": c.what, "fn": c.fn, "line": c.span.line, "col": c.span.col,
            "count": int(c.count) if c.count.is_Integer else D.show(c.count), "dtype": c.dtype,
            "times": s.times if isinstance(s.times, int) else D.show(s.times), "via": list(s.via), "size": size_json(s.bytes)}


def to_json(checked: Checked, batch: int | None = None) -> dict[str, Any]:
    table = device_table(checked)
    return {
        "file": checked.file, "devices": table.devices, "count": table.count,
        "hosts": table.hosts, "per_host": table.per_host, "crosses_hosts": table.crosses_hosts,
        "layout_choice": choice_json(table.choice) if table.choice is not None else None,
        "batch": batch if batch is not None else table.batch, "shares": table.shares(batch),
        "functions": [{"name": f.name, "line": f.span.line, "placement": f.placement, "reason": f.reason,
                       "per_call": size_json(f.bytes), "differentiated": f.differentiated,
                       "per_call_differentiated": size_json(sum_bytes(f.sent_differentiated)),
                       "sends": [sent_json(s) for s in f.sent]} for f in table.fns.values()],
        "models": [{"name": m.name, "line": m.span.line, "per_device": size_json(m.bytes)}
                   for m in table.models.values()],
        "values": [{"fn": v.fn, "name": v.name, "line": v.span.line, "col": v.span.col, "type": v.type,
                    "layout": v.kind, "axis": v.axis, "size": size_json(v.bytes),
                    "per_example": size_json(v.per_example)} for v in table.values],
        "lines": [{"line": line, "size": size_json(sympy.Add(*(i.bytes for i in items))),
                   "sends": [sent_json(s) for i in items for s in i.sent],
                   "text": line_text(table, line)} for line, items in sorted(table.lines.items())],
    }
