"""Grammar-directed programs, part 3: whole programs (items, functions, deliberate mistakes, the
README's training functions), deep nesting and long chains, and every generator by name."""

from __future__ import annotations

from collections.abc import Callable

from fuzzing.exprs import TT, Ex, Param, Sig, atom
from fuzzing.library import Library
from fuzzing.mutations import mutant, mutate_once, soup
from fuzzing.rand import Rand


class ProgramGen(Library):
    """A random program grown from the typing rules, with a mistake now and then."""

    def __init__(self, r: Rand, mistakes: float = 0.2) -> None:
        self.r = r
        self.mistakes = mistakes
        self.out: list[str] = []
        self.sigs: list[Sig] = []
        self.dims: list[str] = []
        self.model: dict[str, TT] = {}  # model M's params
        self.data: dict[str, TT] = {}   # data Ex's fields (without the batch axis)
        self.stack: str | None = None   # M.blocks: [L] B, each with w: [S S], b: [S]; this is S
        self.n_fns = 0

    # -- items --

    def program(self) -> str:
        r = self.r
        devices = r.choice(["devices cpu", "devices cuda", "devices cpu[0 1]", "devices cuda[0 1 2]\n    shard params",
                            "devices cpu[0 1]\n    split {dim}"]) if r.chance(0.15) else None
        self.dims = ["C"] + r.sample(["D", "E", "H", "K"], r.randint(1, 3))
        even: list[str] = []  # the dims two devices can split
        for d in self.dims:
            value = r.choice([2, 3, 4, 8, 16])
            if r.chance(self.mistakes / 10):
                self.out.append(r.choice([f"dim {d}", f"dim {d} = 0", f"dim {d} = {value}\ndim {d} = 2"]))
            else:
                self.out.append(f"dim {d} = {value}")
                even += [d] if value % 2 == 0 else []
        if devices is not None:  # split a dim the devices divide (E1902, E1904), chosen without a draw
            self.out.insert(0, devices.format(dim=even[0]) if even else "devices cpu[0 1]")
        xdim = r.choice(self.dims[1:])
        hdim = r.choice(self.dims)
        if r.chance(0.8):
            self.data = {"x": TT((xdim,)), "y": TT((), "i64", "C")}
            if r.chance(0.3):
                self.data["z"] = TT((xdim, "C"), r.choice(["f32", "f64", "bool"]))
            self.out.append("data Ex:\n" + "".join(f"    {k}: {t.text()}\n" for k, t in self.data.items()))
        if r.chance(0.7):
            self.model = {"w1": TT((xdim, hdim)), "w2": TT((hdim, "C"))}
            lines = [f"    param w1: [{xdim} {hdim}] = {self.init()}",
                     f"    param w2: [{hdim} C] = {self.init()}"]
            if r.chance(0.3):
                self.model["emb"] = TT(("C", hdim))
                lines.append(f"    param emb: [C {hdim}] = {self.init()}")
            if r.chance(0.3):
                self.stack = hdim
                self.out.append(f"dim L = {r.choice([1, 2, 3])}")
                self.out.append(f"model B:\n    param w: [{hdim} {hdim}] = {self.init()}\n"
                                f"    param b: [{hdim}] = {self.init()}\n")
                lines.append("    blocks: [L] B")
            if r.chance(0.5):
                self.model["b1"] = TT((hdim,))
                lines.append(f"    param b1: [{hdim}] = {self.init()}")
            if r.chance(0.2):
                self.model["steps"] = TT((), "i64")
                lines.append("    buffer steps: [] i64 = zeros()")
            if r.chance(self.mistakes / 5):
                lines.append(r.choice(["    param v: [n] = zeros()", "    param v: [C] i64 = zeros()",
                                       "    param v: [C] = gaussian(std=1)", "    param v: [C] = normal(sd=1)",
                                       "    w1: [C]", "    sub: M", "    param init: [C] = ones()"]))
            self.out.append("model M:\n" + "\n".join(lines) + "\n")
        if r.chance(0.2):
            self.out.append(f'extern fn ext(x: [{xdim}]) -> [{xdim}] = "mod.ext"')
            self.sigs.append(Sig("ext", [Param("x", "tensor", TT((xdim,)))], TT((xdim,))))
        for _ in range(r.randint(1, 4)):
            self.fn()
        if self.model and self.data and "y" in self.data and r.chance(0.5):
            self.training()
        return "\n".join(self.out) + "\n"

    def init(self) -> str:
        return self.r.choice(["normal(std=0.02)", "zeros()", "ones()", "uniform(low=-0.1, high=0.1)",
                              "normal(mean=0, std=1)", "normal(0.0, 0.5)"])

    # -- functions --

    def fn(self) -> None:
        r = self.r
        name = f"f{self.n_fns}"
        self.n_fns += 1
        generics = r.sample(["b", "n", "t"], r.randint(0, 2))
        axis_names = generics + self.dims
        params: list[Param] = []
        pool: list[Ex] = []
        uses_model = bool(self.model) and r.chance(0.3)
        uses_batch = bool(self.data) and r.chance(0.2)
        dtype = "f32" if uses_model or uses_batch or r.chance(0.85) else r.choice(["f64", "f16", "bf16"])
        if uses_model:
            params.append(Param("m", "model", None))
            pool += [Ex(f"m.{k}", t, True) for k, t in self.model.items()]
        if uses_batch:
            params.append(Param("batch", "batch", None))
            pool += [Ex(f"batch.{k}", TT(("bb",) + t.axes, t.dtype, t.index), True) for k, t in self.data.items()]
        for k in range(r.randint(0 if params else 1, 3)):
            rank = r.randint(0, 3)
            t = TT(tuple(self.param_axis(axis_names) for _ in range(rank)), dtype)
            pname = r.choice(["x", "y", "z", "w", "v"]) + str(k)
            params.append(Param(pname, "tensor", t))
            pool.append(Ex(pname, t, True))
        self.mode = None
        if r.chance(0.15):
            params.append(Param("mode", "mode", None))
            self.mode = "mode"
        body: list[str] = []
        made: list[Ex] = []
        block = r.chance(0.5)
        for step in range(r.randint(1, 6)):
            if block and r.chance(0.25):  # a statement that binds names: split, topk, a loop over blocks
                got = self.statement(pool, f"h{step}", uses_model)
                if got is not None:
                    stmt, new = got
                    body.append(stmt)
                    pool += new
                    made += new
                    continue
            e = self.step(pool)
            if e is None:
                continue
            if block and r.chance(0.4):
                var = f"h{step}"
                body.append(f"{var} = {e.text}")
                e = Ex(var, e.ty, True)
            pool.append(e)
            made.append(e)
        result = r.choice(made[-2:]) if made else r.choice(pool) if pool else Ex("0.0", TT(()), True)
        ret: TT | None = result.ty
        mistake = r.chance(self.mistakes)
        if mistake:
            result, ret, params, body = self.mistake(result, ret, params, body, pool, axis_names)
        sig_params = ", ".join(self.param_text(p) for p in params)
        head = f"fn {name}({sig_params})" + (f" -> {ret.text()}" if ret is not None else "")
        if block or body or ret is None:
            tail = f"return {result.text}" if ret is not None else f"print({result.text})"
            self.out.append(head + ":\n" + "".join(f"    {s}\n" for s in body + [tail]))
        else:
            self.out.append(f"{head} = {result.text}\n")
        if not mistake and ret is not None and all(p.kind != "batch" for p in params):
            self.sigs.append(Sig(name, params, ret))

    def param_axis(self, axis_names: list[str]) -> str:
        r = self.r
        if r.chance(0.1):  # a group axis, which `split` and `rearrange` take apart
            return f"({r.choice(['2', '3', r.choice(axis_names)])} {r.choice(axis_names)})"
        return r.choice(axis_names)

    def param_text(self, p: Param) -> str:
        mut = "mut " if p.mut else ""
        if p.kind == "mode":
            return f"{p.name}: Mode"
        if p.kind == "model":
            return f"{mut}{p.name}: M"
        if p.kind == "batch":
            return f"{mut}{p.name}: [bb] Ex"
        assert p.ty is not None
        return f"{mut}{p.name}: {p.ty.text()}"

    def step(self, pool: list[Ex]) -> Ex | None:
        r = self.r
        ops: list[Callable[[list[Ex]], Ex | None]] = [
            self.unary, self.binary, self.binary, self.reduce, self.softmax, self.matmul, self.matmul,
            self.cross_entropy, self.call, self.call, self.compare, self.negate, self.literal_op,
            self.rearrange, self.rearrange, self.reduce_pattern, self.repeat, self.einsum, self.einsum,
            self.where, self.pairwise, self.clamp, self.along, self.norm, self.one_hot, self.embedding,
            self.dropout, self.masked_causal, self.number_op, self.convert_op]
        for _ in range(4):
            e = r.choice(ops)(pool)
            if e is not None and len(e.text) < 400:
                return e
        return None

    # -- deliberate mistakes, so that programs fail in the checker too --

    def mistake(self, result: Ex, ret: TT | None, params: list[Param], body: list[str], pool: list[Ex],
                axis_names: list[str]):
        r = self.r
        kind = r.randint(0, 14)
        fs = self.floats(pool) or [result]
        a, b = r.choice(fs), r.choice(fs)
        if kind == 0 and ret is not None:  # a result type that differs
            axes = list(ret.axes)
            if axes and r.chance(0.5):
                axes.pop(r.randint(0, len(axes) - 1))
            else:
                axes.insert(r.randint(0, len(axes)), r.choice(axis_names))
            ret = TT(tuple(axes), r.choice([ret.dtype, "f64", "i64", "bool"]))
        elif kind == 1:  # operands that don't broadcast
            result = Ex(f"{atom(a)} + {atom(b)}", a.ty, False)
        elif kind == 2:  # over= a dim the operand lacks
            result = Ex(f"sum({a.text}, over={r.choice(axis_names + ['Q', 'b'])})", ret or a.ty, True)
        elif kind == 3:  # @ of mismatched axes
            result = Ex(f"{atom(a)} @ {atom(b)}", a.ty, False)
        elif kind == 4:  # unknown names
            result = Ex(r.choice(["zz", "frob(x0)", "relux(x0)", f"{atom(a)} * scale"]), a.ty, False)
        elif kind == 5:  # a dim used as a value
            result = Ex(f"{atom(a)} * {r.choice(self.dims)}", a.ty, False)
        elif kind == 6:  # indexing
            result = Ex(f"{atom(a)}[0]", a.ty, True)
        elif kind == 7 and self.sigs:  # a call with the wrong number of arguments
            sig = r.choice(self.sigs)
            result = Ex(f"{sig.name}({', '.join(e.text for e in r.sample(pool, r.randint(0, 3)))})", a.ty, True)
        elif kind == 8 and self.sigs:  # a call with a wrong keyword or mut
            sig = r.choice(self.sigs)
            result = Ex(f"{sig.name}(mut {a.text}, nope={b.text})", a.ty, True)
        elif kind == 9:  # a generic dim in the result only
            ret = TT((ret.axes if ret else ()) + ("q",), ret.dtype if ret else "f32")
        elif kind == 10:  # a parameter listed twice / a mut tensor parameter changed by update
            if params:
                params = params + [params[0]]
        elif kind == 11:  # a builtin with wrong arguments
            result = Ex(r.choice([f"softmax({a.text})", f"cross_entropy({a.text}, {b.text}, over=C)",
                                  f"relu({a.text}, {b.text})", "mean(over=C)", f"argmax({a.text})",
                                  f"value_and_grad({a.text})", f"batches({a.text}, 0)",
                                  f"update({a.text}, {b.text}, {a.text})"]), a.ty, True)
        elif kind == 12:  # dtype mix
            result = Ex(f"{atom(a)} + {atom(b)}", a.ty, False)
            params = [p._replace(ty=p.ty._replace(dtype=r.choice(["f64", "i32", "bool"])))
                      if p.kind == "tensor" and p.ty is not None and r.chance(0.5) else p for p in params]
        elif kind == 14:  # a pattern that doesn't fit
            n = len(a.ty.axes)
            names = " ".join(self.names(n))
            result = Ex(r.choice([
                f"rearrange({a.text}, {names} -> {names} p{n})", f"rearrange({a.text}, {names} p{n} -> {names})",
                f"rearrange({a.text}, {names} -> {' '.join(self.names(max(n - 1, 0)))})",
                f"reduce({a.text}, {names} -> {names})", f"reduce({a.text}, {names} -> , avg)",
                f"split({a.text}, {names} -> {names})", f"repeat({a.text}, {names} -> {names} z9)",
                f"einsum({a.text}, {b.text}, {names} -> {names})", f"rearrange({a.text}, ({names}) -> {names})",
                f"rearrange({a.text}, {names} -> ({names}) 2)", f"einsum({a.text}, ({names}) -> {names})",
                f"rearrange({a.text})", f"rearrange({a.text}, {b.text}, {names} -> {names})",
                f"repeat({a.text}, {names} -> {names} z9, z9=0)", f"repeat({a.text}, {names} -> z9 {names}, z9=n)"]),
                a.ty, True)
        else:  # no return / an unused broken statement
            if ret is not None and r.chance(0.5):
                body = body + [f"q = {atom(a)} @ {atom(b)} @ {atom(a)}"]
            else:
                body = body + [f"{a.text}"]
                result = Ex(f"{result.text}, {a.text}", result.ty, False) if r.chance(0.3) else result
        return result, ret, params, body

    # -- the README's training functions, perturbed --

    def training(self) -> None:
        r = self.r
        opt = r.choice(["AdamW", "Sgd"])
        act = r.choice(["relu", "tanh", "gelu"])
        bias = " + m.b1" if "b1" in self.model else ""
        logits = f"{act}(batch.x @ m.w1{bias}) @ m.w2"
        mistake = r.chance(self.mistakes)
        bad = r.randint(0, 9) if mistake else -1
        over = "C" if bad != 0 else r.choice(self.dims[1:])
        self.out.append(f"fn loss(m: M, batch: [b] Ex) -> [] = cross_entropy({logits}, batch.y, over={over})\n")
        mut_m = "" if bad == 1 else "mut "
        call_mut = "" if bad == 2 else "mut "
        opt2 = ("Sgd" if opt == "AdamW" else "AdamW") if bad == 3 else opt
        loss_fn = "forward" if bad == 4 else "loss"
        self.out.append(f"fn train_step({mut_m}m: M, mut opt: {opt}[M], batch: [b] Ex) -> []:\n"
                        f"    l, g = value_and_grad({loss_fn}, m, batch)\n"
                        f"    update({call_mut}m, mut opt, g)\n"
                        f"    return {'g' if bad == 5 else 'l'}\n")
        loop = "data |> shuffle(seed=0) |> batches(8)" if bad != 6 else "data |> shuffle(seed=0)"
        size = "0" if bad == 7 else r.choice(["8", "64", "1"])
        loop = loop.replace("batches(8)", f"batches({size})")
        extra = ""
        if bad == 8:
            extra = "        l2, g2 = value_and_grad(loss, m, batch)\n"
        if r.chance(0.5):
            extra += "        print(\"step\", l)\n"
        save = r.choice(["", "    save(\"ck.safetensors\", m, opt)\n", "    save(\"ck.safetensors\", m)\n"])
        if bad == 9:
            save = "    load(\"ck.safetensors\", m, opt)\n"
        self.out.append(f"fn fit(mut m: M, mut opt: {opt2}[M], data: Dataset[Ex], log: Sink):\n"
                        f"    for batch in {loop}:\n"
                        f"        l = train_step(mut m, mut opt, batch)\n"
                        f"        write(log, logs(loss=l))\n{extra}{save}")


