"""Grammar-directed programs, part 2: calls of the standard library (patterns, einsum, where,
norms, lookups, masks, dropout) and statements that bind several names or loop."""

from __future__ import annotations

from fuzzing.exprs import TT, Ex, Exprs, _subsequence, atom, plain, unique_axes


class Library(Exprs):
    """The standard library's functions and the statements that bind several names."""

    stack: str | None

    # -- the standard library --

    @staticmethod
    def names(n: int, start: int = 0) -> list[str]:
        return [f"p{k}" for k in range(start, start + n)]

    def rearrange(self, pool):
        """A permutation, a merge of two neighbours into a group, or a group taken apart."""
        r = self.r
        es = [e for e in pool if e.ty.axes and e.ty.index is None]
        if not es:
            return None
        e = r.choice(es)
        axes = list(e.ty.axes)
        names = self.names(len(axes))
        groups = [k for k, a in enumerate(axes) if a.startswith("(") and a[1:-1].split()[0].isidentifier()]
        if groups and r.chance(0.4):  # (p q) -> p q, when both parts are dims
            k = r.choice(groups)
            parts = axes[k][1:-1].split()
            lhs = names[:k] + [f"({names[k]} q9)"] + names[k + 1:]
            rhs = names[:k] + [names[k], "q9"] + names[k + 1:]
            out = axes[:k] + parts + axes[k + 1:]
        else:
            order = list(range(len(axes)))
            for k in range(len(order) - 1, 0, -1):
                j = r.randint(0, k)
                order[k], order[j] = order[j], order[k]
            lhs, rhs, out = names, [names[k] for k in order], [axes[k] for k in order]
            if len(out) >= 2 and r.chance(0.4):
                k = r.randint(0, len(out) - 2)
                if plain(out[k]) and plain(out[k + 1]):
                    rhs = rhs[:k] + [f"({rhs[k]} {rhs[k + 1]})"] + rhs[k + 2:]
                    out = out[:k] + [f"({out[k]} {out[k + 1]})"] + out[k + 2:]
        return Ex(f"rearrange({e.text}, {' '.join(lhs)} -> {' '.join(rhs)})", TT(tuple(out), e.ty.dtype), True)

    def reduce_pattern(self, pool):
        r = self.r
        es = [e for e in self.floats(pool) if e.ty.axes]
        if not es:
            return None
        e = r.choice(es)
        names = self.names(len(e.ty.axes))
        keep = [k for k in range(len(names)) if r.chance(0.6)]
        op = r.choice(["sum", "mean", "max", "min", "prod"])
        out = TT(tuple(e.ty.axes[k] for k in keep), e.ty.dtype)
        rhs = " ".join(names[k] for k in keep)
        form = f", op={op}" if r.chance(0.3) else f", {op}"
        return Ex(f"reduce({e.text}, {' '.join(names)} -> {rhs}{form})", out, True)

    def repeat(self, pool):
        r = self.r
        es = [e for e in pool if e.ty.index is None]
        if not es:
            return None
        e = r.choice(es)
        names = self.names(len(e.ty.axes))
        new = r.choice(self.dims)
        k = r.randint(0, len(names))
        rhs = names[:k] + ["z9"] + names[k:]
        out = e.ty.axes[:k] + (new,) + e.ty.axes[k:]
        size = new if r.chance(0.7) else str(r.choice([2, 3]))
        if size != new:
            out = e.ty.axes[:k] + (size,) + e.ty.axes[k:]
        return Ex(f"repeat({e.text}, {' '.join(names)} -> {' '.join(rhs)}, z9={size})", TT(out, e.ty.dtype), True)

    def einsum(self, pool):
        """Two operands, one letter per dim, some dims contracted."""
        r = self.r
        fs = [e for e in self.floats(pool) if e.ty.axes and all(plain(a) for a in e.ty.axes)
              and len(set(e.ty.axes)) == len(e.ty.axes)]  # a name names one axis of an operand (E0307)
        if not fs:
            return None
        a = r.choice(fs)
        partners = [e for e in fs if e.ty.dtype == a.ty.dtype]
        b = r.choice(partners)
        letters: dict[str, str] = {}
        for d in a.ty.axes + b.ty.axes:
            letters.setdefault(d, f"e{len(letters)}")
        dims = list(letters)
        out = [d for d in dims if r.chance(0.6)]
        for k in range(len(out) - 1, 0, -1):
            j = r.randint(0, k)
            out[k], out[j] = out[j], out[k]
        pat = f"{' '.join(letters[d] for d in a.ty.axes)}, {' '.join(letters[d] for d in b.ty.axes)} -> " \
              f"{' '.join(letters[d] for d in out)}"
        return Ex(f"einsum({a.text}, {b.text}, {pat})", TT(tuple(out), a.ty.dtype), True)

    def where(self, pool):
        r = self.r
        fs = self.floats(pool)
        if not fs:
            return None
        a = r.choice(fs)
        smaller = [e for e in fs if e.ty.dtype == a.ty.dtype and _subsequence(e.ty.axes, a.ty.axes)]
        c = r.choice(smaller)
        same = [e for e in fs if e.ty == a.ty]
        b = atom(r.choice(same)) if r.chance(0.6) else r.choice(["0.0", "1.0"])
        return Ex(f"where({atom(c)} > 0.5, {a.text}, {b})", a.ty, True)

    def pairwise(self, pool):
        got = self.operands(pool)
        if got is None:
            return None
        left, right, a = got
        return Ex(f"{self.r.choice(['maximum', 'minimum'])}({left.text}, {right.text})", a.ty, True)

    def clamp(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        bounds = self.r.choice(["min=0.0", "max=1.0", "min=-1.0, max=1.0", "max=2, min=-2"])
        return Ex(f"clamp({e.text}, {bounds})", e.ty, True)

    def along(self, pool):
        es = [e for e in pool if e.ty.index is None and unique_axes(e.ty)]
        if not es:
            return None
        e = self.r.choice(es)
        d = self.r.choice(unique_axes(e.ty))
        return Ex(f"{self.r.choice(['cumsum', 'sort'])}({e.text}, over={d})", e.ty, True)

    def norm(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        unique = unique_axes(e.ty)
        if unique and self.r.chance(0.6):
            d = self.r.choice(unique)
            return Ex(f"norm({e.text}, over={d})", TT(tuple(a for a in e.ty.axes if a != d), e.ty.dtype), True)
        return Ex(f"norm({e.text})", TT((), e.ty.dtype), True)

    def one_hot(self, pool):
        labels = [e for e in pool if e.ty.index is not None and e.ty.index in self.dims]
        if not labels:
            return None
        e = self.r.choice(labels)
        return Ex(f"one_hot({e.text})", TT(e.ty.axes + (e.ty.index,)), True)

    def embedding(self, pool):
        tables = [e for e in self.floats(pool) if len(e.ty.axes) == 2 and plain(e.ty.axes[0])]
        pairs = [(t, i) for t in tables for i in pool if i.ty.index == t.ty.axes[0]]
        if not pairs:
            return None
        t, i = self.r.choice(pairs)
        return Ex(f"embedding({t.text}, {i.text})", TT(i.ty.axes + t.ty.axes[1:], t.ty.dtype), True)

    def dropout(self, pool):
        fs = self.floats(pool)
        if not fs:
            return None
        e = self.r.choice(fs)
        mode = self.mode or self.r.choice(["Eval()", "Train(seed=3)"])
        return Ex(f"dropout({e.text}, {self.r.choice(['0.1', '0.5', '0'])}, {mode})", e.ty, True)

    def masked_causal(self, pool):
        fs = [e for e in self.floats(pool) if len(e.ty.axes) >= 2 and plain(e.ty.axes[-1]) and plain(e.ty.axes[-2])]
        if not fs:
            return None
        e = self.r.choice(fs)
        i, j = e.ty.axes[-2:]
        fill = "-1e4" if e.ty.dtype == "f16" else "-1e9"  # -1e9 doesn't fit f16 (E0401)
        return Ex(f"masked_fill({e.text}, causal({i}, {j}), {fill})", e.ty, True)

    def statement(self, pool: list[Ex], var: str, uses_model: bool) -> tuple[str, list[Ex]] | None:
        """A statement that binds several names or loops: split, topk (and gather), blocks."""
        r = self.r
        kind = r.randint(0, 2)
        if kind == 0:  # split a group axis with a literal count
            es = [e for e in pool if any(a.startswith("(") and a[1:-1].split()[0].isdigit() for a in e.ty.axes)]
            if not es:
                return None
            e = r.choice(es)
            k = next(i for i, a in enumerate(e.ty.axes) if a.startswith("(") and a[1:-1].split()[0].isdigit())
            count, part = e.ty.axes[k][1:-1].split()
            names = self.names(len(e.ty.axes))
            lhs = names[:k] + [f"({count} {names[k]})"] + names[k + 1:]
            out = TT(e.ty.axes[:k] + (part,) + e.ty.axes[k + 1:], e.ty.dtype, e.ty.index)
            targets = [f"{var}_{n}" for n in range(int(count))]
            stmt = f"{', '.join(targets)} = split({e.text}, {' '.join(lhs)} -> {' '.join(names)})"
            return stmt, [Ex(t, out, True) for t in targets]
        if kind == 1:  # topk, then gather with its indices
            es = [e for e in pool if e.ty.index is None and e.ty.dtype != "bool" and unique_axes(e.ty)]
            if not es:
                return None
            e = r.choice(es)
            d = r.choice(unique_axes(e.ty))
            k = e.ty.axes.index(d)
            axes = e.ty.axes[:k] + ("2",) + e.ty.axes[k + 1:]
            values, index = TT(axes, e.ty.dtype), TT(axes, "i64", d)
            stmt = f"{var}_v, {var}_i = topk({e.text}, 2, over={d})"
            picked = Ex(f"gather({e.text}, {var}_i, over={d})", values, True)
            return stmt, [Ex(f"{var}_v", values, True), Ex(f"{var}_i", index, True), picked]
        if self.stack is None or not uses_model:  # a loop over the model's blocks
            return None
        s = self.stack
        es = [e for e in self.floats(pool) if e.ty.axes and e.ty.axes[-1] == s and e.ty.dtype == "f32"]
        if not es:
            return None
        e = r.choice(es)
        stmt = (f"{var} = {e.text}\n    for blk in m.blocks:\n"
                f"        {var} = {r.choice(['relu', 'tanh'])}({var} @ blk.w + blk.b) + {var}")
        return stmt, [Ex(var, e.ty, True)]
