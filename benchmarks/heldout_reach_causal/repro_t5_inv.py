"""A T5 (1 encoder and 1 decoder layer, d_model 32, 4 heads, float64, untrained) with its
initialisation scaled by ``initializer_factor`` 3 (clean loss about 20 nats) against the default
1: geodesic inv at rho 0.02 by default against a solve of 100 steps and 4 chains. Found by an
outside check (2026-12-07): with factor 3 the default's chains agree on a lower basin, its reach
estimate reads 1.00, its ball is local, and no warning is given. ``python repro_t5_inv.py >
repro_t5_inv.log``."""

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402 (after the environment it reads)
import transformers  # noqa: E402

import quotientsharp as qs  # noqa: E402

torch.set_num_threads(1)
VOCABULARY = 60


def seq2seq_batch():
    draw = torch.Generator().manual_seed(0)
    source = torch.randint(3, VOCABULARY, (4, 16), generator=draw)
    decoder = torch.randint(3, VOCABULARY, (4, 8), generator=draw)
    labels = torch.randint(3, VOCABULARY, (4, 8), generator=draw)
    return {"input_ids": source, "decoder_input_ids": decoder, "labels": labels}


for factor in (3.0, 1.0):
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCABULARY, d_model=32, d_kv=8, d_ff=64,
                                   num_layers=1, num_decoder_layers=1, num_heads=4,
                                   initializer_factor=factor, attn_implementation="eager")
    model = transformers.T5ForConditionalGeneration(config).double()
    batch = seq2seq_batch()
    options = dict(measure="geodesic", metric="inv", rho=0.02, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default = qs.sharpness(model, [batch], **options)
    warned = any(issubclass(w.category, qs.ReachWarning) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        long = qs.sharpness(model, [batch], n_iter=100, reach={"chains": 4, "min_chains": 4},
                            **options)
    long_warned = any(issubclass(w.category, qs.ReachWarning) for w in caught)
    print(f"initializer_factor {factor}: clean loss {default.clean_losses[0]:.4f}")
    print(f"  default: value {default.value:.6g} reach {default.reach[0]:.4f} chains "
          f"{[round(c, 4) for c in default.chains[0]]} local {default.locality[0]['local']} "
          f"ReachWarning {warned}")
    print(f"  long:    value {long.value:.6g} chains {[round(c, 4) for c in long.chains[0]]} "
          f"ReachWarning {long_warned}")
    print(f"  share of the long solve {default.value / long.value:.4f}", flush=True)
