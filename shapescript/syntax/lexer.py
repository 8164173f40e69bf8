"""Source text to tokens, with INDENT/DEDENT from an indent stack and an exact span on each token.

Newlines inside brackets don't end a line, as in Python. Tabs in indentation are refused, since
their width is a matter of taste and the block structure must not be.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from ..errors import Diagnostic, Severity, Span

# Hard keywords. Item words (devices, dim, data, model, param, buffer, extern, python) are
# contextual: `data` is a fine parameter name.
KEYWORDS = frozenset({"fn", "mut", "return", "for", "in", "if", "elif", "else", "and", "or", "not", "true", "false"})

# Longest first, so "->" wins over "-". `×` is a devices line's hosts × devices (`2 × cuda[0 1]`),
# which also takes the name `x`: a word, so that `x` stays a name everywhere else.
PUNCT = ("|>", "->", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", ",", ":", ".", "=",
         "+", "-", "*", "/", "%", "@", "<", ">", "×")

# The longest whole number a program may write: 10**100 is far past any size or count, and Python
# refuses to read a number of a few thousand digits (sys.get_int_max_str_digits), as an internal error.
MAX_INT_DIGITS = 100


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # NAME INT FLOAT STRING OP KW NEWLINE INDENT DEDENT EOF
    text: str
    span: Span

    def __repr__(self) -> str:
        return f"{self.kind}({self.text!r})@{self.span.line}:{self.span.col}"


def describe(tok: Token) -> str:
    """A token as a message names it: `x`, or the end of the line."""
    layout = {"NEWLINE": "the end of the line", "EOF": "the end of the file", "INDENT": "an indented block",
              "DEDENT": "the end of the block"}
    return layout.get(tok.kind, f"`{tok.text}`")


class LexError(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def tokenize(source: str, file: str = "<input>", warnings: list[Diagnostic] | None = None) -> list[Token]:
    """The tokens of `source`; the warnings found on the way (W0106) are added to `warnings`, up to
    a lexical error too."""
    return _Lexer(source, file, [] if warnings is None else warnings).run()


# The characters that change the direction text is shown in (Unicode's bidirectional embeddings,
# overrides and isolates), which can make a line read differently on screen than the compiler reads
# it (the "Trojan Source" attack); outside comments and strings they are E0101 like any other.
TEXT_DIRECTION = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class _Lexer:
    def __init__(self, source: str, file: str, warnings: list[Diagnostic]) -> None:
        self.src = source
        self.file = file
        self.warnings = warnings
        self.tokens: list[Token] = []
        self.indents = [0]
        self.depth = 0  # bracket nesting; newlines inside brackets are ignored
        self.brackets: list[Token] = []

    def span(self, line: int, col: int, end_col: int) -> Span:
        return Span(self.file, line, col, line, end_col)

    def error(self, code: str, message: str, span: Span, label: str = "", help: str = "") -> None:
        raise LexError(Diagnostic(code, message, span, label, (help,) if help else ()))

    def text_direction(self, text: str, start: int, number: int, where: str) -> None:
        """W0106 for each text-direction character in `text[start:]`, a comment or a string's text."""
        if TEXT_DIRECTION.isdisjoint(text[start:]):
            return  # nearly always
        for pos in range(start, len(text)):
            ch = text[pos]
            if ch in TEXT_DIRECTION:
                name = unicodedata.name(ch)
                self.warnings.append(Diagnostic(
                    "W0106", f"U+{ord(ch):04X} ({name.lower()}) in {where} changes the direction text is shown in",
                    self.span(number, pos + 1, pos + 2), f"`{ch}` here",  # shown escaped, as all user text
                    ("remove it, unless the text is meant to read right to left: editors and terminals show "
                     "the text after it in another order than the compiler reads it",),
                    severity=Severity.WARNING))

    def emit(self, kind: str, text: str, line: int, col: int, end_col: int) -> None:
        self.tokens.append(Token(kind, text, self.span(line, col, end_col)))

    def run(self) -> list[Token]:
        lines = self.src.split("\n")
        for number, raw in enumerate(lines, start=1):
            line = raw.rstrip("\r")
            self.line(line, number)
        last = len(lines)
        if self.depth:
            opener = self.brackets[-1]
            self.error("E0104", f"`{opener.text}` is never closed", opener.span, "opened here",
                       f"close it with `{_CLOSER[opener.text]}`")
        if self.tokens and self.tokens[-1].kind not in ("NEWLINE", "DEDENT"):
            self.emit("NEWLINE", "", last, len(lines[-1]) + 1, len(lines[-1]) + 1)
        while len(self.indents) > 1:
            self.indents.pop()
            self.emit("DEDENT", "", last + 1, 1, 1)
        self.emit("EOF", "", last + 1, 1, 1)
        return self.tokens

    def line(self, text: str, number: int) -> None:
        pos = 0
        if self.depth == 0:
            stripped = text.lstrip(" \t")
            if not stripped or stripped.startswith("#"):
                self.text_direction(text, 0, number, "a comment")
                return  # blank and comment-only lines don't affect indentation
            indent_text = text[: len(text) - len(stripped)]
            if "\t" in indent_text:
                col = indent_text.index("\t") + 1
                self.error("E0102", "tab in indentation", self.span(number, col, col + 1),
                           "a tab", "indent with spaces")
            width = len(indent_text)
            if width > self.indents[-1]:
                self.indents.append(width)
                self.emit("INDENT", "", number, 1, width + 1)
            else:
                while width < self.indents[-1]:
                    self.indents.pop()
                    self.emit("DEDENT", "", number, 1, width + 1)
                if width != self.indents[-1]:
                    self.error("E0102", "this line's indentation matches no enclosing block",
                               self.span(number, 1, width + 1), "",
                               f"indent it by {self.indents[-1]} spaces, as the block it belongs to")
            pos = width
        n = len(text)
        while pos < n:
            ch = text[pos]
            col = pos + 1
            if ch in " \t\r":
                pos += 1
            elif ch == "#":
                self.text_direction(text, pos, number, "a comment")
                break
            elif _name_start(ch):
                end = pos + 1
                while end < n and (_name_start(text[end]) or text[end] in _DIGITS):
                    end += 1
                word = text[pos:end]
                self.emit("KW" if word in KEYWORDS else "NAME", word, number, col, end + 1)
                pos = end
            elif ch in _DIGITS or (ch == "." and pos + 1 < n and text[pos + 1] in _DIGITS):
                pos = self.number(text, pos, number)
            elif ch == '"':
                end = text.find('"', pos + 1)
                if end < 0:
                    self.error("E0103", "unterminated string", self.span(number, col, n + 1),
                               "the string starts here", 'end it with `"` on the same line')
                self.text_direction(text[:end], pos + 1, number, "a string")
                self.emit("STRING", text[pos + 1:end], number, col, end + 2)
                pos = end + 1
            else:
                for p in PUNCT:
                    if text.startswith(p, pos):
                        self.punct(p, number, col)
                        pos += len(p)
                        break
                else:
                    self.error("E0101", f"unexpected character `{ch}`", self.span(number, col, col + 1),
                               "not part of the language",
                               "remove it; comments start with `#`")
        if self.depth == 0 and self.tokens and self.tokens[-1].kind not in ("NEWLINE", "INDENT", "DEDENT"):
            self.emit("NEWLINE", "", number, n + 1, n + 2)

    def number(self, text: str, pos: int, number: int) -> int:
        end = pos
        n = len(text)
        is_float = False
        while end < n and (text[end] in _DIGITS or text[end] == "_"):
            end += 1
        if end < n and text[end] == "." and not (end + 1 < n and text[end + 1] == "."):
            is_float = True
            end += 1
            while end < n and text[end] in _DIGITS:
                end += 1
        if end < n and text[end] in "eE":
            k = end + 1
            if k < n and text[k] in "+-":
                k += 1
            if k < n and text[k] in _DIGITS:
                is_float = True
                end = k
                while end < n and text[end] in _DIGITS:
                    end += 1
        if end < n and _name_start(text[end]):
            hosts = text.lstrip().startswith("devices ") and text[end] == "x"  # `devices 2x cuda[0 1]`
            self.error("E0101", f"unexpected character `{text[end]}` after a number",
                       self.span(number, end + 1, end + 2), "",
                       f"write the number of hosts apart from `x`: `devices {text[pos:end]} x ...`" if hosts
                       else "separate a number from a name with a space or an operator")
        written = text[pos:end].replace("_", "")
        if not is_float and len(written) > MAX_INT_DIGITS:
            self.error("E0105", f"a whole number of {len(written):,} digits", self.span(number, pos + 1, end + 1),
                       "too long a number", f"a whole number has at most {MAX_INT_DIGITS} digits; "
                       "write a size or a count that fits a machine")
        self.emit("FLOAT" if is_float else "INT", written, number, pos + 1, end + 1)
        return end

    def punct(self, p: str, number: int, col: int) -> None:
        self.emit("OP", p, number, col, col + len(p))
        if p in "([":
            self.depth += 1
            self.brackets.append(self.tokens[-1])
        elif p in ")]":
            if not self.depth:
                self.error("E0104", f"`{p}` closes nothing", self.span(number, col, col + 1),
                           "no bracket is open here", "remove it")
            opener = self.brackets.pop()
            if _CLOSER[opener.text] != p:
                self.error("E0104", f"`{p}` closes `{opener.text}`",
                           self.span(number, col, col + 1), f"expected `{_CLOSER[opener.text]}`",
                           f"`{opener.text}` was opened at {opener.span}")
            self.depth -= 1


_CLOSER = {"(": ")", "[": "]"}
_DIGITS = "0123456789"


def _name_start(ch: str) -> bool:
    """Names are ASCII: `²` or `ﬁ` would mean one thing here and another to Python."""
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z")
