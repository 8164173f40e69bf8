"""The command line: `shapescript check | build | run | comms | explain | lsp`."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

from .errors import CompileError, ShapeScriptError, SourceWarning, terminal_lines
from .syntax.lexer import MAX_INT_DIGITS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shapescript", description="The ShapeScript compiler.",
        epilog="A .ss file is code: its `python fn` and `extern fn` import and call the Python functions they "
               "name. check, build, comms, explain and lsp never import them; run calls them (refuse a program "
               "that names any with `run --no-python`).")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="check a program's types and shapes")
    check.add_argument("file")
    check.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                       help="the size of a dim declared without one, e.g. V=65")
    check.add_argument("--devices", help="override the program's devices line, e.g. 'cpu[0 1]'")

    build = sub.add_parser("build", help="lower a program to Python")
    build.add_argument("file")
    build.add_argument("-o", "--output", help="the .py file to write (default: print it)")
    build.add_argument("--standalone", action="store_true",
                       help="write a module that doesn't import shapescript (one device only)")
    build.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                       help="the size of a dim declared without one, e.g. V=65")
    build.add_argument("--devices", help="override the program's devices line")

    run = sub.add_parser("run", help="run a function of the program that takes no arguments",
                         description="Run a function of the program that takes no arguments. A .ss file is "
                                     "code: its `python fn` and `extern fn` import and call the Python "
                                     "functions they name. Run only programs you trust, or refuse those "
                                     "with --no-python.")
    run.add_argument("file")
    run.add_argument("function")
    run.add_argument("--no-python", action="store_true",
                     help="refuse a program that names Python code (`python fn`, `extern fn`; E0701), "
                          "but for shapescript.std's functions")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                       help="the size of a dim declared without one, e.g. V=65")
    run.add_argument("--devices", help="override the program's devices line")

    comms = sub.add_parser("comms", help="show how values lie on the devices and what each line sends")
    comms.add_argument("file")
    comms.add_argument("--devices", help="override the program's devices line, e.g. 'cpu[0 1 2]'")
    comms.add_argument("--batch", type=int, metavar="N", help="the batch size for the shares (default: the "
                       "program's batches(n))")
    comms.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                       help="the size of a dim declared without one, e.g. V=65")
    comms.add_argument("--json", action="store_true", help="print the table as JSON")

    export = sub.add_parser("export", help="export a function for serving, as ONNX or torch.export's .pt2",
                            description="Export a function of tensors and one model (baked in: from "
                                        "--checkpoint, or drawn from --seed) for serving; its other "
                                        "non-tensor arguments are modes, given as eval. A .ss file is code: "
                                        "see `run --no-python`.")
    export.add_argument("file")
    export.add_argument("function")
    export.add_argument("-o", "--output", required=True, help="the file to write: .onnx, or .pt2 with --format torch")
    export.add_argument("--format", choices=("onnx", "torch"), default="onnx")
    export.add_argument("--checkpoint", help="the model's weights: a checkpoint written by ss.save")
    export.add_argument("--seed", type=int, default=0, help="without --checkpoint, the model drawn from this seed")
    export.add_argument("--no-python", action="store_true", help="refuse a program that names Python code (E0701)")
    export.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="the size of a dim declared without one, e.g. V=65")

    explain = sub.add_parser("explain", help="explain an error code, e.g. E0301")
    explain.add_argument("code")

    sub.add_parser("lsp", help="run the language server on stdin/stdout")

    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():  # a warning is one line, as an error is, not Python's two
            warnings.showwarning = _show_warning
            return COMMANDS[args.command](args)
    except CompileError as e:
        say(str(e), sys.stderr)
        return 1
    except (ShapeScriptError, ValueError) as e:
        say(f"error: {e}", sys.stderr)
        return 1
    except FileNotFoundError as e:
        say(f"error: no such file: {e.filename}", sys.stderr)
        return 2
    except BrokenPipeError:  # `shapescript comms f.ss | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush can't fail
        return 141
    except OSError as e:  # a folder given as a file, a file it may not read or write
        say(f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e}", sys.stderr)
        return 2


def say(text: str, stream: TextIO | None = None, end: str = "\n") -> None:
    """Print `text`, which may hold user text (a file's name, a name, a source line), as text: a
    control character in it is shown as its escape, never sent to the terminal to act on."""
    print(terminal_lines(text), end=end, file=stream or sys.stdout)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    # A compiler warning's message is its rendered diagnostic, which says `warning[W....]` itself.
    say(str(message) if issubclass(category, SourceWarning) else f"warning: {message}", sys.stderr)


def dim_sizes(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        name, _, size = pair.partition("=")
        if not name.isidentifier() or not size.isascii() or not size.isdigit() or not size.strip("0"):
            raise ValueError(f"--dim takes NAME=SIZE with a positive whole SIZE, as V=65, not {pair!r}")
        digits = size.lstrip("0")
        if len(digits) > MAX_INT_DIGITS:  # Python refuses to read a few thousand digits
            raise ValueError(f"--dim {name}: a size has at most {MAX_INT_DIGITS} digits, not {len(digits):,}")
        if name in out:
            raise ValueError(f"--dim {name} is given twice")
        out[name] = int(digits)
    return out


def counted(n: int, noun: str) -> str:
    """`1 model`, `2 models`, `0 models`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def cmd_check(args: argparse.Namespace) -> int:
    from .pipeline import compile_program, read_program

    source, file = read_program(Path(args.file))
    checked = compile_program(source, file, args.devices, dim_sizes(args.dim))
    say(f"{file}: ok ({counted(len(checked.fns), 'function')}, {counted(len(checked.models), 'model')}, "
        f"on {checked.device_set})")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from .pipeline import build
    from .runtime.leftovers import write_whole

    text = build(Path(args.file), standalone=args.standalone, devices=args.devices, dims=dim_sizes(args.dim))
    if args.output:
        out = Path(args.output)
        if out.is_dir():
            raise IsADirectoryError(errno.EISDIR, "a folder, not a .py file to write", str(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        # Python reads a module as UTF-8, whatever the locale; never a half-written module, never
        # through a name someone planted beside it
        write_whole(str(out), text.encode("utf-8"))
        say(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .api import load

    prog = load(Path(args.file), devices=args.devices, dims=dim_sizes(args.dim), python=not args.no_python)
    fn = prog.checked.fns.get(args.function)
    if fn is None:
        say(f"error: {args.file} has no function `{args.function}`; it has "
            f"{', '.join(prog.checked.fns) or 'none'}", sys.stderr)
        return 1
    if fn.params:
        say(f"error: `{fn.name}` takes {counted(len(fn.params), 'argument')}; `run` calls functions that take none "
            f"(call it from Python instead)", sys.stderr)
        return 1
    result = getattr(prog, fn.name)()
    if result is not None:
        from .runtime.calls import show
        show(result)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .api import load
    from .exporting import export
    from .runtime.checkpoint import load as restore
    from .runtime.modes import Eval
    from .shapes import dims as D
    from .shapes import value_types as T

    prog = load(Path(args.file), devices="cpu", dims=dim_sizes(args.dim), python=not args.no_python)
    fn = prog.checked.fns.get(args.function)
    if fn is None:
        say(f"error: {args.file} has no function `{args.function}`; it has {', '.join(prog.checked.fns) or 'none'}",
            sys.stderr)
        return 1
    values: list[object] = []
    for p in fn.params:
        if isinstance(p.ty, T.ModelT):
            model = (getattr(prog, p.ty.name) if p.ty.of is None
                     else getattr(prog, p.ty.family)[tuple(D.show(a) for a in p.ty.args)]).init(seed=args.seed)
            if args.checkpoint:
                restore(args.checkpoint, model)
            values.append(model)
        elif p.ty == T.NamedT("Mode"):
            values.append(Eval)
        else:
            values.append(None)  # a tensor: drawn from its type (anything else: export says what it can't take)
    export(getattr(prog, fn.name), *values, path=args.output, format=args.format)
    say(f"wrote {args.output} ({args.format}): `{fn.name}` of {args.file}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .codes import CODES, explain

    try:
        say(explain(args.code), end="")  # W0106's example holds the characters it is about
    except KeyError:
        say(f"error: no error code {args.code}; codes: {', '.join(CODES)}", sys.stderr)
        return 1
    return 0


def cmd_comms(args: argparse.Namespace) -> int:
    from .pipeline import compile_program, read_program
    from .plan.comms_text import report, to_json

    if args.batch is not None and args.batch <= 0:
        raise ValueError(f"--batch takes a positive number of examples, not {args.batch}")
    source, file = read_program(Path(args.file))
    checked = compile_program(source, file, args.devices, dim_sizes(args.dim))
    if args.json:
        import json
        table = to_json(checked, args.batch)
        text = json.dumps(table, indent=2, ensure_ascii=False)
        if terminal_lines(text) != text:  # JSON's own escapes, where text would need them
            text = json.dumps(table, indent=2)
        print(text)
    else:
        say(report(checked, args.batch))
    return 0


def cmd_lsp(args: argparse.Namespace) -> int:
    try:  # pygls is an optional dependency; its 2.x layout is the one the server is written for
        import pygls.lsp.server  # noqa: F401
    except ImportError:
        print("error: the language server needs pygls 2: pip install 'shapescript[editor]'", file=sys.stderr)
        return 2
    from .lsp import serve

    return serve()


COMMANDS = {"check": cmd_check, "build": cmd_build, "run": cmd_run, "explain": cmd_explain, "lsp": cmd_lsp,
            "comms": cmd_comms, "export": cmd_export}

if __name__ == "__main__":
    sys.exit(main())
