"""The grammar of a devices line: `devices cpu`, `devices cuda[0 1 2]`, `devices 2 x cuda[0 1]`,
with its options below it (`shard params`, `split H`).

A mixin of the parser: it uses the parser's token helpers (`tok`, `peek`, `at`, `advance`,
`expect`, `expect_name`, `expect_newline`, `block`, `fail`, `fail_at`, `span_from`).
"""

from __future__ import annotations

from typing import Any

from ..errors import Span
from . import tree as A
from .lexer import describe

# `memory 40 GiB`'s units, in bytes: the binary ones, as torch and nvidia-smi count, and the decimal
MEMORY_UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40,
                "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}


class DeviceLine:
    tok: Any
    peek: Any
    at: Any
    advance: Any
    expect: Any
    expect_name: Any
    expect_newline: Any
    block: Any
    fail: Any
    fail_at: Any
    span_from: Any
    source: str

    def item_devices(self) -> A.Devices:
        start = self.advance().span
        hosts = self.device_hosts()
        kind = self.expect_name("a device kind, `cpu` or `cuda`")
        if kind.text not in ("cpu", "cuda"):
            raise self.fail(f"unknown device kind `{kind.text}`", kind, "expected `cpu` or `cuda`")
        indices = None
        if self.at("[", "OP"):
            self.advance()
            indices = []
            while self.tok.kind == "INT":
                indices.append(int(self.advance().text))
            self.expect("]", "after the device numbers", help="list device numbers separated by spaces")
        if self.at_times():  # `cuda[0 1] x 2`
            count = self.peek().text if self.peek().kind == "INT" else "2"
            listed = f"[{' '.join(map(str, indices))}]" if indices is not None else ""
            raise self.fail("the number of hosts comes before the devices", self.tok, "the hosts go first",
                            help=f"write `devices {count} x {kind.text}{listed}`: hosts × the devices on each")
        end = self.span_from(start)
        options: list[A.DeviceOption] = []
        if self.at(":", "OP"):
            self.advance()
        if self.tok.kind == "NEWLINE" and self.peek().kind == "INDENT":
            options = self.block(self.device_option)
        else:
            self.expect_newline()
        return A.Devices(end, kind.text, indices, options, hosts)

    def at_times(self) -> bool:
        """`x` or `×`, between a devices line's hosts and its devices."""
        return bool(self.at("x", "NAME") or self.at("×", "OP"))

    def device_hosts(self) -> int:
        """`2 x` (or `2 ×`) before a devices line's devices: how many hosts, 1 if none is given.
        Anything but a positive whole number before `x` is refused here, at its own span."""
        first = self.tok
        if not self.at_hosts():
            return 1  # a device kind, or a mistake that the device kind's own error names
        if first.kind == "OP":  # the sign of `-2`
            self.advance()
        number = self.advance()
        span = first.span.to(number.span)
        shown = self.source_text(span)
        if number.kind != "INT" or first is not number or int(number.text) < 1:
            raise self.fail_at(span, f"the number of hosts must be a positive whole number, not `{shown}`",
                               "not a number of hosts", "write how many hosts run the devices listed, as "
                               "`devices 2 x cuda[0 1]`; for one host, leave the number out: `devices cuda[0 1]`")
        if not self.at_times():
            raise self.fail(f"expected `x` after the number of hosts, found {describe(self.tok)}",
                            label="expected `x`", help=f"write hosts × devices: `devices {number.text} x cuda[0 1]`")
        self.advance()
        return int(number.text)

    def at_hosts(self) -> bool:
        """Whether a devices line starts with its number of hosts, or with what was written in its
        place (`-2 x`, `2.5 x`, `two x`)."""
        t, after = self.tok, self.peek()
        if t.kind in ("INT", "FLOAT"):
            return True
        if t.kind == "OP" and t.text == "-":
            return after.kind in ("INT", "FLOAT")
        return t.kind == "NAME" and t.text not in ("cpu", "cuda") and after.text in ("x", "×") \
            and after.kind in ("NAME", "OP")

    def source_text(self, span: Span) -> str:
        """The program's text under a span on one line."""
        return self.source.split("\n")[span.line - 1][span.col - 1:span.end_col - 1]

    def device_option(self) -> A.DeviceOption:
        t = self.expect_name("a device option: `shard params`, `split NAME`, `layout auto` or `memory 40 GiB`")
        if t.text == "shard":
            self.expect("params", "after `shard`")
            opt = A.DeviceOption(self.span_from(t.span), "shard", None)
        elif t.text == "split":
            name = self.expect_name("the dim to split")
            opt = A.DeviceOption(self.span_from(t.span), "split", name.text)
        elif t.text == "layout":
            word = self.expect_name("`auto` after `layout`")
            if word.text != "auto":
                raise self.fail(f"unknown layout `{word.text}`", word, "expected `auto`",
                                help="write `layout auto` to let the compiler choose, or the layout itself: "
                                "`shard params`, `split H`")
            opt = A.DeviceOption(self.span_from(t.span), "layout", "auto")
        elif t.text == "memory":
            opt = self.memory_option(t)
        else:
            raise self.fail(f"unknown device option `{t.text}`", t,
                            "expected `shard params`, `split NAME`, `layout auto` or `memory 40 GiB`")
        self.expect_newline()
        return opt

    def memory_option(self, first: Any) -> A.DeviceOption:
        """`memory 40 GiB`: how much each device may hold, a whole or decimal number and a unit."""
        number = self.tok
        units = ", ".join(f"`{u}`" for u in MEMORY_UNITS)
        example = "write how much each device may hold, as `memory 40 GiB`"
        if number.kind not in ("INT", "FLOAT"):
            raise self.fail(f"expected an amount after `memory`, found {describe(number)}", number,
                            "not an amount", help=example)
        self.advance()
        unit = self.tok
        if unit.kind != "NAME" or unit.text not in MEMORY_UNITS:
            raise self.fail(f"expected a unit of memory after `memory {number.text}`, found {describe(unit)}", unit,
                            "not a unit", help=f"{example}; the units are {units}")
        self.advance()
        amount = float(number.text) * MEMORY_UNITS[unit.text]
        if not 1 <= amount < 2 ** 80:  # also inf and nan: a yottabyte is beyond any device
            raise self.fail_at(first.span.to(unit.span), f"`memory {number.text} {unit.text}` isn't an amount a "
                               "device can hold", "not a budget", help=example)
        return A.DeviceOption(self.span_from(first.span), "memory", f"{number.text} {unit.text}", int(amount))
