"""Support for tests/compiler/test_fuzz.py: the program generators, and a bug hunter and a meter.

- `rand`: `Rand`, one interface over hypothesis' draw (`DrawRand`) and random.Random (`RandomRand`);
- `mutations`: the seeds (valid programs), the vocabulary, mutants of the seeds and token soups;
- `exprs`, `library`, `grammar`: programs grown from the grammar and the typing rules
  (`ProgramGen`), deep nesting and long chains, and `KINDS`, every generator by name;
- `tricky`: `TRICKY`, programs aimed at corners the random ones rarely reach;
- `hunt`: the bug hunter and the meter, `python -m tests.fuzzing.hunt hunt|stats [N [FIRST]]`.

The tests import these modules as `fuzzing.xxx` (pytest puts tests/ on sys.path).
"""
