"""Tiny causal LMs / ViT built offline, trained briefly on generated data."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402 (after the environment it reads)
import transformers  # noqa: E402

torch.set_num_threads(1)

V = 32  # vocabulary
T = 16  # tokens per sequence
B = 8  # sequences per batch
PERM = torch.randperm(V, generator=torch.Generator().manual_seed(7))


def grammar_batch(gen, n=B, t=T):
    """Synthetic grammar: x_{k+1} = PERM[x_k] with prob 0.85, else uniform."""
    x = torch.zeros(n, t, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (n,), generator=gen)
    x[:, 1] = torch.randint(0, V, (n,), generator=gen)
    for k in range(2, t):
        det = PERM[x[:, k - 1]]
        rnd = torch.randint(0, V, (n,), generator=gen)
        use = torch.rand(n, generator=gen) < 0.85
        x[:, k] = torch.where(use, det, rnd)
    labels = torch.full_like(x, -100)
    labels[:, :-1] = x[:, 1:]
    return {"input_ids": x, "labels": labels}


def build(name, seed=0):
    torch.manual_seed(seed)
    if name == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=V,
            n_positions=32,
            n_embd=64,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            attn_implementation="eager",
        )
        return transformers.GPT2LMHeadModel(cfg)
    if name == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=V,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            attn_implementation="eager",
        )
        return transformers.LlamaForCausalLM(cfg)
    if name == "vit":
        cfg = transformers.ViTConfig(
            image_size=16,
            patch_size=4,
            num_channels=1,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=4,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        return transformers.ViTForImageClassification(cfg)
    raise ValueError(name)


def image_batch(gen, n=B):
    """4 classes: a bright bar in one of 4 quadrant orientations + noise."""
    y = torch.randint(0, 4, (n,), generator=gen)
    x = 1.6 * torch.randn(n, 1, 16, 16, generator=gen)
    for i in range(n):
        c = int(y[i])
        if c == 0:
            x[i, 0, 4:6, :] += 1.0
        elif c == 1:
            x[i, 0, :, 4:6] += 1.0
        elif c == 2:
            x[i, 0, 10:12, :] += 1.0
        else:
            x[i, 0, :, 10:12] += 1.0
    return {"pixel_values": x, "labels": y}


def make_batch(name, gen, n=B):
    return image_batch(gen, n) if name == "vit" else grammar_batch(gen, n)


def loss_of(model, batch):
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    logits = out.logits
    y = batch["labels"]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100
    )


def trained(name, dtype, steps=300, seed=0):
    model = build(name, seed).to(dtype)
    gen = torch.Generator().manual_seed(100 + seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    log = []
    for _ in range(steps):
        b = make_batch(name, gen, 32)
        if dtype != torch.float32:
            b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in b.items()}
        loss = loss_of(model, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append(float(loss.detach()))
    model.eval()
    egen = torch.Generator().manual_seed(999)
    batches = []
    for _ in range(2):
        b = make_batch(name, egen)
        b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in b.items()}
        batches.append(b)
    with torch.no_grad():
        ev = [float(loss_of(model, b)) for b in batches]
    return model, batches, log, ev
