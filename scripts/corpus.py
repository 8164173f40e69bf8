"""What the compiler prints for a corpus of programs, to show that a refactoring changes none of it.

    python scripts/corpus.py dump OUT.json     # with the checkout to measure first on PYTHONPATH
    python scripts/corpus.py diff A.json B.json

The corpus: grammar programs without mistakes (`ProgramGen(mistakes=0)`, fixed seeds), grammar
programs with mistakes (for diagnostics), the examples' .ss files, the programs of tests/programs.py
and the docs' `ss` blocks. Each is compiled with its own devices line and for `cpu`, `cpu[0 1]` and
`cpu[0 1 2]`, and (but the programs with mistakes) with each layout option on the two sets of
several devices (`split H` where the program has a dim H). What is kept for each: the diagnostics'
text where it doesn't compile, else every module it prints (one device, standalone, the debug build
that checks types, or a controller's and a worker's), and on several devices the DeviceTable's
report. A standalone module's inlined run time
(the run time's own source, not generated code) is kept once, under RUN_TIME, so that a change to
the run time's text shows as that one entry. `dump` always reads tests/fuzzing and
tests/programs.py from the checkout this script is in, so two commits are given the same programs.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
GOOD_SEEDS = range(300)
BAD_SEEDS = range(1000, 1300)
DEVICES = (None, "cpu", "cpu[0 1]", "cpu[0 1 2]")
LAYOUTS = (("shard params",), ("split H",), ("shard params", "split H"))
RUN_TIME = "(the run time a standalone module inlines)"


def programs() -> Iterator[tuple[str, str]]:
    """(name, source) of every program of the corpus."""
    sys.path.insert(0, str(HERE / "tests"))
    from fuzzing.grammar import ProgramGen
    from fuzzing.rand import RandomRand
    for seed in GOOD_SEEDS:
        yield f"good-{seed}", ProgramGen(RandomRand(seed), mistakes=0.0).program()
    for seed in BAD_SEEDS:
        yield f"bad-{seed}", ProgramGen(RandomRand(seed), mistakes=0.3).program()
    for path in sorted((HERE / "examples").rglob("*.ss")):
        yield str(path.relative_to(HERE)), path.read_text()
    import programs as P
    for name in sorted(vars(P)):
        value = getattr(P, name)
        if name.isupper() and isinstance(value, str) and ("fn " in value or "dim " in value):
            yield f"programs.{name}", value
    sys.path.insert(0, str(HERE / "tests" / "docs"))
    from test_doc_snippets import all_blocks  # tests/docs/test_doc_snippets.py
    for block in all_blocks():
        if block.tag.startswith("ss"):
            yield f"{block.doc}:{block.line}", block.text


def outputs(source: str, devices: str | None) -> dict[str, str]:
    """What the compiler prints of `source` on `devices` (None: its own devices line)."""
    from shapescript.errors import CompileError
    from shapescript.lower.targets import Target
    from shapescript.pipeline import compile_program, python_module, python_modules
    from shapescript.plan.comms_text import report

    def attempt(what: Callable[[], str]) -> str:
        try:
            return what()
        except CompileError as e:
            return "error:\n" + "\n".join(d.render(source) for d in e.diagnostics)
        except Exception as e:
            return f"internal error: {type(e).__name__}: {e}"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            checked = compile_program(source, "corpus.ss", devices)
        except CompileError as e:
            return {"diagnostics": "\n".join(d.render(source) for d in e.diagnostics)}
        except Exception as e:
            return {"internal error": f"{type(e).__name__}: {e}"}
        out = {"warnings": "\n".join(w.render(source) for w in checked.warnings)}
        if checked.device_set.count > 1:
            targets = (Target.CONTROLLER, Target.WORKER)
            out["modules"] = attempt(lambda: "\n#----\n".join(python_modules(checked, targets)))
            out["debug"] = attempt(lambda: "\n#----\n".join(python_modules(checked, targets, check_types=True)))
            out["device table"] = attempt(lambda: report(checked))
        else:
            out["module"] = attempt(lambda: python_module(checked))
            out["standalone"] = attempt(lambda: without_run_time(python_module(checked, standalone=True)))
            out["debug"] = attempt(lambda: python_module(checked, check_types=True))
        return out


def without_run_time(module: str) -> str:
    """A standalone module with its inlined run time's source (the same for every program) elided."""
    return "\n".join("RUNTIME_SOURCE = ..." if line.startswith("RUNTIME_SOURCE = ") else line
                     for line in module.split("\n"))


def with_layout(source: str, options: tuple[str, ...]) -> str:
    """`source` with its devices line (and its options) replaced by `devices cpu` with `options`."""
    lines, kept, in_devices = source.split("\n"), [], False
    for line in lines:
        if line.startswith("devices "):
            in_devices = True
            continue
        if in_devices and line.strip() in ("shard params",) + tuple(f"split {w}" for w in line.split()[1:2]):
            continue
        in_devices = False
        kept.append(line)
    return "\n".join(["devices cpu", *(f"    {o}" for o in options), *kept])


def dump(path: Path) -> None:
    from shapescript.lower.specs import standalone_prelude
    found: dict[str, dict[str, str]] = {RUN_TIME: {"source": standalone_prelude()}}
    for name, source in programs():
        for devices in DEVICES:
            found[f"{name} @ {devices or 'own'}"] = outputs(source, devices)
        if name.startswith("bad-"):
            continue
        # The layout options on several devices, where the program has a dim H for `split H`.
        heads = "\ndim H" in "\n" + source
        for options in LAYOUTS:
            if heads or not any(o.startswith("split") for o in options):
                for devices in DEVICES[2:]:
                    found[f"{name} @ {devices} {' + '.join(options)}"] = outputs(with_layout(source, options), devices)
    path.write_text(json.dumps(found, indent=1, sort_keys=True))
    errors = sum("diagnostics" in v for v in found.values())
    print(f"{len(found) - 1} compilations ({errors} with diagnostics), and "
          f"the run time standalone modules inline -> {path}")


def diff(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    changed = [k for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]
    for key in changed[:20]:
        import difflib
        was, now = left.get(key, {}), right.get(key, {})
        for part in sorted(set(was) | set(now)):
            if was.get(part) != now.get(part):
                print(f"== {key}: {part}")
                sys.stdout.writelines(difflib.unified_diff((was.get(part) or "").splitlines(True),
                                                           (now.get(part) or "").splitlines(True), n=1))
    print(f"{len(changed)} of {len(set(left) | set(right))} entries differ"
          f"{' (the inlined run time among them)' if RUN_TIME in changed else ''}")
    return 1 if changed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
