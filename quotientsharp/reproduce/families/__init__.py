"""The transformer families: ViT and BERT from scratch (:mod:`.vit`, :mod:`.bert`), fine-tunes
of a ViT (:mod:`.vit_finetune`) and of the real MiniLM (:mod:`.minilm`, LoRA: :mod:`.lora`).

Model ``i`` draws its recipe from ``numpy.random.default_rng([seed, i])`` (never filtered or
redrawn), trains on the first ``train_size_i`` pool points and is measured on the first
``sharpness_points``, which lie in every training set; :mod:`.run` drives a study.
"""
