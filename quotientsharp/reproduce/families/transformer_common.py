"""Training and measuring code shared by the ViT and BERT family studies.

A *family study* (``reproduce vit``, ``reproduce bert``) trains ``M`` small transformers whose
hyperparameters are drawn at random per model, measures each model's generalisation gap
(test error minus train error, 0-1 errors) and its sharpness under several measures on one fixed
set of training points, and reports Kendall's tau between gap and sharpness per measure, as
the paper does for its ImageNet (ViT) and MNLI (BERT) fine-tunes.

Protocol, shared by both families:

- a fixed *training pool* and a fixed *test set* (the family's data); model ``i`` trains on the
  first ``train_size_i`` points of the pool. The sharpness points are the first
  ``sharpness_points`` points of the pool, so they lie in every model's training set;
- the hyperparameters of model ``i`` are drawn from ``numpy.random.default_rng([seed, i])``:
  they depend only on the study seed and the index, so a resumed or partial run draws the same
  ones (no seed picking: models are never filtered or redrawn);
- training: AdamW, batch size ``batch_size``, linear warm-up over the first 5% of the steps then
  cosine decay to zero, cross-entropy with label smoothing, dropout off; the initialisation and
  the order of the minibatches come from ``torch.manual_seed(init_seed_i)``;
- sharpness: every measure of :data:`FAMILY_MEASURES` on the same batches, through
  :func:`quotientsharp.sharpness` with ``seed=0`` (deterministic ascent from ``xi = 0``).

Fine-tuning families (``reproduce minilm``, ``reproduce vit-finetune``) follow the same
protocol from one common pretrained start (:class:`PretrainedStart`: MiniLM from its package,
or a small ViT pretrained once and cached in the results folder) under a fresh head seeded by
``init_seed_i``; they also draw the batch size and the warm-up fraction per model and measure
geodesic sharpness at several Gram relaxations ``eps`` (:func:`eps_sweep_measures`). Every
family reports its taus with percentile bootstrap intervals and the confound taus of the gap
against each drawn hyperparameter (:func:`confound_rows`).

Everything runs with ``torch.set_num_threads(threads)`` (1 by default: these models are tiny
and several threads only add synchronisation), on the CPU unless ``--device`` says otherwise.

The code lives in one module per stage of the protocol (this module only describes it):

- :mod:`~quotientsharp.reproduce.families.data`: the training pool, the test set and the fixed
  sharpness batches;
- :mod:`~quotientsharp.reproduce.families.training`: hyperparameter draws, training, evaluation;
- :mod:`~quotientsharp.reproduce.families.measures`: the measures and their radii, run on one
  model;
- :mod:`~quotientsharp.reproduce.families.settings`: what defines a study, its variants and its
  command-line options;
- :mod:`~quotientsharp.reproduce.families.pretrained`: a pretrained body under a fresh head,
  and a pretraining cached in the results folder;
- :mod:`~quotientsharp.reproduce.families.report`: CSV columns, Kendall taus, the page data;
- :mod:`~quotientsharp.reproduce.families.run`: the study driver and its command-line entry.
"""
