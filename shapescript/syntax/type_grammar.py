"""The grammar of types and dims: `[b n (H Dh)] f16`, `[] Index[C]`, `AdamW[Mlp]`, `b*D+1`.

A mixin of the parser: it uses the parser's token helpers (`tok`, `at`, `advance`, `expect`,
`expect_name`, `fail`, `span_from`).
"""

from __future__ import annotations

from typing import Any

from . import tree as A
from .lexer import Token, describe


class TypeGrammar:
    tok: Any
    at: Any
    advance: Any
    expect: Any
    expect_name: Any
    fail: Any
    span_from: Any
    peek: Any
    toks: list[Token]
    pos: int

    # ---- types --------------------------------------------------------------------------------

    def type(self) -> A.TypeExpr:
        start = self.tok.span
        if self.at("[", "OP"):
            self.advance()
            axes: list[A.Axis] = []
            while not self.at("]", "OP"):
                axes.append(self.axis())
            self.advance()
            element = None
            if self.tok.kind == "NAME":
                element = self.named_type()
            return A.ShapeType(self.span_from(start), axes, element)
        if self.tok.kind == "NAME":
            return self.named_type()
        raise self.fail(f"expected a type, found {describe(self.tok)}", label="expected a type",
                        help="a tensor type is written `[b D]`, a scalar `[]`")

    def named_type(self) -> A.NamedType:
        name = self.expect_name("a type name")
        args: list[A.TypeExpr | A.DimExpr] = []
        if self.at("[", "OP"):
            self.advance()
            while not self.at("]", "OP"):
                if self.at("[", "OP") or (self.tok.kind == "NAME" and self.peek().text == "["):
                    args.append(self.type())
                else:
                    args.append(self.dimexpr())
                if self.at(",", "OP"):
                    self.advance()
            self.advance()
        return A.NamedType(self.span_from(name.span), name.text, args)

    def axis(self) -> A.Axis:
        if self.at("(", "OP"):
            start = self.advance().span
            parts: list[A.DimExpr] = []
            while not self.at(")", "OP"):
                parts.append(self.dimexpr())
            self.advance()
            if not parts:
                raise self.fail("an empty group `()` has no axis", self.toks[self.pos - 1])
            if len(parts) == 1:
                first = parts[0]
                return self.dim_tail(first) if self.tok.text in "+-*/" and self.tok.kind == "OP" else first
            return A.GroupAxis(self.span_from(start), parts)
        return self.dimexpr()

    def dimexpr(self, power: int = 0) -> A.DimExpr:
        left = self.dim_atom()
        return self.dim_tail(left, power)

    def dim_tail(self, left: A.DimExpr, power: int = 0) -> A.DimExpr:
        ops = {"+": 1, "-": 1, "*": 2, "/": 2}
        while self.tok.kind == "OP" and self.tok.text in ops and ops[self.tok.text] > power:
            op = self.advance().text
            right = self.dimexpr(ops[op])
            left = A.DimBin(left.span.to(right.span), op, left, right)
        return left

    def dim_atom(self) -> A.DimExpr:
        t = self.tok
        if t.kind == "NAME":
            self.advance()
            return A.DimName(t.span, t.text)
        if t.kind == "INT":
            self.advance()
            return A.DimInt(t.span, int(t.text))
        if self.at("(", "OP"):
            self.advance()
            inner = self.dimexpr()
            self.expect(")", "to close the dim expression")
            return inner
        raise self.fail(f"expected a dim (a name or a size), found {describe(t)}", label="expected a dim")
