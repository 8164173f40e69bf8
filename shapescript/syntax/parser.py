"""Tokens to the syntax tree: recursive descent for items and statements, Pratt for expressions.

Every problem is a `Diagnostic` (E01xx) pointing at the token where the parser got stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import CompileError, Diagnostic, Span
from . import tree as A
from .device_line import DeviceLine
from .lexer import LexError, Token, describe, tokenize
from .type_grammar import TypeGrammar

Line = TypeVar("Line")  # what one line of a block parses to
ITEM_WORDS = ("devices", "dim", "data", "model", "extern", "python", "precision")

# Binding powers: higher binds tighter.
BINARY = {
    "|>": 1, "or": 2, "and": 3,
    "==": 5, "!=": 5, "<": 5, "<=": 5, ">": 5, ">=": 5,
    "+": 6, "-": 6, "*": 7, "/": 7, "%": 7, "@": 7, "**": 9,
}
NOT_POWER = 4
# Limits that keep the checker's recursion and the generated Python's nesting within Python's own.
MAX_NESTING = 100
MAX_LOOPS = 16
NEG_POWER = 8


class ParseError(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def parse(source: str, file: str = "<input>") -> A.Program:
    """Parse a whole program; raises CompileError with the first syntax error."""
    warnings: list[Diagnostic] = []
    try:
        tokens = tokenize(source, file, warnings)
        program = _Parser(tokens, source, file).program()
    except (LexError, ParseError) as e:
        raise CompileError([e.diagnostic], source, tuple(warnings)) from None
    program.warnings = tuple(warnings)
    return program


class _Parser(TypeGrammar, DeviceLine):
    def __init__(self, tokens: list[Token], source: str, file: str) -> None:
        self.toks = tokens
        self.pos = 0
        self.nesting = 0  # expressions being parsed inside one another
        self.chain = 0  # operators in the current statement
        self.loops = 0  # `for` loops around the current statement
        self.source = source
        self.file = file

    # ---- token helpers ------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def at(self, text: str, kind: str | None = None) -> bool:
        t = self.tok
        return t.text == text and t.kind in ((kind,) if kind else ("OP", "KW", "NAME"))

    def advance(self) -> Token:
        t = self.tok
        if t.kind != "EOF":
            self.pos += 1
        return t

    def fail(self, message: str, tok: Token | None = None, label: str = "", help: str = "") -> ParseError:
        tok = tok or self.tok
        span = tok.span
        if tok.kind in ("NEWLINE", "EOF", "DEDENT"):  # point at the last real token instead
            k = min(self.pos, len(self.toks) - 1)
            while k > 0 and self.toks[k].kind in ("NEWLINE", "EOF", "DEDENT", "INDENT"):
                k -= 1
            if self.toks[k].kind not in ("NEWLINE", "EOF", "DEDENT", "INDENT"):
                span = self.toks[k].span
        return self.fail_at(span, message, label, help)

    def slicing(self, opened: Token) -> ParseError:
        """`x[a:b]`: not a construct of the language (E0404, as indexing), said as such."""
        return ParseError(Diagnostic("E0404", "slicing with `[start:end]` isn't part of the language",
                                     opened.span.to(self.tok.span), "a slice",
                                     ("take a part along a named axis: `window(x, start, size, over=D)`, "
                                      "`first(x, n, over=D)` or `last(x, n, over=D)`",)))

    def fail_at(self, span: Span, message: str, label: str = "", help: str = "") -> ParseError:
        return ParseError(Diagnostic("E0105", message, span, label, (help,) if help else ()))

    def expect(self, text: str, what: str = "", help: str = "") -> Token:
        if self.tok.text == text and self.tok.kind in ("OP", "KW", "NAME"):
            return self.advance()
        raise self.fail(f"expected `{text}`{' ' + what if what else ''}, found {describe(self.tok)}",
                        label=f"expected `{text}`", help=help)

    def expect_name(self, what: str) -> Token:
        if self.tok.kind == "NAME":
            return self.advance()
        extra = " (a reserved word)" if self.tok.kind == "KW" else ""
        raise self.fail(f"expected {what}, found {describe(self.tok)}{extra}", label=f"expected {what}")

    def expect_newline(self) -> None:
        if self.tok.kind == "NEWLINE":
            self.advance()
            return
        raise self.fail(f"expected the end of the line, found {describe(self.tok)}", label="unexpected",
                        help="put each statement on a line of its own")

    def span_from(self, start: Span) -> Span:
        """From `start` to the end of the last real token consumed (layout tokens don't count)."""
        k = self.pos - 1
        while k > 0 and self.toks[k].kind in ("NEWLINE", "INDENT", "DEDENT"):
            k -= 1
        return start.to(self.toks[k].span) if k >= 0 else start

    def block(self, parse_line: Callable[[], Line]) -> list[Line]:
        """NEWLINE INDENT { line } DEDENT, after a `:`."""
        self.expect_newline()
        if self.tok.kind != "INDENT":
            raise self.fail("expected an indented block", label="the block should start here",
                            help="indent the lines that belong to it")
        self.advance()
        out: list[Line] = []
        while self.tok.kind not in ("DEDENT", "EOF"):
            out.append(parse_line())
        self.advance()
        return out

    # ---- items --------------------------------------------------------------------------------

    def program(self) -> A.Program:
        start = self.tok.span
        items: list[A.Item] = []
        while self.tok.kind != "EOF":
            items.append(self.item())
        return A.Program(self.span_from(start) if items else start, items, self.source)

    def item(self) -> A.Item:
        t = self.tok
        if t.kind == "KW" and t.text == "fn":
            return self.fn()
        if t.kind == "NAME" and t.text in ITEM_WORDS:
            return self.item_parsers()[t.text]()
        if t.kind == "INDENT":
            raise self.fail("unexpected indentation", label="this line is indented",
                            help="top-level items start at the first column")
        raise self.fail(f"expected an item (devices, precision, dim, data, model, fn, extern fn, python fn), "
                        f"found {describe(t)}", label="not an item",
                        help="statements go inside a `fn`")

    def item_parsers(self) -> dict[str, Callable[[], A.Item]]:
        """Each of ITEM_WORDS' parser."""
        return {"devices": self.item_devices, "dim": self.item_dim, "data": self.item_data, "model": self.item_model,
                "extern": self.item_extern, "python": self.item_python, "precision": self.item_precision}

    def item_precision(self) -> A.Precision:
        start = self.advance().span
        mixed = self.tok.kind == "NAME" and self.tok.text == "mixed" and self.peek().kind == "NAME"
        if mixed:  # `precision mixed bf16`
            self.advance()
        dtype = self.expect_name("a float dtype (f16, bf16, f32, f64)")
        node = A.Precision(self.span_from(start), dtype.text, dtype.span, mixed)
        self.expect_newline()
        return node

    def item_dim(self) -> A.Dim:
        start = self.advance().span
        name = self.expect_name("a dim name")
        value, expr = None, None
        if self.at("=", "OP"):
            self.advance()
            if self.tok.kind not in ("INT", "NAME") and not self.at("(", "OP"):
                raise self.fail(f"expected a size for dim `{name.text}`, found {describe(self.tok)}",
                                label="a dim's value is a size or other dims' arithmetic",
                                help=f"write `dim {name.text} = 64`, or `dim {name.text} = H * Dh` from declared dims")
            size = self.dimexpr()
            if isinstance(size, A.DimInt):
                value = size.value
            else:
                expr = size  # a derived dim: the checker computes its size
        node = A.Dim(self.span_from(start), name.text, name.span, value, expr)
        self.expect_newline()
        return node

    def item_data(self) -> A.Data:
        start = self.advance().span
        name = self.expect_name("a data type name")
        self.expect(":", f"after `data {name.text}`")
        fields = self.block(self.field)
        return A.Data(self.span_from(start), name.text, name.span, fields)

    def field(self) -> A.Field:
        name = self.expect_name("a field name")
        self.expect(":", f"after the field name `{name.text}`")
        typ = self.type()
        node = A.Field(self.span_from(name.span), name.text, typ)
        self.expect_newline()
        return node

    def item_model(self) -> A.Model:
        start = self.advance().span
        name = self.expect_name("a model name")
        params = self.model_params(name.text) if self.at("[", "OP") else []
        self.expect(":", f"after `model {name.text}`")
        members = self.block(self.member)
        return A.Model(self.span_from(start), name.text, name.span, members, params)

    def model_params(self, model: str) -> list[A.DimName]:
        """`[I O]` after a model's name: the dims it is generic over, each a name."""
        self.advance()
        params: list[A.DimName] = []
        while not self.at("]", "OP"):
            if self.tok.kind != "NAME":
                raise self.fail(f"expected a dim name in `model {model}[...]`, found {describe(self.tok)}",
                                label="a model's dims are names", help=f"write `model {model}[I O]:`")
            t = self.advance()
            params.append(A.DimName(t.span, t.text))
            if self.at(",", "OP"):
                self.advance()
        if not params:
            raise self.fail(f"`model {model}[]` names no dim", label="empty",
                            help=f"write `model {model}[D]:`, or `model {model}:` for one of fixed sizes")
        self.advance()
        return params

    def member(self) -> A.Member:
        start = self.tok.span
        kind = A.MemberKind.SUB
        if self.tok.kind == "NAME" and self.tok.text in ("param", "buffer") and self.peek().kind == "NAME":
            kind = A.MemberKind(self.advance().text)
        name = self.expect_name("a member name")
        self.expect(":", f"after `{name.text}`")
        typ = self.type()
        init = None
        if kind != A.MemberKind.SUB:
            self.expect("=", f"and an initializer for `{name.text}`",
                        help="e.g. `param w: [D C] = normal(std=0.02)`")
            init_expr = self.expr()
            if not isinstance(init_expr, A.Call):
                raise self.fail("an initializer is a call such as `normal(std=0.02)`", self.toks[self.pos - 1])
            init = init_expr
        node = A.Member(self.span_from(start), kind, name.text, typ, init)
        self.expect_newline()
        return node

    def params(self) -> list[A.Param]:
        self.expect("(", "to open the parameter list")
        params: list[A.Param] = []
        while not self.at(")", "OP"):
            start = self.tok.span
            mut = False
            if self.at("mut", "KW"):
                self.advance()
                mut = True
            name = self.expect_name("a parameter name")
            self.expect(":", f"and a type for `{name.text}`", help=f"write `{name.text}: [n]` or the like")
            typ = self.type()
            params.append(A.Param(self.span_from(start), name.text, typ, mut))
            if not self.at(")", "OP"):
                self.expect(",", "between parameters")
        self.advance()
        return params

    def fn(self) -> A.Fn:
        self.chain = 0
        start = self.advance().span
        name = self.expect_name("a function name")
        params = self.params()
        ret = None
        if self.at("->", "OP"):
            self.advance()
            ret = self.type()
        if self.at("=", "OP"):
            self.advance()
            value = self.expr()
            body: list[A.Stmt] = [A.Return(value.span, value)]
            node = A.Fn(self.span_from(start), name.text, name.span, params, ret, body, True)
            self.expect_newline()
            return node
        self.expect(":", "to start the function's body", help="or `= expr` for a one-line function")
        body = self.block(self.stmt)
        return A.Fn(self.span_from(start), name.text, name.span, params, ret, body, False)

    def item_extern(self) -> A.Extern:
        return self.foreign("extern")

    def item_python(self) -> A.Extern:
        return self.foreign("python")

    def foreign(self, kind: str) -> A.Extern:
        start = self.advance().span
        self.expect("fn", f"after `{kind}`")
        name = self.expect_name("a function name")
        params = self.params()
        ret = None
        if self.at("->", "OP"):
            self.advance()
            ret = self.type()
        self.expect("=", "and the Python function's name", help=f'e.g. `{kind} fn f(x: [n]) -> [n] = "module.func"`')
        if self.tok.kind != "STRING":
            raise self.fail(f'expected the Python function as a string, "module.func", found {describe(self.tok)}')
        target = self.advance()
        node = A.Extern(self.span_from(start), kind, name.text, name.span, params, ret, target.text, target.span)
        self.expect_newline()
        return node

    # ---- statements ---------------------------------------------------------------------------

    def stmt(self) -> A.Stmt:
        self.chain = 0
        start = self.tok.span
        if self.at("return", "KW"):
            self.advance()
            value = None if self.tok.kind == "NEWLINE" else self.expr_or_tuple()
            node: A.Stmt = A.Return(self.span_from(start), value)
            self.expect_newline()
            return node
        if self.at("for", "KW"):
            self.loops += 1
            if self.loops > MAX_LOOPS:
                raise self.fail(f"more than {MAX_LOOPS} loops inside one another", label="too deep",
                                help="move the inner loops into a function of their own")
            self.advance()
            var = self.expect_name("a loop variable")
            self.expect("in", "after the loop variable")
            it = self.expr()
            self.expect(":", "to start the loop's body")
            body = self.block(self.stmt)
            self.loops -= 1
            return A.For(self.span_from(start), A.Name(var.span, var.text), it, body)
        if self.at("if", "KW"):
            return self.branches(start)
        first = self.expr()
        if self.at(",", "OP") or self.at("=", "OP"):
            targets = [first]
            while self.at(",", "OP"):
                self.advance()
                targets.append(self.expr())
            self.expect("=", "to assign to the names")
            names: list[A.Name] = []
            for t in targets:
                if not isinstance(t, A.Name):
                    raise ParseError(Diagnostic("E0105", "only names can be assigned to", t.span,
                                                "not a name", ("bind the value to a new name",)))
                names.append(t)
            value = self.expr()
            node = A.Assign(self.span_from(start), names, value)
        else:
            node = A.ExprStmt(first.span, first)
        self.expect_newline()
        return node

    def branches(self, start: Span) -> A.If:
        """`if cond:` block, then any `elif cond:` blocks and an `else:` block (nested as Ifs)."""
        self.loops += 1  # a branch nests as deep as a loop does
        if self.loops > MAX_LOOPS:
            raise self.fail(f"more than {MAX_LOOPS} loops and branches inside one another", label="too deep",
                            help="move the inner ones into a function of their own")
        self.advance()
        cond = self.expr()
        self.expect(":", "to start the branch")
        then = self.block(self.stmt)
        orelse: list[A.Stmt] = []
        if self.at("elif", "KW"):
            orelse = [self.branches(self.tok.span)]
        elif self.at("else", "KW"):
            self.advance()
            self.expect(":", "to start the `else` branch")
            orelse = self.block(self.stmt)
        self.loops -= 1
        return A.If(self.span_from(start), cond, then, orelse)

    # ---- expressions --------------------------------------------------------------------------

    def expr_or_tuple(self) -> A.Expr:
        first = self.expr()
        if not self.at(",", "OP"):
            return first
        items = [first]
        while self.at(",", "OP"):
            self.advance()
            items.append(self.expr())
        return A.TupleExpr(first.span.to(items[-1].span), items)

    def expr(self, power: int = 0) -> A.Expr:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.fail(f"this expression is nested more than {MAX_NESTING} deep", label="too deep",
                            help="split it into several statements")
        try:
            return self._expr(power)
        finally:
            self.nesting -= 1

    def _expr(self, power: int = 0) -> A.Expr:
        left = self.prefix()
        while True:
            t = self.tok
            op = t.text if t.kind in ("OP", "KW") else None
            bp = BINARY.get(op) if op else None
            if op is None or bp is None or bp <= power:
                return left
            self.advance()
            # `**` is right-associative: its right side may hold another `**`.
            right = self.expr(bp - 1 if op == "**" else bp)
            if op == "|>":
                left = self.pipe(left, right, t)
            else:
                left = A.Binary(left.span.to(right.span), op, left, right)
            self.chain += 1  # a long chain is deep too, for the checker and for Python
            if self.chain > MAX_NESTING:
                raise self.fail(f"this expression chains more than {MAX_NESTING} operations", t,
                                label="too long", help="split it into several statements")

    def pipe(self, left: A.Expr, right: A.Expr, tok: Token) -> A.Call:
        span = left.span.to(right.span)
        if isinstance(right, A.Call):
            return A.Call(span, right.func, [A.Arg(left.span, left)] + right.args, piped=True)
        if isinstance(right, (A.Name, A.Attr)):
            return A.Call(span, right, [A.Arg(left.span, left)], piped=True)
        raise ParseError(Diagnostic("E0105", "the right side of `|>` must be a function or a call",
                                    right.span, "not a function", ("write `x |> f(y)`, which means `f(x, y)`",)))

    def prefix(self) -> A.Expr:
        t = self.tok
        if t.kind == "OP" and t.text == "-":
            self.advance()
            operand = self.expr(NEG_POWER)
            return A.Unary(t.span.to(operand.span), "-", operand)
        if t.kind == "KW" and t.text == "not":
            self.advance()
            operand = self.expr(NOT_POWER)
            return A.Unary(t.span.to(operand.span), "not", operand)
        return self.postfix(self.atom())

    def atom(self) -> A.Expr:
        t = self.tok
        if t.kind == "NAME":
            self.advance()
            return A.Name(t.span, t.text)
        if t.kind == "INT":
            self.advance()
            return A.IntLit(t.span, int(t.text))
        if t.kind == "FLOAT":
            self.advance()
            return A.FloatLit(t.span, float(t.text))
        if t.kind == "STRING":
            self.advance()
            return A.StrLit(t.span, t.text)
        if t.kind == "KW" and t.text in ("true", "false"):
            self.advance()
            return A.BoolLit(t.span, t.text == "true")
        if self.at("(", "OP"):
            self.advance()
            inner = self.expr_or_tuple()
            self.expect(")", "to close the parenthesis")
            return inner
        raise self.fail(f"expected an expression, found {describe(t)}", label="expected an expression")

    def postfix(self, node: A.Expr) -> A.Expr:
        while True:
            if self.at(".", "OP"):
                self.advance()
                name = self.expect_name("a field name after `.`")
                node = A.Attr(node.span.to(name.span), node, name.text, name.span)
            elif self.at("(", "OP"):
                self.advance()
                args = self.args(node)
                close = self.expect(")", "to close the call")
                node = A.Call(node.span.to(close.span), node, args)
            elif self.at("[", "OP") and not (self.tok.span.line != self.toks[self.pos - 1].span.end_line):
                opened = self.advance()
                if self.at(":", "OP"):
                    raise self.slicing(opened)
                index = self.expr()
                if self.at(":", "OP"):
                    raise self.slicing(opened)
                close = self.expect("]", "to close the index")
                node = A.Subscript(node.span.to(close.span), node, index)
            else:
                return node

    # ---- call arguments and patterns ----------------------------------------------------------

    def segments(self) -> list[tuple[int, int, bool]]:
        """Split the call's arguments at top-level commas: (start, end, has_arrow) token ranges."""
        out = []
        depth = 0
        i = self.pos
        start = i
        arrow = False
        while True:
            t = self.toks[i]
            if t.kind == "EOF":
                break
            if t.kind == "OP" and t.text in "([":
                depth += 1
            elif t.kind == "OP" and t.text in ")]":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and t.kind == "OP" and t.text == ",":
                out.append((start, i, arrow))
                start, arrow = i + 1, False
            elif depth == 0 and t.kind == "OP" and t.text == "->":
                arrow = True
            i += 1
        if i > start:
            out.append((start, i, arrow))
        return out

    def args(self, func: A.Expr) -> list[A.Arg]:
        segs = self.segments()
        arrow_at = next((k for k, s in enumerate(segs) if s[2]), None)
        pattern_first = arrow_at
        if arrow_at is not None and isinstance(func, A.Name) and func.id == "einsum":
            pattern_first = (arrow_at + 1) // 2  # einsum: as many pattern operands as tensors
        args: list[A.Arg] = []
        k = 0
        while not self.at(")", "OP"):
            if arrow_at is not None and k == pattern_first:
                args.append(self.pattern(arrow_at - k + 1))
                k = arrow_at + 1
            else:
                args.append(self.arg())
                k += 1
            if not self.at(")", "OP"):
                self.expect(",", "between arguments")
        return args

    def arg(self) -> A.Arg:
        start = self.tok.span
        if self.at("mut", "KW"):
            self.advance()
            value = self.expr()
            return A.Arg(self.span_from(start), value, None, True)
        if self.tok.kind == "NAME" and self.peek().kind == "OP" and self.peek().text == "=":
            name = self.advance().text
            self.advance()
            value = self.expr()
            return A.Arg(self.span_from(start), value, name)
        value = self.expr()
        return A.Arg(value.span, value)

    def pattern(self, operands: int) -> A.Arg:
        start = self.tok.span
        lhs: list[list[A.PatAxis]] = []
        for k in range(operands):
            lhs.append(self.pat_axes())
            if k < operands - 1:
                self.expect(",", "between the pattern's operands")
        self.expect("->", "in the pattern")
        rhs = self.pat_axes()
        span = self.span_from(start)
        return A.Arg(span, A.Pattern(span, lhs, rhs))

    def pat_axes(self) -> list[A.PatAxis]:
        out: list[A.PatAxis] = []
        while True:
            t = self.tok
            if t.kind == "NAME":
                self.advance()
                out.append(A.PatAxis(t.span, name=t.text))
            elif t.kind == "INT":
                self.advance()
                out.append(A.PatAxis(t.span, size=int(t.text)))
            elif self.at("(", "OP"):
                self.advance()
                inner = self.pat_axes()
                close = self.expect(")", "to close the group")
                out.append(A.PatAxis(t.span.to(close.span), group=inner))
            else:
                return out
