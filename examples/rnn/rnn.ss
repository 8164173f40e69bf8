# A GRU and an LSTM, each written once as a loop over the time axis T that carries its state: each
# pass takes step t's inputs (`take`), works out the new state, and writes it into the outputs
# (`put`). The same equations and gate order as torch.nn.GRU and torch.nn.LSTM (one layer, with
# biases, batch first), so tests/examples/test_rnn_example.py compares them with torch's in f64.
# Each sequence brings its initial state: on several devices each device runs its own sequences.

dim T = 6        # steps
dim D = 3        # the input's width
dim Hd = 4       # the state's width

data Seq:
    x: [T D] f64
    h0: [Hd] f64     # the initial state
    c0: [Hd] f64     # the LSTM's initial cell

# The gates' weights side by side, as torch keeps them: GRU's r, z, n; LSTM's i, f, g, o.
model Gru:
    param wi: [D (3 Hd)] f64 = normal(std=0.5)
    param wh: [Hd (3 Hd)] f64 = normal(std=0.5)
    param bi: [(3 Hd)] f64 = normal(std=0.1)
    param bh: [(3 Hd)] f64 = normal(std=0.1)

model Lstm:
    param wi: [D (4 Hd)] f64 = normal(std=0.5)
    param wh: [Hd (4 Hd)] f64 = normal(std=0.5)
    param bi: [(4 Hd)] f64 = normal(std=0.1)
    param bh: [(4 Hd)] f64 = normal(std=0.1)

fn gru_cell(m: Gru, x: [b D] f64, h: [b Hd] f64) -> [b Hd] f64:
    xr, xz, xn = split(x @ m.wi + m.bi, b (3 h) -> b h)
    hr, hz, hn = split(h @ m.wh + m.bh, b (3 h) -> b h)
    r = sigmoid(xr + hr)
    z = sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    return (1.0 - z) * n + z * h

fn gru(m: Gru, batch: [b] Seq) -> [b T Hd] f64:
    h = batch.h0
    outs = repeat(h, b h -> b t h, t=T)            # every step's state, each written in turn
    for t in range(T):
        h = gru_cell(m, take(batch.x, t, over=T), h)
        outs = put(outs, t, h, over=T)
    return outs

fn lstm(m: Lstm, batch: [b] Seq) -> [b T Hd] f64:
    h = batch.h0
    c = batch.c0
    outs = repeat(h, b h -> b t h, t=T)
    for t in range(T):
        i, f, g, o = split(take(batch.x, t, over=T) @ m.wi + m.bi + h @ m.wh + m.bh, b (4 h) -> b h)
        c = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h = sigmoid(o) * tanh(c)
        outs = put(outs, t, h, over=T)
    return outs

fn gru_loss(m: Gru, batch: [b] Seq) -> [] f64 = mean(gru(m, batch) ** 2)

fn lstm_loss(m: Lstm, batch: [b] Seq) -> [] f64 = mean(lstm(m, batch) ** 2)

fn gru_step(mut m: Gru, mut opt: Sgd[Gru], batch: [b] Seq) -> [] f64:
    l, g = value_and_grad(gru_loss, m, batch)
    update(mut m, mut opt, g)
    return l

fn lstm_step(mut m: Lstm, mut opt: Sgd[Lstm], batch: [b] Seq) -> [] f64:
    l, g = value_and_grad(lstm_loss, m, batch)
    update(mut m, mut opt, g)
    return l
