# A GPT-style character language model: the chapter's attention (D = 768, H = 12, Dh = 64) in
# blocks of attention and feed-forward layers. The demo loads it with smaller dims (train.py).

dim V            # the vocabulary's size, given when the program is loaded
dim T = 64       # the context: characters seen at once
dim D = 768
dim H = 12
dim Dh = 64
dim F = 3072     # the feed-forward layer's width, 4 D
dim L = 12       # blocks

data Text:
    tokens: [T] Index[V]
    targets: [T] Index[V]      # each token's successor

model Norm:
    param gain: [D] = ones()
    param bias: [D] = zeros()

model Attn:
    param w_qkv: [D (3 H Dh)] = normal(std=0.02)
    param w_o: [(H Dh) D] = normal(std=0.02)

model Mlp:
    param w1: [D F] = normal(std=0.02)
    param b1: [F] = zeros()
    param w2: [F D] = normal(std=0.02)
    param b2: [D] = zeros()

model Block:
    ln1: Norm
    attn: Attn
    ln2: Norm
    mlp: Mlp

model Gpt:
    param emb: [V D] = normal(std=0.02)
    param pos: [T D] = normal(std=0.01)
    blocks: [L] Block
    ln_f: Norm
    param head: [D V] = normal(std=0.02)

fn normed(m: Norm, x: [b n D]) -> [b n D] = layer_norm(x, over=D) * m.gain + m.bias

# Scores of each query position i against each key position j, the future masked out.
fn attention(q: [b H i Dh], k: [b H j Dh], v: [b H j Dh]) -> [b H i Dh]:
    s = einsum(q, k, b h i d, b h j d -> b h i j) * (1.0 / Dh ** 0.5)
    a = softmax(masked_fill(s, causal(i, j), -1e9), over=j)
    return einsum(a, v, b h i j, b h j d -> b h i d)

fn attend(m: Attn, x: [b n D]) -> [b n D]:
    q, k, v = split(x @ m.w_qkv, b n (3 H Dh) -> b H n Dh)
    return rearrange(attention(q, k, v), b h n d -> b n (h d)) @ m.w_o

fn feed(m: Mlp, x: [b n D]) -> [b n D] = gelu(x @ m.w1 + m.b1) @ m.w2 + m.b2

fn logits(m: Gpt, tokens: [b T] Index[V], mode: Mode) -> [b T V]:
    x = embedding(m.emb, tokens) + m.pos
    for block in m.blocks:
        x = x + dropout(attend(block.attn, normed(block.ln1, x)), 0.1, mode)
        x = x + dropout(feed(block.mlp, normed(block.ln2, x)), 0.1, mode)
    return normed(m.ln_f, x) @ m.head

fn loss(m: Gpt, batch: [b] Text, mode: Mode) -> []:
    return cross_entropy(logits(m, batch.tokens, mode), batch.targets, over=V)

fn train_step(mut m: Gpt, mut opt: AdamW[Gpt], batch: [b] Text, mode: Mode) -> []:
    l, g = value_and_grad(loss, m, batch, mode)
    update(mut m, mut opt, clip_norm(g, 1.0))
    return l

fn train(mut m: Gpt, mut opt: AdamW[Gpt], data: Dataset[Text], mode: Mode, log: Sink):
    for batch in data |> shuffle(seed=0) |> batches(32):
        l = train_step(mut m, mut opt, batch, mode)
        write(log, logs(loss=l))

fn evaluate(m: Gpt, data: Dataset[Text]) -> []:
    total = to(0.0, f32)
    count = 0
    for batch in data |> batches(64):
        total = total + loss(m, batch, Eval())
        count = count + 1
    return total / count
