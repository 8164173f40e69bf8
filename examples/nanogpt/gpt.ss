# nanoGPT's GPT (Karpathy's nanoGPT, model.py) in ShapeScript: token and position embeddings,
# L pre-norm blocks of causal self-attention and an MLP, a final layer norm, and a head tied to the
# token embeddings. A sequence may be shorter than the context T: its n tokens read the first n
# rows of the position embeddings, as nanoGPT's `wpe(arange(t))` does, and n <= T is checked
# (when the call runs, since n is each batch's own). In f64 throughout, so that the tests can
# compare it with the same model written in PyTorch to 1e-6 (reference.py beside this file).
# The sizes are GPT-2 small's; the tests load it with smaller ones.

dim V            # vocab_size, given when loading (nanoGPT pads GPT-2's 50257 to 50304)
dim T = 1024     # block_size: the longest sequence
dim H = 12       # n_head
dim Dh = 64      # each head's width
dim D = H * Dh   # n_embd
dim F = 4 * D    # the MLP's hidden width
dim L = 12       # n_layer
dim M = 4        # gradient_accumulation_steps: micro-batches in one optimizer step
dim New = 500    # max_new_tokens: how many tokens `generate` appends
dim TopK = 10    # top_k: sampling keeps the TopK likeliest tokens (at most V; sample.py's is 200)

data Text:
    tokens: [n] Index[V]      # n <= T tokens
    targets: [n] Index[V]     # each token's successor

data Steps:                   # one optimizer step's sequences: row k of each is micro-batch k's
    tokens: [M n] Index[V]
    targets: [M n] Index[V]

data Prompt:                  # the tokens `generate` goes on from
    tokens: [n] Index[V]

model LayerNorm:
    param weight: [D] f64 = ones()
    param bias: [D] f64 = zeros()

# The residual projections (c_proj) start smaller, 0.02 / sqrt(2 L), as nanoGPT draws them.
model CausalSelfAttention:
    param c_attn: [D (3 H Dh)] f64 = normal(std=0.02)
    param c_attn_bias: [(3 H Dh)] f64 = zeros()
    param c_proj: [(H Dh) D] f64 = normal(std=0.02 / (2 * L) ** 0.5)
    param c_proj_bias: [D] f64 = zeros()

model Mlp:
    param c_fc: [D F] f64 = normal(std=0.02)
    param c_fc_bias: [F] f64 = zeros()
    param c_proj: [F D] f64 = normal(std=0.02 / (2 * L) ** 0.5)
    param c_proj_bias: [D] f64 = zeros()

model Block:
    ln_1: LayerNorm
    attn: CausalSelfAttention
    ln_2: LayerNorm
    mlp: Mlp

model Gpt:
    param wte: [V D] f64 = normal(std=0.02)   # token embeddings, and the head's weights: tied
    param wpe: [T D] f64 = normal(std=0.02)   # position embeddings
    h: [L] Block
    ln_f: LayerNorm

fn normed(m: LayerNorm, x: [b n D] f64) -> [b n D] f64 = layer_norm(x, over=D) * m.weight + m.bias

# Each query position i against each key position j, the future masked out. Dropout where nanoGPT
# has it: the attention weights, each branch's output and the embeddings; 0.1 here (nanoGPT's default
# is 0.0, for pretraining; it suggests 0.1 and more for finetuning). Eval() draws none.
fn attend(q: [b H i Dh] f64, k: [b H j Dh] f64, v: [b H j Dh] f64, mode: Mode) -> [b H i Dh] f64:
    s = einsum(q, k, b h i d, b h j d -> b h i j) * (1.0 / Dh ** 0.5)
    a = dropout(softmax(masked_fill(s, causal(i, j), -1e9), over=j), 0.1, mode)
    return einsum(a, v, b h i j, b h j d -> b h i d)