def deep_program(r: Rand) -> str:
    """Deep nesting and long chains: parentheses, unary minus, `**`, `+`, calls, pipes, blocks."""
    n = r.choice([1, 2, 10, 50, 100, 200, 300, 500])
    form = r.randint(0, 8)
    if form == 0:
        body = "(" * n + "x" + ")" * n
    elif form == 1:
        body = "-" * n + "x"
    elif form == 2:
        body = " ** ".join(["x"] * n)
    elif form == 3:
        body = " + ".join(["x"] * n)
    elif form == 4:
        body = "relu(" * n + "x" + ")" * n
    elif form == 5:
        body = "x" + " |> relu" * n
    elif form == 6:
        body = "not " * n + "(x > 0.0)"
    elif form == 7:  # nested blocks
        lines = ["fn f(d: Dataset[Ex]):"]
        for k in range(1, min(n, 90) + 1):
            lines.append("    " * k + f"for b{k} in d |> batches(2):")
        lines.append("    " * (min(n, 90) + 1) + "print(1)")
        return "dim D = 2\ndata Ex:\n    x: [D]\n" + "\n".join(lines) + "\n"
    else:  # a long dim expression
        return "fn f(x: [" + "*".join(["n"] * n) + "]) -> [" + "*".join(["n"] * n) + "] = x\n"
    return f"fn f(x: [n]) -> [n] = {body}\n"


def grammar_program(r: Rand) -> str:
    return ProgramGen(r).program()


def grammar_mutant(r: Rand) -> str:
    """A grammar program with one text mutation: near-valid programs the seeds don't cover."""
    return mutate_once(r, ProgramGen(r, mistakes=0.0).program())


KINDS: dict[str, Callable[[Rand], str]] = {
    "mutant": mutant, "soup": soup, "grammar": grammar_program, "grammar_mutant": grammar_mutant,
    "deep": deep_program}
