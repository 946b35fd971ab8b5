"""Small models that several test modules share."""

import torch
from torch import nn

import quotientsharp as qs


class ReLUNeuronQuotient(qs.SymmetryQuotient):
    """The tutorial's positive rescaling of a ReLU unit ``(w_in, w_out) -> (g w_in, w_out / g)``
    with the scale-invariant metric; generic defaults for everything else."""

    name = "relu-neuron"
    point_ndims = (1, 1)

    def inner(self, x, u, v):
        return ((u[0] * v[0]).sum(-1) / x[0].square().sum(-1)
                + (u[1] * v[1]).sum(-1) / x[1].square().sum(-1))

    def vertical(self, x, a):
        return a * x[0], -a * x[1]

    def act(self, x, g):
        return g * x[0], x[1] / g

    def algebra_shape(self, x):
        return (1,)


def tiny_bert(seed: int, positions: int = 16, dtype: torch.dtype = torch.float32):
    """A one-layer BERT classifier (hidden 16, 2 heads, vocabulary 30, 3 labels, weights of
    scale 0.3 so that the heads matter), drawn from ``torch.manual_seed(seed)``, in eval mode;
    needs transformers."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=30,
                                     max_position_embeddings=positions, num_labels=3,
                                     attn_implementation="eager", initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).to(dtype).eval()


def tiny_bart(vocab_size: int, positions: int, dtype: torch.dtype = torch.float32):
    """A sequence-to-sequence BART (one encoder and one decoder layer, d_model 16, 2 heads)
    drawn from ``torch.manual_seed(0)``, in eval mode; needs transformers."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=vocab_size, d_model=16, encoder_layers=1,
                                     decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=positions,
                                     attn_implementation="eager")
    return transformers.BartForConditionalGeneration(config).to(dtype).eval()


def tiny_bert_classifier():
    """A float64 one-layer BERT classifier (hidden 16, 2 heads, vocabulary 30, 3 labels) whose
    query weight holds zeros (they must stay fixed, never 0 / 0); needs transformers."""
    model = tiny_bert(0, positions=8, dtype=torch.float64).train()
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.query.weight[0, :4] = 0.0
    return model


class Factored(nn.Module):
    """``x (left right)^T``: one GL(2) pair of a 5 x 2 and a 2 x 4 factor, float64, seeded."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.left = nn.Parameter(torch.randn(5, 2, generator=generator, dtype=torch.float64))
        self.right = nn.Parameter(torch.randn(2, 4, generator=generator, dtype=torch.float64))

    def forward(self, x):
        return x @ (self.left @ self.right).T


def lora_mlp(seed: int = 0, r: int = 3, random: bool = True, dtype=torch.float64,
             widths: tuple[int, int, int, int] = (6, 12, 10, 3), head_bias: bool = True):
    """An MLP ``widths[0] -> widths[1] -> widths[2] -> widths[3]`` (tanh) with PEFT LoRA
    adapters of rank ``r`` on its two hidden layers and a trainable head; ``random``: adapters
    drawn at scale 1/2 (seed ``seed + 100``), else PEFT's start (``B = 0``). Needs peft."""
    import peft

    torch.manual_seed(seed)
    d, first, second, out = widths
    base = nn.Sequential(nn.Linear(d, first), nn.Tanh(), nn.Linear(first, second), nn.Tanh(),
                         nn.Linear(second, out, bias=head_bias)).to(dtype)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, target_modules=["0", "2"],
                                                      modules_to_save=["4"]))
    return randomize_adapters(model, seed + 100) if random else model


def randomize_adapters(model, seed: int, scale: float = 0.5):
    """``model`` with every LoRA factor drawn as ``scale`` times a standard Gaussian from
    ``torch.Generator().manual_seed(seed)``, in the order of ``named_parameters``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.copy_(scale * torch.randn(tensor.shape, generator=generator,
                                                 dtype=tensor.dtype))
    return model
