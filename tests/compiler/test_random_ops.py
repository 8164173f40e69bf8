"""The random ops random_normal, random_uniform, bernoulli, randint and categorical: each call's
draws against torch's own functions on a generator seeded the documented way (splitmix64 of the
mode's seed and the draw's number, written out here), exactly; their statistics over many draws in
f64; that a seed repeats and a mode goes on; the codes of their misuses; and what each does across
the batch axis and under the layout options, as the DeviceTable and the workers' module say.
(tests/several/test_random_ops_several.py runs them on several devices.)"""

from __future__ import annotations

from itertools import accumulate

import pytest
import torch

import shapescript as ss
from shapescript.errors import CompileError
from shapescript.lower.targets import Target
from shapescript.pipeline import compile_program, python_modules
from shapescript.plan.comms import device_table

SOURCE = """dim C = 4
dim V = 6

fn normal_draws(x: [b C] f64, mode: Mode) -> [b C] f64 = random_normal(x, mode, mean=1.5, std=0.5)
fn uniform_draws(x: [b C] f64, mode: Mode) -> [b C] f64 = random_uniform(x, mode, low=-2.0, high=3.0)
fn coin_flips(p: [b C] f64, mode: Mode) -> [b C] bool = bernoulli(p, mode)
fn ints(x: [b C], mode: Mode) -> [b C] i64 = randint(x, mode, low=-3, high=7)
fn picks(probs: [b V] f64, mode: Mode) -> [b] Index[V] = categorical(probs, mode, over=V)
fn picks_along_first(probs: [V b] f64, mode: Mode) -> [b] Index[V] = categorical(probs, mode, over=V)
fn standard(x: [b C] f64, mode: Mode) -> [b C] f64 = random_normal(x, mode)
fn two_draws(x: [b C] f64, mode: Mode) -> [b C] f64 = random_normal(x, mode) * 10.0 + random_uniform(x, mode)
fn fresh(x: [b C] f64) -> [b C] f64 = random_normal(x, Train(seed=3))
"""
F64 = torch.float64
M64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def prog():
    return ss.load(SOURCE, name="draws.ss")


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def generator(seed: int, draw: int) -> torch.Generator:
    """Draw number `draw` of Train(seed=seed): a generator of its own, seeded from the two alone."""
    return torch.Generator().manual_seed(splitmix64((splitmix64(seed) + draw) & M64))


def first_above(weights: list[float], u: float) -> int:
    """categorical's pick, by hand: the first index whose running sum is above u times the total."""
    running = list(accumulate(weights))
    target = u * running[-1]
    return next((k for k, s in enumerate(running) if s > target), len(weights) - 1)


def test_each_op_draws_torchs_numbers_from_the_documented_generator(prog) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 4, generator=g, dtype=F64)
    p = torch.rand(9, 4, generator=g, dtype=F64)
    probs = torch.rand(9, 6, generator=g, dtype=F64) * (torch.rand(9, 6, generator=g) > 0.3)
    probs[:, 0] += 0.1  # no distribution of zeros alone
    assert torch.equal(prog.normal_draws(x, ss.Train(seed=7)), torch.normal(1.5, 0.5, (9, 4), generator=generator(7, 0),
                                                                            dtype=F64))
    # uniform_ rounds low + u * (high - low) once (a fused multiply-add): to an ulp or two of this
    torch.testing.assert_close(prog.uniform_draws(x, ss.Train(seed=7)),
                               torch.rand(9, 4, generator=generator(7, 0), dtype=F64) * 5.0 - 2.0, atol=2e-15, rtol=0)
    assert torch.equal(prog.coin_flips(p, ss.Train(seed=7)), torch.rand(9, 4, generator=generator(7, 0), dtype=F64) < p)
    assert torch.equal(prog.ints(x.float(), ss.Train(seed=7)), torch.randint(-3, 7, (9, 4), generator=generator(7, 0)))
    u = torch.rand(9, generator=generator(7, 0), dtype=F64).tolist()
    expected = torch.tensor([first_above(row, u[i]) for i, row in enumerate(probs.tolist())])
    assert torch.equal(prog.picks(probs, ss.Train(seed=7)), expected)
    assert torch.equal(prog.picks_along_first(probs.T.contiguous(), ss.Train(seed=7)), expected)
    assert prog.picks(probs, ss.Train(seed=7)).dtype == torch.int64


