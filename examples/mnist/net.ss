# pytorch/examples' MNIST `Net` (mnist/main.py) in ShapeScript: two 3x3 convolutions (1 -> 32 -> 64
# channels), a 2x2 max-pooling, dropout 0.25, a 9216 -> 128 product, dropout 0.5, 128 -> 10, and
# log_softmax with nll_loss; trained with Adadelta. Images are 28x28, one channel, normalized as
# the example does. In f64 here, so that tests/examples/test_mnist_example.py can compare it with
# the same Net written in PyTorch (reference.py beside this file) to 1e-10.

dim Cin = 1
dim C1 = 32
dim C2 = 64
dim Hid = 128
dim Out = 10

data Image:
    img: [Cin 28 28] f64
    label: [] Index[Out]

# torch's default draws for Conv2d and Linear have std 1 / sqrt(3 fan_in): the same stds here, as
# normal draws (the tests copy the same params into both nets).
model Net:
    param conv1: [C1 Cin 3 3] f64 = normal(std=0.19)
    param conv1_bias: [C1] f64 = zeros()
    param conv2: [C2 C1 3 3] f64 = normal(std=0.034)
    param conv2_bias: [C2] f64 = zeros()
    param fc1: [(C2 12 12) Hid] f64 = normal(std=0.006)
    param fc1_bias: [Hid] f64 = zeros()
    param fc2: [Hid Out] f64 = normal(std=0.051)
    param fc2_bias: [Out] f64 = zeros()

fn forward(m: Net, x: [b Cin 28 28] f64, mode: Mode) -> [b Out] f64:
    h = relu(conv2d(x, m.conv1) + m.conv1_bias)                    # [b C1 26 26]
    h = relu(conv2d(h, m.conv2) + m.conv2_bias)                    # [b C2 24 24]
    h = dropout(max_pool2d(h, 2), 0.25, mode)                      # [b C2 12 12]
    h = relu(rearrange(h, b c i j -> b (c i j)) @ m.fc1 + m.fc1_bias)
    return log_softmax(dropout(h, 0.5, mode) @ m.fc2 + m.fc2_bias, over=Out)

fn loss(m: Net, batch: [b] Image, mode: Mode) -> [] f64:
    return nll_loss(forward(m, batch.img, mode), batch.label, over=Out)

fn train_step(mut m: Net, mut opt: Adadelta[Net], batch: [b] Image, mode: Mode) -> [] f64:
    l, g = value_and_grad(loss, m, batch, mode)
    update(mut m, mut opt, g)
    return l

# The example's test(): the share of the images whose likeliest class is their label.
fn accuracy(m: Net, batch: [b] Image) -> [] f64:
    return mean(to(argmax(forward(m, batch.img, Eval()), over=Out) == batch.label, f64))
