"""The bug hunter and the meter (neither is a test), from the repository's root:

    python -m tests.fuzzing.hunt stats [N [FIRST]]  # share of programs of each kind that compile
    python -m tests.fuzzing.hunt hunt [N [FIRST]]   # N programs of each kind (seeds FIRST...); internal
                                                    # errors grouped by where they are raised, each
                                                    # with a program made minimal by delta debugging

(`python tests/compiler/test_fuzz.py stats|hunt ...` does the same.)
"""

from __future__ import annotations

import re
import sys
import traceback
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for _path in (TESTS.parent, TESTS, TESTS / "compiler"):  # the package, tests/ for `fuzzing`, and `test_fuzz`
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from test_fuzz import CompilerRecursion, compile_program, outcome  # noqa: E402

from fuzzing.grammar import KINDS  # noqa: E402
from fuzzing.rand import RandomRand  # noqa: E402


def bug_key(exc: BaseException) -> str:
    """Where an internal error comes from: the innermost frame in the compiler (or the assertion)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "shapescript" in f.filename and "tests" not in f.filename]
    if ours:  # the innermost two frames in the compiler
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} ({f.name})" for f in reversed(ours[-2:]))
        return f"{type(exc).__name__} at {where}"
    f = frames[-1]
    detail = ""
    if isinstance(exc, AssertionError):  # one of our checks: its kind, and the code it is about
        text = str(exc)
        code = re.match(r"E\d{4}", text)
        detail = " " + (code.group() + " " if code else "") + re.sub(r"`[^`]*`|'[^']*'|\[[^]]*\]|\d+", "_",
                                                                       text.split("\n")[0])[-60:]
    elif isinstance(exc, CompilerRecursion):
        detail = " " + str(exc)
    elif isinstance(exc, SyntaxError):
        detail = " " + re.sub(r"'[^']*'|\(.*\)", "_", str(exc))[:60]
    return f"{type(exc).__name__} at {Path(f.filename).name}:{f.lineno} ({f.name}){detail}"


def _fails_same(src: str, key: str) -> bool:
    try:
        compile_program(src)
    except Exception as e:
        return bug_key(e) == key
    return False


def minimize(src: str, key: str) -> str:
    """Delta debugging by lines, then tokens, then characters, keeping the same failure."""
    def pass_over(units: list[str], joiner: str) -> list[str]:
        n = max(1, len(units) // 2)
        while n >= 1:
            k, changed = 0, False
            while k < len(units):
                cand = units[:k] + units[k + n:]
                if cand != units and _fails_same(joiner.join(cand), key):
                    units, changed = cand, True
                else:
                    k += n
            if not changed:
                n //= 2
        return units

    src = "\n".join(pass_over(src.split("\n"), "\n"))
    toks = re.findall(r"\s+|\w+|\S", src)
    src = "".join(pass_over(toks, ""))
    return "".join(pass_over(list(src), ""))


def hunt(n: int, start: int = 0) -> None:
    found: dict[str, tuple[str, BaseException]] = {}
    for kind, make in KINDS.items():
        for seed in range(start, start + n):
            src = make(RandomRand(seed * 7919 + len(kind)))
            try:
                compile_program(src)
            except Exception as e:
                key = bug_key(e)
                if key not in found or len(src) < len(found[key][0]):
                    found[key] = (src, e)
    print(f"{len(found)} distinct internal errors\n")
    for key, (src, _) in sorted(found.items()):
        small = minimize(src, key)
        try:
            compile_program(small)
        except Exception as e:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
        print("=" * 100)
        print(key)
        print("--- program:")
        print(repr(small))
        print(small)
        print("--- traceback (last frames):")
        print(tb)


def stats(n: int, start: int = 0) -> None:
    for kind, make in KINDS.items():
        counts = Counter(outcome(make(RandomRand(seed))) for seed in range(start, start + n))
        share = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in counts.most_common())
        print(f"{kind:15} {share}")


def main(argv: list[str]) -> None:
    cmd = argv[0] if len(argv) > 0 else "stats"
    count = int(argv[1]) if len(argv) > 1 else 1000
    first = int(argv[2]) if len(argv) > 2 else 0
    {"stats": stats, "hunt": hunt}[cmd](count, first)


if __name__ == "__main__":
    main(sys.argv[1:])
