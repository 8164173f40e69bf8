# The README's MLP on scikit-learn's 8x8 digits (1,797 images, 64 pixels each, 10 classes).
# `make demo` trains it with examples/digits/train.py.
devices cpu

dim D = 64
dim Hd = 128
dim C = 10

data Digit:
    img: [D]
    label: [] Index[C]

model Mlp:
    param w1: [D Hd] = normal(std=0.1)
    param w2: [Hd C] = normal(std=0.1)

# The data, split into "train" and "test" by digits_data.py (next to this file).
python fn digits(part: str) -> Dataset[Digit] = "digits_data.load"

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

# One pass over the training part.
fn epoch(mut m: Mlp, mut opt: AdamW[Mlp], log: Sink):
    run(mut m, mut opt, digits("train"), log)

fn predict(m: Mlp, x: [b D]) -> [b] Index[C] = argmax(forward(m, x), over=C)
