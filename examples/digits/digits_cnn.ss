# The digits demo as a small CNN: each 8x8 image through two 3x3 convolutions (16 and 32 channels,
# padded to keep their size) with a 2x2 max-pooling between them, then one product to the 10
# classes. `python examples/digits/train.py --variant cnn`.
devices cpu

dim D = 64
dim Cin = 1
dim C1 = 16
dim C2 = 32
dim C = 10

data Digit:
    img: [D]
    label: [] Index[C]

# He-style draws: std sqrt(2 / fan_in) for the kernels (fan_in 9 and 144), a smaller one for the product.
model Cnn:
    param k1: [C1 Cin 3 3] = normal(std=0.47)
    param b1: [C1] = zeros()
    param k2: [C2 C1 3 3] = normal(std=0.12)
    param b2: [C2] = zeros()
    param w: [(C2 4 4) C] = normal(std=0.04)
    param bias: [C] = zeros()

python fn digits(part: str) -> Dataset[Digit] = "digits_data.load"

fn forward(m: Cnn, x: [b D]) -> [b C]:
    img = rearrange(x, b (c i j) -> b c i j, c=Cin, i=8)                   # [b Cin 8 8]
    h = max_pool2d(relu(conv2d(img, m.k1, padding=1) + m.b1), 2)           # [b C1 4 4]
    h = relu(conv2d(h, m.k2, padding=1) + m.b2)                            # [b C2 4 4]
    return rearrange(h, b c i j -> b (c i j)) @ m.w + m.bias

fn loss(m: Cnn, batch: [b] Digit) -> []:
    return cross_entropy(forward(m, batch.img), batch.label, over=C)

fn train_step(mut m: Cnn, mut opt: AdamW[Cnn], batch: [b] Digit) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn run(mut m: Cnn, mut opt: AdamW[Cnn], data: Dataset[Digit], log: Sink):
    for batch in data |> shuffle(seed=0) |> batches(64):
        l = train_step(mut m, mut opt, batch)
        write(log, logs(loss=l))

fn epoch(mut m: Cnn, mut opt: AdamW[Cnn], log: Sink):
    run(mut m, mut opt, digits("train"), log)

fn predict(m: Cnn, x: [b D]) -> [b] Index[C] = argmax(forward(m, x), over=C)
