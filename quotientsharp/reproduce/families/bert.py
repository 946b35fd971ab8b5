"""``quotientsharp reproduce bert``: sharpness vs generalisation on a family of small BERTs.

The paper's MNLI study scaled down to CPU, offline: 32 small ``transformers`` BERTs trained from
scratch on a generated task that needs attention (label 1 if token ``A`` comes before ``B``,
flipped with probability 0.1), measured as in ``reproduce vit`` (``docs/results/bert.md`` gives
every setting). About 18 s of one core per model; ``--quick``: 6 models. Outputs as for
``reproduce vit``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from quotientsharp.reproduce.config import FamilyConfig
from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.run import run_family_study
from quotientsharp.reproduce.families.settings import FamilySettings, FamilyStudy
from quotientsharp.reproduce.families.sizes import BERT_SIZES
from quotientsharp.reproduce.families.training import HyperparameterSpace

HELP = ("small BERTs on a generated 'A before B' task: Kendall tau of sharpness vs "
        "generalisation gap")
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "the generalisation gap"

#: The paper's Kendall taus on MNLI (35 BERT-base fine-tunes), relative flatness included.
PAPER = {"adaptive": 0.06, "geodesic_inv": 0.28, "geodesic_mix": 0.38,
         "relative_flatness": -0.09}
PAPER_SETTING = "MNLI, 35 BERT-base fine-tunes, 1024 train points in batches of 128"

VOCABULARY_SIZE = 50
SEQUENCE_LENGTH = 16
PAD, CLS, TOKEN_A, TOKEN_B, FIRST_FILLER = 0, 1, 2, 3, 4
LABEL_NOISE = 0.1
POOL_SIZE, TEST_SIZE = 2048, 1024
DATA_SEED = 0

MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": VOCABULARY_SIZE, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 64,
    "max_position_embeddings": SEQUENCE_LENGTH, "type_vocab_size": 1,
    "pad_token_id": PAD, "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0, "attn_implementation": "eager"}
RHOS = {"adaptive": 0.1, "worst_case": 0.02, "inv": 0.1, "mix": 0.02}

FULL = FamilySettings(
    models=BERT_SIZES.full_models,
    space=HyperparameterSpace(learning_rate=(5e-4, 5e-3), weight_decay=(1e-4, 1e-1),
                              epochs=(15, 40), label_smoothing=(0.0, 0.2),
                              train_size=(256, 1536)),
    train_batch_size=64, sharpness_points=256, sharpness_batch_size=64, n_iter=20)
QUICK = replace(FULL, models=BERT_SIZES.quick_models,
                space=replace(FULL.space, epochs=(4, 8), train_size=(256, 400)),
                sharpness_points=64, sharpness_batch_size=32, n_iter=BERT_SIZES.quick_n_iter)


def generate_sequences(count: int, generator, noise: float = LABEL_NOISE):
    """``count`` sequences of the "A before B" task: ``input_ids`` ``shape=[count, 16]``, the
    labels flipped with probability ``noise`` and the clean labels ``shape=[count]``."""
    import torch

    if not 0.0 <= noise <= 0.5:
        raise ValueError(f"noise must be in [0, 0.5], got {noise!r}")
    ids = torch.randint(FIRST_FILLER, VOCABULARY_SIZE, (count, SEQUENCE_LENGTH),
                        generator=generator)
    ids[:, 0] = CLS
    # two distinct positions among 1..15: the first two entries of a random permutation
    keys = torch.rand(count, SEQUENCE_LENGTH - 1, generator=generator)
    positions = keys.argsort(dim=1)[:, :2] + 1
    rows = torch.arange(count)
    ids[rows, positions[:, 0]] = TOKEN_A
    ids[rows, positions[:, 1]] = TOKEN_B
    clean = (positions[:, 0] < positions[:, 1]).long()
    flips = torch.rand(count, generator=generator) < noise
    return ids, torch.where(flips, 1 - clean, clean), clean


def load_data(quick: bool = False) -> ClassificationData:
    """Training pool (2048) and test set (1024) of the task, ``torch.Generator`` seed 0."""
    import torch

    generator = torch.Generator().manual_seed(DATA_SEED)
    train_ids, train_labels, _ = generate_sequences(POOL_SIZE, generator)
    test_ids, test_labels, _ = generate_sequences(TEST_SIZE, generator)
    return ClassificationData(
        train_inputs={"input_ids": train_ids, "attention_mask": torch.ones_like(train_ids)},
        train_labels=train_labels,
        test_inputs={"input_ids": test_ids, "attention_mask": torch.ones_like(test_ids)},
        test_labels=test_labels, num_labels=2,
        description={"task": "label 1 iff token A (id 2) comes before token B (id 3)",
                     "vocabulary": f"{VOCABULARY_SIZE} tokens: 0 pad (unused), 1 [CLS], 2 A, "
                                   f"3 B, 4..{VOCABULARY_SIZE - 1} fillers",
                     "sequence": f"length {SEQUENCE_LENGTH}: [CLS], then one A and one B at "
                                 "two distinct uniform positions among 1..15, fillers uniform "
                                 "with repetition elsewhere",
                     "label_noise": f"each label flipped with p = {LABEL_NOISE}, training pool "
                                    "and test set alike",
                     "generator_seed": DATA_SEED, "pool_size": POOL_SIZE,
                     "test_size": TEST_SIZE})


def build_model(num_labels: int):
    """A fresh ``BertForSequenceClassification`` of :data:`MODEL_CONFIG` (seed torch first)."""
    from transformers import BertConfig, BertForSequenceClassification

    # num_labels: transformers 5's typed config signature leaves PretrainedConfig's out
    return BertForSequenceClassification(BertConfig(num_labels=num_labels, **MODEL_CONFIG))  # type: ignore[call-arg]


DESCRIPTION = f"""
A family of small BERTs (`transformers.BertForSequenceClassification`, eager attention) trained
from scratch on a generated task: sequences of {SEQUENCE_LENGTH} tokens from a vocabulary of
{VOCABULARY_SIZE} (`[CLS]`, then one `A` and one `B` at two random positions, uniform filler
tokens elsewhere); the label says whether `A` comes before `B`, flipped with probability
{LABEL_NOISE} (training pool and test set alike, so the best possible test error is
{LABEL_NOISE}). Training pool: {POOL_SIZE} sequences; test set: {TEST_SIZE}; generator seed
{DATA_SEED}. Each model trains on the first n sequences of the pool, n drawn per model.
"""

STUDY = FamilyStudy(
    name="bert", title="BERT family on a generated order task (`reproduce bert`)",
    load_data=load_data, build_model=build_model, model_config=MODEL_CONFIG, full=FULL,
    quick=QUICK, paper=PAPER, paper_setting=PAPER_SETTING, rhos=RHOS, description=DESCRIPTION)


def run(config: FamilyConfig) -> int:
    """Run the study as ``config`` says; the exit status (:func:`.run.run_family_study`)."""
    return run_family_study(STUDY, config)
