"""Grammar-directed programs, part 1: the generator's types, and expressions built from a pool of
typed ones by the typing rules (operators, reductions, softmax, `@`, cross_entropy, calls)."""

from __future__ import annotations

from typing import NamedTuple

from fuzzing.rand import Rand
from shapescript.ops import OPS

FLOATS = ("f16", "bf16", "f32", "f64")


class TT(NamedTuple):
    """A tensor type in the generator: axis names (declared dims or the fn's generics)."""
    axes: tuple[str, ...]
    dtype: str = "f32"
    index: str | None = None

    def text(self) -> str:
        s = "[" + " ".join(self.axes) + "]"
        if self.index is not None:
            return f"{s} Index[{self.index}]"
        return s if self.dtype == "f32" else f"{s} {self.dtype}"

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS and self.index is None


class Ex(NamedTuple):
    text: str
    ty: TT
    simple: bool  # a name, a field or a call: needs no parentheses as an operand


class Param(NamedTuple):
    name: str
    kind: str  # tensor | model | batch | mode
    ty: TT | None
    mut: bool = False


class Sig(NamedTuple):
    name: str
    params: list[Param]
    ret: TT | None


def atom(e: Ex) -> str:
    return e.text if e.simple else f"({e.text})"


def plain(axis: str) -> bool:
    """A dim by name (`D`, `n`), not a group `(2 D)` or a literal `2`: what `over=` can name."""
    return axis.isidentifier()


def generic(axis: str) -> bool:
    return plain(axis) and axis[0].islower()


def unique_axes(t: TT) -> list[str]:
    return [d for d in t.axes if plain(d) and t.axes.count(d) == 1]


def _subsequence(small: tuple[str, ...], big: tuple[str, ...]) -> bool:
    it = iter(big)
    return all(any(a == b for b in it) for a in small)



