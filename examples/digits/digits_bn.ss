# The digits demo with batch_norm and dropout: batch statistics and random masks in Train,
# running statistics and no dropout in Eval. `python examples/digits/train.py --variant bn`.
devices cpu

dim D = 64
dim Hd = 128
dim C = 10

data Digit:
    img: [D]
    label: [] Index[C]

model Stats:
    buffer mean: [Hd] = zeros()
    buffer var: [Hd] = ones()

model Net:
    param w1: [D Hd] = normal(std=0.1)
    norm: Stats
    param gain: [Hd] = ones()
    param shift: [Hd] = zeros()
    param w2: [Hd C] = normal(std=0.1)

python fn digits(part: str) -> Dataset[Digit] = "digits_data.load"

fn forward(m: Net, x: [b D], mode: Mode) -> [b C]:
    h = batch_norm(x @ m.w1, m.norm, mode, over=Hd) * m.gain + m.shift
    return dropout(relu(h), 0.2, mode) @ m.w2

fn loss(m: Net, batch: [b] Digit, mode: Mode) -> []:
    return cross_entropy(forward(m, batch.img, mode), batch.label, over=C)

fn train_step(mut m: Net, mut opt: AdamW[Net], batch: [b] Digit, mode: Mode) -> []:
    l, g = value_and_grad(loss, m, batch, mode)
    update(mut m, mut opt, g)
    return l

fn run(mut m: Net, mut opt: AdamW[Net], data: Dataset[Digit], mode: Mode, log: Sink):
    for batch in data |> shuffle(seed=0) |> batches(64):
        l = train_step(mut m, mut opt, batch, mode)
        write(log, logs(loss=l))

fn epoch(mut m: Net, mut opt: AdamW[Net], mode: Mode, log: Sink):
    run(mut m, mut opt, digits("train"), mode, log)

fn predict(m: Net, x: [b D]) -> [b] Index[C] = argmax(forward(m, x, Eval()), over=C)
