"""The transformer families: ViT and BERT from scratch (:mod:`.vit`, :mod:`.bert`), the
fine-tunes of a ViT (:mod:`.vit_finetune`) and of the real MiniLM (:mod:`.minilm`, with LoRA
adapters: :mod:`.lora`).

The protocol of every family study: model ``i`` draws its hyperparameters from
``numpy.random.default_rng([seed, i])`` (models are never filtered or redrawn), trains on the
first ``train_size_i`` points of a fixed training pool (:mod:`.training`: AdamW, warm-up then
cosine decay, label-smoothed cross-entropy, dropout off; a fine-tuning family starts from one
pretrained body under a fresh head, :mod:`.pretrained`) and is measured (:mod:`.measures`) on
the first ``sharpness_points`` pool points, which lie in every training set (:mod:`.data`).
:mod:`.report` gives Kendall's tau of the generalisation gap (test error - train error, 0-1)
against each measure and each drawn hyperparameter, with bootstrap intervals
(:mod:`.seeds_report`: over several study seeds); :mod:`.settings` defines a study and
:mod:`.run` drives it.
"""
