# The README's example: a two-layer MLP on 28x28 digits.
devices cuda[0 1 2]

dim D = 784
dim Hd = 256
dim C = 10

data Digit:
    img: [D]
    label: [] Index[C]

model Mlp:
    param w1: [D Hd] = normal(std=0.02)
    param w2: [Hd C] = normal(std=0.02)

fn forward(m: Mlp, x: [b D]) -> [b C]:
    return relu(x @ m.w1) @ m.w2

fn loss(m: Mlp, batch: [b] Digit) -> []:
    return cross_entropy(forward(m, batch.img), batch.label, over=C)

fn train_step(mut m: Mlp, mut opt: AdamW[Mlp], batch: [b] Digit) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn run(mut m: Mlp, mut opt: AdamW[Mlp], data: Dataset[Digit], log: Sink):
    for batch in data |> shuffle(seed=0) |> batches(64):
        l = train_step(mut m, mut opt, batch)
        write(log, logs(loss=l))