def test_the_draws_have_their_distributions_over_many_values(prog) -> None:
    n = 200_000
    x = torch.zeros(n, 4, dtype=F64)
    normal = prog.normal_draws(x, ss.Train(seed=1))
    assert abs(normal.mean() - 1.5) < 5 * 0.5 / (4 * n) ** 0.5 and abs(normal.std() - 0.5) < 0.005
    uniform = prog.uniform_draws(x, ss.Train(seed=1))
    assert uniform.min() >= -2.0 and uniform.max() < 3.0 and abs(uniform.mean() - 0.5) < 5 * 5 / (12 * 4 * n) ** 0.5
    p = torch.tensor([0.0, 0.2, 0.7, 1.0], dtype=F64).expand(n, 4)
    freq = prog.coin_flips(p, ss.Train(seed=1)).double().mean(0)
    assert freq[0] == 0 and freq[3] == 1 and abs(freq[1] - 0.2) < 0.005 and abs(freq[2] - 0.7) < 0.005
    ints = prog.ints(x.float(), ss.Train(seed=1))
    counts = torch.bincount((ints + 3).flatten(), minlength=10).double() / (4 * n)
    assert ints.min() == -3 and ints.max() == 6 and (counts - 0.1).abs().max() < 0.003
    weights = torch.tensor([0.0, 1.0, 2.0, 0.0, 3.0, 4.0], dtype=F64)  # not normalized, with zeros
    picks = prog.picks(weights.expand(n, 6), ss.Train(seed=1))
    freq = torch.bincount(picks, minlength=6).double() / n
    assert freq[0] == 0 and freq[3] == 0 and (freq - weights / 10).abs().max() < 0.005


def test_a_seed_repeats_its_draws_and_a_mode_goes_on(prog) -> None:
    x = torch.zeros(5, 4, dtype=F64)
    a = prog.standard(x, ss.Train(seed=7))
    assert torch.equal(a, prog.standard(x, ss.Train(seed=7))) and not torch.equal(a, prog.standard(x, ss.Train(seed=8)))
    mode = ss.Train(seed=7)
    first, second = prog.standard(x, mode), prog.standard(x, mode)
    assert torch.equal(first, a) and mode.draws == 2
    assert torch.equal(second, torch.randn(5, 4, generator=generator(7, 1), dtype=F64))
    # One call, two draws in the program's order (normal first); a mode goes on across the ops.
    both = prog.two_draws(x, mode)
    expected = (torch.randn(5, 4, generator=generator(7, 2), dtype=F64) * 10.0
                + torch.rand(5, 4, generator=generator(7, 3), dtype=F64))
    assert torch.equal(both, expected) and mode.draws == 4
    fresh = prog.fresh(x)  # a mode made in the program starts at its first draw at each call
    assert torch.equal(fresh, prog.fresh(x)) and torch.equal(fresh, torch.randn(5, 4, generator=generator(3, 0),
                                                                               dtype=F64))


def test_eval_draws_nothing_and_is_refused_when_the_call_runs(prog) -> None:
    with pytest.raises(ss.DomainError, match=r"draws\.ss:10:54: `random_normal` draws from a Train\(seed=\.\.\.\) mode"):
        prog.standard(torch.zeros(2, 4, dtype=F64), ss.Eval)
    assert ss.Eval.draws == 0


MISUSES = [
    ("fn f(x: [b C], m: Mode) -> [b C] = random_normal(x, 3)", "E0401", "draws from a mode"),
    ("fn f(x: [b C]) -> [b C] = random_normal(x, Eval())", "E0401", "Eval() has no seed"),
    ("fn f(x: [b C] i64, m: Mode) -> [b C] = random_normal(x, m)", "E0308", "takes float tensors"),
    ("fn f(m: Mode) -> [] = random_normal(2.0, m)", "E0401", "takes a tensor"),
    ("fn f(x: [b C], m: Mode) -> [b C] = random_normal(x, m, std=-1.0)", "E0310", "at least 0"),
    ("fn f(x: [b C], m: Mode) -> [b C] = random_normal(x, m, sd=1.0)", "E0206", "sd"),
    ("fn f(x: [b C], m: Mode) -> [b C] = random_uniform(x, m, low=1.0, high=0.5)", "E0310", "an empty range"),
    ("fn f(x: [b C], m: Mode) -> [b C] = random_uniform(x, m, high=x)", "E0401", "is a number"),
    ("fn f(x: [b C] i64, m: Mode) -> [b C] bool = bernoulli(x, m)", "E0308", "`bernoulli`'s p takes float"),
    ("fn f(x: [b C], m: Mode) -> [b C] = bernoulli(x, m)", "E0305", ""),  # a bool, not f32
    ("fn f(x: [b C], m: Mode) -> [b C] i64 = randint(x, m)", "E0206", "needs `high=`"),
    ("fn f(x: [b C], m: Mode) -> [b C] i64 = randint(x, m, high=2.5)", "E0401", "whole number"),
    ("fn f(x: [b C], m: Mode) -> [b C] i64 = randint(x, m, low=4, high=4)", "E0310", "an empty range"),
    ("fn f(x: [b C], m: Mode) -> [b C] i64 = randint(x, m, high=-1)", "E0310", "an empty range"),
    ("fn f(p: [b V], m: Mode) -> [b] Index[V] = categorical(p, m, over=C)", "E0303", "no axis C"),
    ("fn f(p: [b V], m: Mode) -> [b] Index[V] = categorical(p, m)", "E0206", ""),
    ("fn f(p: [b V] i64, m: Mode) -> [b] Index[V] = categorical(p, m, over=V)", "E0308", ""),
    ("fn f(p: [b V], m: Mode) -> [b] Index[C] = categorical(p, m, over=V)", "E0309", ""),  # Index[V]
    ("fn f(x: [b C], m: Mode) -> [b C] = random_normal(mut x, m)", "E0503", ""),
]