class Exprs:
    """Well-typed expressions over a pool: operators, comparisons, reductions, softmax, `@`,
    cross_entropy and calls of earlier functions. Each takes the pool and returns an `Ex`, or None
    where the pool has nothing that fits. ProgramGen sets the state they read."""

    # From the op table, in its order: a new op is fuzzed as soon as it is declared.
    UNARY = [name for name, op in OPS.items() if op.params == ("x",)]  # value by value, one tensor
    # The reductions to the operand's dtype, over an axis or everything (`over=` optional); those
    # whose results or operands are of other kinds are drawn apart (argmax, argmin) or not at all.
    REDUCE = [name for name, op in OPS.items() if op.params[:2] == ("x", "over") and op.required == 1
              and name not in ("argmax", "argmin", "any", "all", "norm")]

    r: Rand
    dims: list[str]
    model: dict[str, TT]
    sigs: list[Sig]
    mode: str | None

    def floats(self, pool: list[Ex]) -> list[Ex]:
        return [e for e in pool if e.ty.is_float]

    def unary(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e, f = self.r.choice(fs), self.r.choice(self.UNARY)
        if self.r.chance(0.2):
            return Ex(f"{atom(e)} |> {f}", e.ty, False)
        return Ex(f"{f}({e.text})", e.ty, True)

    def negate(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        return Ex(f"-{atom(e)}", e.ty, False)

    def literal_op(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        op, lit = self.r.choice(["+", "-", "*", "/", "**"]), self.r.choice(["2", "0.5", "1.0", "3"])
        return Ex(f"{atom(e)} {op} {lit}" if self.r.chance(0.7) else f"{lit} {op} {atom(e)}", e.ty, False)

    # Plain numbers for `number_op`: none is 0, so `/` never divides by zero; bases of `**` are positive.
    NUMBERS = ["2", "3", "1", "0.5", "1.5", "true", "-2", "-0.5", "-true"]
    BASES = ["2", "3", "1", "0.5", "true"]
    EXPONENTS = ["2", "-1", "0.5", "true", "-2", "0"]

    def number(self, depth: int = 0) -> str:
        """Arithmetic of plain numbers (ints, floats, bools): its type is Python's, int or float."""
        r = self.r
        if r.chance(0.3):
            return f"{r.choice(self.BASES)} ** {r.choice(self.EXPONENTS)}"
        if r.chance(0.3):
            return f"{r.choice(self.NUMBERS)} / {r.choice(self.NUMBERS)}"
        if depth < 2 and r.chance(0.6):
            left, right = self.number(depth + 1), self.number(depth + 1)
            return f"({left}) {r.choice(['+', '-', '*'])} ({right})"
        return r.choice(self.NUMBERS)

    def number_op(self, pool):
        """A float tensor and a number computed from plain numbers."""
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        op = self.r.choice(["+", "-", "*"])
        number = self.number()
        if number == "true":  # a float tensor and a bool: torch refuses `-` (E0308)
            number = "true + 1"
        return Ex(f"{atom(e)} {op} ({number})", e.ty, False)

    def convert_op(self, pool):
        """A float tensor through another dtype and back (`to`), with integer, bool or float
        arithmetic on the way: `to(to(x, i32) * 0.5, f32)`."""
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        e = r.choice(fs)
        dtype = r.choice(["i32", "i64", "bool", "f16", "bf16", "f32", "f64"])
        inner = f"to({e.text}, {dtype})"
        if dtype == "bool":
            inner = r.choice([f"not {inner}", f"{inner} and ({atom(e)} > 0.5)", inner])
        else:
            op = r.choice(["+", "-", "*", "/", "**"])
            numbers = ["2", "0", "true", "0.5", "(2 ** -1)"] if op == "**" else \
                ["2", "-1", "0.5", "(2 ** -1)", "(-true)"] + ([] if op == "-" else ["true"])
            number = r.choice(numbers)
            inner = f"{inner} {op} {number}" if r.chance(0.7) or op == "**" else f"{number} {op} {inner}"
        unique = unique_axes(e.ty)
        extra = r.randint(0, 4)  # then an operation of the library, on that dtype
        if extra == 0 and unique:
            inner = f"cumsum({inner}, over={r.choice(unique)})"
        elif extra == 1:
            inner = f"clamp({inner}, {r.choice(['min=0', 'max=1.5', 'min=-1, max=2'])})"
        elif extra == 2:
            inner = f"where({atom(e)} > 0.5, {inner}, {r.choice(['1', 'true'])})"
        elif extra == 3 and dtype != "bool":  # torch has no abs of bools
            inner = f"abs({inner})"
        return Ex(f"to({inner}, {e.ty.dtype})", e.ty, True)

    def operands(self, pool):
        """Two float values that broadcast together by name, in either order, and the larger's."""
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        partners = [e for e in fs if e.ty.dtype == a.ty.dtype and (e.ty.axes == a.ty.axes or (
            len(e.ty.axes) < len(a.ty.axes) and _subsequence(e.ty.axes, a.ty.axes)))]
        b = r.choice(partners)
        left, right = (a, b) if r.chance(0.5) else (b, a)
        return left, right, a

    def binary(self, pool):
        got = self.operands(pool)
        if got is None:
            return None
        left, right, a = got
        op = self.r.choice(["+", "-", "*", "/"])
        return Ex(f"{atom(left)} {op} {atom(right)}", a.ty, False)

    def compare(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        same = [e for e in fs if e.ty == a.ty]
        other = atom(r.choice(same)) if r.chance(0.5) else r.choice(["0.0", "1", "0.5"])
        cond = Ex(f"{atom(a)} {r.choice(['>', '<', '>=', '<=', '==', '!='])} {other}", TT(a.ty.axes, "bool"), False)
        if r.chance(0.3):
            cond = Ex(f"not ({cond.text})", cond.ty, False)
        if r.chance(0.3):
            cond = Ex(f"({cond.text}) {r.choice(['and', 'or'])} ({cond.text})", cond.ty, False)
        unique = unique_axes(a.ty)
        f = r.choice(["any", "all"])
        if unique and r.chance(0.6):
            d = r.choice(unique)
            return Ex(f"{f}({cond.text}, over={d})", TT(tuple(x for x in a.ty.axes if x != d), "bool"), True)
        return Ex(f"{f}({cond.text})", TT((), "bool"), True) if r.chance(0.7) else cond

    def reduce(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool)]
        if not fs:
            return None
        e = r.choice(fs)
        unique = unique_axes(e.ty)
        if unique and r.chance(0.8):
            d = r.choice(unique)
            rest = tuple(x for x in e.ty.axes if x != d)
            if r.chance(0.2):
                f = r.choice(["argmax", "argmin"])
                return Ex(f"{f}({e.text}, over={d})", TT(rest, "i64", d), True)
            f = r.choice(self.REDUCE)
            form = r.randint(0, 2)
            if form == 0:
                return Ex(f"{f}({e.text}, over={d})", TT(rest, e.ty.dtype), True)
            if form == 1:
                return Ex(f"{atom(e)} |> {f}(over={d})", TT(rest, e.ty.dtype), False)
            return Ex(f"{f}(x={e.text}, over={d})", TT(rest, e.ty.dtype), True)
        return Ex(f"{r.choice(self.REDUCE)}({e.text})", TT((), e.ty.dtype), True)

    def softmax(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool) if unique_axes(e.ty)]
        if not fs:
            return None
        e = r.choice(fs)
        d = r.choice(unique_axes(e.ty))
        f = r.choice(["softmax", "log_softmax"])
        return Ex(f"{f}({e.text}, over={d})", e.ty, True)

    def matmul(self, pool):
        r = self.r
        fs = [e for e in self.floats(pool) if e.ty.axes]
        pairs = [(a, b) for a in fs for b in fs if a.ty.axes[-1] == b.ty.axes[0] and a.ty.dtype == b.ty.dtype]
        if not pairs:
            return None
        a, b = r.choice(pairs)
        t = TT(a.ty.axes[:-1] + b.ty.axes[1:], a.ty.dtype)
        if r.chance(0.2):
            return Ex(f"matmul({a.text}, {b.text})", t, True)
        return Ex(f"{atom(a)} @ {atom(b)}", t, False)

    def cross_entropy(self, pool):
        r = self.r
        options = []
        for lab in pool:
            if lab.ty.index is None:
                continue
            for lg in self.floats(pool):
                d = lab.ty.index
                if d in unique_axes(lg.ty) and tuple(x for x in lg.ty.axes if x != d) == lab.ty.axes:
                    options.append((lg, lab, d))
        if not options:
            return None
        lg, lab, d = r.choice(options)
        return Ex(f"cross_entropy({lg.text}, {lab.text}, over={d})", TT((), lg.ty.dtype), True)

    def call(self, pool):
        r = self.r
        if not self.sigs:
            return None
        sig = r.choice(self.sigs)
        binding: dict[str, str] = {}
        args: list[str] = []
        keyword = False
        for p in sig.params:
            if p.kind == "model":
                if not self.model or not any(e.text.startswith("m.") for e in pool):
                    return None
                args.append("m=m" if keyword else "m")
                continue
            if p.kind == "mode":
                mode = self.mode or r.choice(["Eval()", "Train(seed=1)"])
                args.append(f"{p.name}={mode}" if keyword else mode)
                continue
            assert p.ty is not None
            fits = [e for e in pool if self.fits(p.ty, e.ty, binding)]
            if not fits:
                return None
            e = r.choice(fits)
            for pa, ea in zip(p.ty.axes, e.ty.axes):
                if generic(pa):
                    binding.setdefault(pa, ea)
            keyword = keyword or r.chance(0.15)  # keywords, once begun, to the end
            args.append(f"{p.name}={e.text}" if keyword else e.text)
        assert sig.ret is not None
        ret = TT(tuple(binding.get(a, a) for a in sig.ret.axes), sig.ret.dtype, sig.ret.index)
        if len(args) >= 1 and not args[0].startswith(sig.params[0].name + "=") and r.chance(0.15) \
                and sig.params[0].kind == "tensor":
            first = next(e for e in pool if e.text == args[0])
            return Ex(f"{atom(first)} |> {sig.name}({', '.join(args[1:])})", ret, False)
        return Ex(f"{sig.name}({', '.join(args)})", ret, True)

    @staticmethod
    def fits(p: TT, a: TT, binding: dict[str, str]) -> bool:
        if len(p.axes) != len(a.axes) or p.dtype != a.dtype or (p.index is None) != (a.index is None):
            return False
        local = dict(binding)
        for pa, aa in zip(p.axes, a.axes):
            if generic(pa):
                if local.setdefault(pa, aa) != aa:
                    return False
            elif pa != aa:
                return False
        return p.index is None or local.get(p.index, p.index) == a.index