fn self_attention(m: CausalSelfAttention, x: [b n D] f64, mode: Mode) -> [b n D] f64:
    q, k, v = split(x @ m.c_attn + m.c_attn_bias, b n (3 H Dh) -> b H n Dh)
    y = rearrange(attend(q, k, v, mode), b h n d -> b n (h d))
    return dropout(y @ m.c_proj + m.c_proj_bias, 0.1, mode)

fn mlp(m: Mlp, x: [b n D] f64, mode: Mode) -> [b n D] f64:
    return dropout(gelu(x @ m.c_fc + m.c_fc_bias) @ m.c_proj + m.c_proj_bias, 0.1, mode)

fn logits(m: Gpt, tokens: [b n] Index[V], mode: Mode) -> [b n V] f64:
    x = dropout(embedding(m.wte, tokens) + first(m.wpe, n), 0.1, mode)
    for block in m.h:
        x = x + self_attention(block.attn, normed(block.ln_1, x), mode)
        x = x + mlp(block.mlp, normed(block.ln_2, x), mode)
    return einsum(normed(m.ln_f, x), m.wte, b n d, v d -> b n v)   # lm_head: wte's transpose

# The mean log-loss of the next tokens, over each sequence's own positions (padding left out).
fn loss(m: Gpt, batch: [b] Text, mode: Mode) -> [] f64:
    return cross_entropy(logits(m, batch.tokens, mode), batch.targets, over=V, mask=valid(batch, n))

fn train_step(mut m: Gpt, mut opt: AdamW[Gpt], batch: [b] Text, mode: Mode) -> [] f64:
    l, g = value_and_grad(loss, m, batch, mode)
    update(mut m, mut opt, clip_norm(g, 1.0))   # nanoGPT's grad_clip
    return l

# nanoGPT's estimate_loss, batch by batch: each batch's mean loss, without dropout. A batch of
# sequences of different lengths is padded to its longest, which `loss` leaves out.
fn evaluate(m: Gpt, data: Dataset[Text], log: Sink):
    for batch in data |> batches(8):
        write(log, logs(loss=loss(m, batch, Eval())))

# nanoGPT's training step: M micro-batches, each one's gradients of loss / M added up (on several
# devices each device keeps its own until clip_norm reads them: one all-reduce per step, as DDP's
# no_sync), the norm clipped to 1.0, then one AdamW update. The lr is the optimizer's schedule.
fn micro_loss(m: Gpt, batch: [b] Steps, k: int, mode: Mode) -> [] f64:
    x = take(batch.tokens, k, over=M)
    return cross_entropy(logits(m, x, mode), take(batch.targets, k, over=M), over=V)

fn accumulate_step(mut m: Gpt, mut opt: AdamW[Gpt], batch: [b] Steps, mode: Mode) -> [] f64:
    total, g = value_and_grad(micro_loss, m, batch, 0, mode)
    for k in range(1, M):
        l, gk = value_and_grad(micro_loss, m, batch, k, mode)
        total = total + l
        g = g + gk
    update(mut m, mut opt, clip_norm(g / M, 1.0))
    return total / M

# nanoGPT's generate: New times, crop the context to its last T tokens, take the last position's
# logits over the temperature, keep the TopK likeliest, sample one and append it.
fn last_logits(m: Gpt, tokens: [b n] Index[V]) -> [b V] f64 = take(logits(m, tokens, Eval()), -1, over=n)

fn next_token(m: Gpt, tokens: [b n] Index[V], temperature: float, mode: Mode) -> [b 1] Index[V]:
    scaled = last_logits(m, last(tokens, T, over=n)) / temperature
    top, _ = topk(scaled, TopK, over=V)
    kept = masked_fill(scaled, scaled < take(top, -1, over=TopK), -1e300)   # the rest never drawn
    return repeat(categorical(softmax(kept, over=V), mode, over=V), b -> b o, o=1)

fn generate(m: Gpt, prompt: [b] Prompt, temperature: float, mode: Mode) -> [b (n + New)] Index[V]:
    tokens = prompt.tokens
    for i in range(New):
        tokens = cat(tokens, next_token(m, tokens, temperature, mode), over=n)
    return tokens