@pytest.mark.parametrize("src, code, message", MISUSES)
def test_a_misuse_is_a_compile_error(src: str, code: str, message: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_program("dim C = 4\ndim V = 6\n\n" + src + "\n", "bad.ss")
    assert info.value.codes == [code]
    assert message in info.value.diagnostics[0].message


BATCH = """dim D = 3
dim H = 4
dim V = 5

data Ex:
    x: [D]
    probs: [V]

model Net:
    param w: [D H] = normal(std=0.5)

fn draws(batch: [b] Ex, mode: Mode) -> [b D]:
    n = random_normal(batch.x, mode) + random_uniform(batch.x, mode)
    t = rearrange(to(randint(batch.x, mode, high=3), f32), b d -> d b)
    k = to(bernoulli(sigmoid(batch.x), mode), f32)
    c = to(categorical(batch.probs, mode, over=V), f32)
    return n + k + rearrange(t, d b -> b d) + c

fn transposed(batch: [b] Ex, mode: Mode) -> [D b] = random_normal(rearrange(batch.x, b d -> d b), mode)

fn heads(m: Net, batch: [b] Ex, mode: Mode) -> [b H] = random_normal(batch.x @ m.w, mode, std=0.1)
"""


def _sent(source: str, devices: str) -> list[tuple[int, str, str]]:
    table = device_table(compile_program(source, "t.ss", devices))
    return [(line, item.collective.what, item.collective.op)
            for line, items in sorted(table.lines.items()) for item in items if item.collective]


def _worker(source: str, devices: str) -> str:
    return next(t for t in python_modules(compile_program(source, "t.ss", devices), (Target.WORKER,)) if "def draws(" in t)


def test_across_the_batch_axis_each_device_keeps_its_part_of_the_whole_batchs_draw() -> None:
    """Nothing is sent: the lowering is told where the result's batch axis lies (first, or last after
    a rearrange), and each device draws the whole batch's values and keeps its part's."""
    assert _sent(BATCH, "cpu[0 1]") == []
    worker = _worker(BATCH, "cpu[0 1]")
    for call in ("_rt.random_normal(batch.x, mode, 0, ", "_rt.random_uniform(batch.x, mode, 0, ",
                 "_rt.randint(batch.x, mode, 0, ", "_rt.bernoulli(torch.sigmoid(batch.x), mode, 0, ",
                 "_rt.categorical(batch.probs, mode, 1, 0, ", "_rt.random_normal(batch.x.permute(1, 0), mode, 1, "):
        assert call in worker, call
    assert "_rt.random_normal(batch.x, mode, None, " in _worker(BATCH, "cpu")  # one device: no part to keep


def test_categorical_along_the_batch_axis_is_refused_on_several_devices() -> None:
    source = BATCH + "fn along_b(batch: [b] Ex, mode: Mode) -> [V] Index[b] = " \
                     "categorical(rearrange(batch.probs, b v -> v b), mode, over=b)\n"
    compile_program(source, "t.ss", "cpu")  # one device holds every distribution whole
    with pytest.raises(CompileError) as info:
        compile_program(source, "t.ss", "cpu[0 1]")
    assert info.value.codes == ["E1801"] and "`categorical` across the batch axis" in str(info.value)


def test_under_split_h_a_draw_takes_its_operand_whole() -> None:
    """A value split along H is gathered and drawn whole (every device draws what one device does);
    under `shard params` only the param's pieces are gathered."""
    split = _sent("devices cpu[0 1]\n    split H\n\n" + BATCH, "cpu[0 1]")
    assert [(line, op) for line, _, op in split] == [(24, "all-gather")]
    assert split[0][1] == "a [b H] whole from every device's part along H"
    worker = next(t for t in python_modules(compile_program("devices cpu[0 1]\n    split H\n\n" + BATCH, "t.ss",
                                                            "cpu[0 1]"), (Target.WORKER,)) if "def heads(" in t)
    assert "_rt.random_normal(_rt.gather_heads(" in worker
    sharded = _sent("devices cpu[0 1]\n    shard params\n\n" + BATCH, "cpu[0 1]")
    assert sharded and {op for *_, op in sharded} == {"all-gather"} and all("w" in what for _, what, _ in sharded)
