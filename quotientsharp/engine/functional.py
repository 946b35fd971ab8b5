"""Model stage: the loss of a model at given parameters, never touching it
(:class:`FunctionalModel`, by :func:`torch.func.functional_call` on perturbed clones), and the
diagnoses of a forward or loss that fails (:func:`clean_loss_cause`,
:func:`out_of_range_lookup`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.engine.batches import (
    IGNORE_INDEX,
    Batch,
    LossFunction,
    check_keywords,
    compute_loss,
    cross_entropy,
    few_names,
    forward_keywords,
    output_tensor,
    resolve_loss,
)
from quotientsharp.engine.touched_rows import (
    TableLookup,
    TableRecorder,
    embedding_tables,
    looked_up,
)


class _DenseGradient(torch.autograd.Function):
    """The identity (a copy) whose backward makes a sparse gradient dense: the solver's
    ``_foreach`` operations have no sparse kernel (``nn.Embedding(sparse=True)``)."""

    @staticmethod
    def forward(ctx: object, tensor: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return tensor.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return grad.to_dense() if grad.layout != torch.strided else grad


def _check_float_mask(label: str, mask: torch.Tensor) -> None:
    """Raise naming the batch and the mask (``label``) if a floating attention mask holds a
    NaN, a ``+inf`` or (in a 2-D mask of 1 = token, 0 = padding) a ``-inf``: transformers reads
    a NaN as "attend", so a corrupt mask measured the value of an all-ones one. A ``-inf`` stays
    allowed in an additive mask of more dimensions, where it means "masked"."""
    bad = mask.isnan() | mask.isposinf()
    if mask.dim() <= 2:
        bad |= mask.isneginf()
    if bool(bad.any()):
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{label} holds {float(mask[where])} at {where}; a floating mask "
                         "must be finite (a 2-D one: 1 a token, 0 padding)")


class FunctionalModel:
    """The loss of a model at given parameter values; the model's tensors are never used.

    Parameters
    ----------
    model
        The network (only read: its parameters are shared, never handed to the forward,
        and its buffers are cloned once).
    loss
        ``None``/``"cross_entropy"``, ``"mse"``, a callable ``loss(output, target)``, or the
        pair ``(loss function, whether it is a built-in taking logits)``.
    geometry_dtype
        The dtype of the geometry, gradients and perturbations; ``None``: float64 if any
        trainable parameter is float64, else float32.
    """

    def __init__(self, model: nn.Module,
                 loss: tuple[LossFunction, bool] | str | LossFunction | None = None,
                 geometry_dtype: torch.dtype | None = None) -> None:
        self.model = model
        if loss is None or isinstance(loss, str) or callable(loss):
            function, _, builtin = resolve_loss(loss)
            loss = (function, builtin)
        self.loss_function, self.builtin_loss = loss
        named = dict(model.named_parameters())
        if not named:
            raise ValueError("the model has no parameters")
        self.dtypes = {n: p.dtype for n, p in named.items()}
        self.trainable = [n for n, p in named.items() if p.requires_grad]
        #: parameters with ``requires_grad=False``: never perturbed (``SharpnessResult.frozen``)
        self.frozen = [n for n, p in named.items() if not p.requires_grad]
        if not self.trainable:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        for name, tensor in named.items():
            if not tensor.is_floating_point():
                raise TypeError(f"parameter {name!r} has non-floating dtype {tensor.dtype}")
        meta = [n for n, t in [*named.items(), *model.named_buffers()] if t.is_meta]
        if meta:
            # torch's own message ("Cannot copy out of meta tensor; no data!") names nothing
            raise ValueError(f"the model's tensor(s) {meta[:5]} are on the meta device (shapes "
                             "without data): load the weights first (model.to_empty(device=...) "
                             "and load_state_dict, or from_pretrained without a meta device map)")
        devices = {p.device for p in named.values()}
        if len(devices) != 1:
            raise ValueError("the model's parameters are on several devices "
                             f"{sorted(map(str, devices))}")
        self.device = devices.pop()
        # ``theta`` shares the model's storage and never reaches the forward (which may write
        # to its inputs): it gets new tensors, or private clones (``_unperturbed``)
        self.theta = {n: p.detach() for n, p in named.items()}
        self._clones: dict[str, torch.Tensor] = {}
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        wide = torch.float64 in [self.dtypes[n] for n in self.trainable]
        self.dtype = (geometry_dtype if geometry_dtype is not None
                      else torch.float64 if wide else torch.float32)
        self.theta_geometry = {n: self.theta[n].to(self.dtype) for n in self.trainable}
        floating = {t.dtype for t in [*named.values(), *self.buffers.values()]
                    if t.is_floating_point()}
        #: the floating dtype of the forward with the largest rounding unit (float32 where
        #: there is none): how finely its losses can tell two points apart
        self.coarsest_dtype = max(floating or {torch.float32},
                                  key=lambda d: float(torch.finfo(d).eps))
        #: :attr:`coarsest_dtype`, or the outputs' where the checked forwards (every batch's
        #: clean evaluation) returned coarser ones: a forward under ``torch.autocast`` returns
        #: bfloat16 logits from float32 parameters, and its losses round as those do
        self.forward_dtype = self.coarsest_dtype
        self.input_dtype = floating.pop() if len(floating) == 1 else None
        self.vocabulary_size = vocabulary_size(model)
        #: the class of a HuggingFace causal LM, which shifts its labels in its own loss
        self.shifting_lm = shifting_language_model(model)
        #: the class of a HuggingFace encoder-decoder, which builds its decoder's inputs from the
        #: labels inside its own loss
        self.encoder_decoder = encoder_decoder_model(model)
        #: trainable embedding tables whose untouched rows a solve may leave out
        #: (:mod:`.touched_rows`)
        self.tables = embedding_tables(model, self.trainable)
        #: weights of sparse embeddings: their gradient is made dense where it leaves the forward
        self.sparse_gradients = {
            f"{name}.weight" if name else "weight"
            for name, module in model.named_modules(remove_duplicate=False)
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse
        } & set(self.trainable)
        #: the keyword inputs the forward names, each batch's keys checked against them
        self.forward_keywords = forward_keywords(model)
        self._checking = False
        self._recorder: TableRecorder | None = None

    def check_finite(self) -> None:
        """Raise naming every trainable parameter with NaN or inf entries and every floating
        buffer with NaN entries (two host syncs).

        Buffers may hold ``inf`` on purpose (e.g. ``-inf`` attention masks); NaN they may not.
        """
        buffers = [n for n, b in self.buffers.items() if b.is_floating_point()]
        # a sum is finite only if every entry is: one read of each parameter, no mask written;
        # a sum that overflows although its entries are finite is rechecked entry by entry
        sums = torch.stack([self.theta[n].sum(dtype=torch.float64) for n in self.trainable])
        ok = [good or bool(torch.isfinite(self.theta[n]).all())
              for n, good in zip(self.trainable, torch.isfinite(sums).tolist(), strict=True)]
        if buffers:
            ok += torch.stack([~torch.isnan(self.buffers[n]).any() for n in buffers]).tolist()
        bad = [n for n, good in zip(self.trainable, ok, strict=False) if not good]
        if bad:
            raise ValueError(f"parameter(s) {bad} contain non-finite values (NaN or inf)")
        bad = [n for n, good in zip(buffers, ok[len(self.trainable):], strict=True) if not good]
        if bad:
            raise ValueError(f"buffer(s) {bad} contain NaN values: every loss would be NaN")

    def check_buffers_kept(self, batch: Batch) -> None:
        """Raise naming the buffers the forwards so far wrote to in place (one host sync per
        buffer; run after the first batch's clean evaluation).

        The forward gets the same private clones of the buffers at every evaluation: a forward
        that updates them (running statistics kept even in eval mode) would make each loss of
        the ascent depend on the evaluations before it, and the value on the batch order.
        """
        own = dict(self.model.named_buffers())
        written = [name for name, clone in self.buffers.items()
                   if not torch.equal(clone, own[name])]
        if written:
            raise ValueError(
                f"{batch.label}: the model's forward wrote to its buffer(s) {few_names(written)} "
                "in eval mode (running statistics updated on every forward?): each evaluation "
                "of the ascent would see the buffers the ones before it changed, so the losses "
                "it compares would belong to different models and the value would depend on "
                "the order of the batches; make the forward leave its buffers alone in eval "
                "mode (the model itself is not changed)")

    @staticmethod
    @contextlib.contextmanager
    def inputs_kept(batch: Batch) -> Iterator[None]:
        """Raise, naming them, if the forwards inside this block wrote to the batch's input
        tensors in place (one copy of the inputs and one host sync per input tensor; run around
        the first batch's clean evaluation); the tensors are set back first.

        Every evaluation of a batch gets the same input tensors, the caller's own: a forward
        that writes to them would give each loss of the ascent other inputs, and leave the
        caller's data changed.
        """
        inputs = _input_tensors(batch)
        before = [tensor.clone() for _, tensor in inputs]
        yield
        written = [name for (name, tensor), old in zip(inputs, before, strict=True)
                   if not _same_values(tensor, old)]
        if not written:
            return
        with torch.no_grad():
            for (_, tensor), old in zip(inputs, before, strict=True):
                tensor.copy_(old)
        raise ValueError(
            f"{batch.label}: the model's forward wrote to its input(s) {few_names(written)} in "
            "place (an in-place operation on an input: x.mul_(...), x -= mean, "
            "nn.ReLU(inplace=True) as the first layer?): every evaluation of the ascent gets "
            "the same input tensors, so each would see the inputs the ones before it left, and "
            "your batch would be changed (it was set back); make the forward leave its inputs "
            "alone (x = x * ... instead of x *= ...)")

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        """Check each batch's values inside this block (the clean evaluation of every batch).

        :meth:`loss` then also checks the token ids against the vocabulary and the class labels
        against the output (:meth:`check_batch`, one or two host syncs); the ascent's
        evaluations run outside it, without a sync.
        """
        previous, self._checking = self._checking, True
        try:
            yield
        finally:
            self._checking = previous

    @contextlib.contextmanager
    def recording_tables(self) -> Iterator[TableRecorder]:
        """Record what the forwards inside this block do with the embedding tables: the token
        ids they look up and every other use in the autograd graph
        (:class:`~.touched_rows.TableRecorder`)."""
        recorder = TableRecorder(self.tables)
        previous, self._recorder = self._recorder, recorder
        try:
            with recorder.recording():
                yield recorder
        finally:
            self._recorder = previous

    def check_batch(self, batch: Batch) -> None:
        """Raise, naming the batch, if it is empty, a keyword input is not a parameter of the
        forward (:func:`~.batches.check_keywords`) or its token ids (``input_ids``, or an
        integer first positional input) leave the vocabulary."""
        target = batch.target
        if isinstance(target, torch.Tensor) and target.numel() == 0:
            raise ValueError(f"{batch.label} is empty: its target has shape "
                             f"{tuple(target.shape)}")
        check_keywords(batch, self.forward_keywords)
        self._check_attention_mask(batch)
        if self.shifting_lm is not None and self.loss_function is cross_entropy:
            check_unshifted_labels(batch, self.shifting_lm)
        if self.encoder_decoder is not None:
            check_decoder_inputs(batch, self.encoder_decoder)
        ids = batch.kwargs.get("input_ids", batch.args[0] if batch.args else None)
        if (self.vocabulary_size is not None and isinstance(ids, torch.Tensor)
                and not ids.is_floating_point() and ids.numel()):
            low, high = torch.stack([ids.min(), ids.max()]).tolist()
            if low < 0 or high >= self.vocabulary_size:
                value = high if high >= self.vocabulary_size else low
                name = "input_ids" if "input_ids" in batch.kwargs else "input 0"
                raise ValueError(f"{batch.label}: {name} holds token id {value}, outside the "
                                 f"model's vocabulary [0, {self.vocabulary_size}) (the size of "
                                 "its input embedding): was the data tokenised for another "
                                 "model?")

    @staticmethod
    def _check_attention_mask(batch: Batch) -> None:
        """An ``attention_mask`` must have the shape of ``input_ids`` (transformers silently drops
        an all-ones mask of another shape), be finite if floating (:func:`_check_float_mask`)
        and, if integer, hold only 1 and 0 with a 1 in every row."""
        mask, ids = batch.kwargs.get("attention_mask"), batch.kwargs.get("input_ids")
        if (isinstance(mask, torch.Tensor) and isinstance(ids, torch.Tensor)
                and mask.dim() <= 2 and mask.shape != ids.shape):
            # a 4-D mask ([batch, heads, queries, keys], additive) is the model's own format
            raise ValueError(f"{batch.label}: attention_mask has shape {tuple(mask.shape)} but "
                             f"input_ids has shape {tuple(ids.shape)}; they must be equal "
                             "(one mask entry per token)")
        for name, value in batch.kwargs.items():
            # decoder_attention_mask and the like too: a NaN reads as "attend" there as well
            if (name.endswith("attention_mask") and isinstance(value, torch.Tensor)
                    and value.is_floating_point()):
                _check_float_mask(f"{batch.label}: {name}", value)
        if (isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] > 0
                and not mask.is_floating_point()):
            # an integer or boolean mask (1 = token, 0 = padding): a row of zeros is a sequence
            # with no token, which attention does not mask at all (every position attends to
            # every padding token) and whose loss means nothing
            if mask.dtype != torch.bool:
                # 1 = token, 0 = padding, nothing else: a 2 is attended by some versions of
                # transformers (mask.bool()) and masked by others (1 - mask < 0), so the value
                # would depend on the version
                other = mask[(mask != 0) & (mask != 1)]
                if other.numel():
                    raise ValueError(f"{batch.label}: attention_mask holds the value "
                                     f"{int(other[0])}; its entries must be 1 (a token) or 0 "
                                     "(padding)")
            empty = (mask == 0).all(dim=-1).nonzero().flatten().tolist()
            if empty:
                raise ValueError(f"{batch.label}: attention_mask is all zeros in row(s) "
                                 f"{empty[:5]}{' ...' if len(empty) > 5 else ''}: a sequence "
                                 "without a single token; drop it from the batch")

    def _unperturbed(self, name: str) -> torch.Tensor:
        """A private copy of parameter ``name``, made the first time it is passed as is."""
        if name not in self._clones:
            self._clones[name] = self.theta[name].clone()
        return self._clones[name]

    def loss(self, batch: Batch, updates: Mapping[str, torch.Tensor | TableLookup]
             ) -> torch.Tensor:
        """The loss with ``updates`` (by name, geometry dtype) replacing the parameters.

        ``updates`` must not alias the model's own tensors (``theta``): the forward receives
        them (cast to each parameter's dtype) and may write to its inputs. An embedding table
        may come as a :class:`~.touched_rows.TableLookup` (its perturbed rows only).
        """
        if self._checking:
            self.check_batch(batch)
        lookups = {n: u for n, u in updates.items() if isinstance(u, TableLookup)}
        tensors = {n: u for n, u in updates.items() if not isinstance(u, TableLookup)}
        params = {name: (lookups[name].placeholder(self.dtypes[name]) if name in lookups
                         else tensors[name].to(self.dtypes[name]) if name in tensors
                         else self._unperturbed(name)) for name in self.theta}
        for name in self.sparse_gradients:
            if params[name].requires_grad:
                params[name] = _DenseGradient.apply(params[name])
        with looked_up(lookups, self.dtypes):
            if self._checking:
                output = self._checked_forward(params, batch)
                self._note_output_dtype(output)
            else:
                output = torch.func.functional_call(self.model, (params, self.buffers),
                                                    batch.args, batch.kwargs)
        loss = compute_loss(self.loss_function, self.builtin_loss, output, batch.target,
                            self.dtype, batch.label, self._checking)
        if self._recorder is not None:
            self._recorder.observe(params, loss)
        return loss

    def _note_output_dtype(self, output: object) -> None:
        """Widen :attr:`forward_dtype` to a coarser dtype of ``output``'s logits. A value
        rounded coarser inside the forward and cast back (a float32 softmax or RMSNorm in a
        float64 Llama) is not counted: its rounding reaches the loss diluted, far below the
        units in the last place of that dtype."""
        logits = output_tensor(output)
        if logits is not None and logits.is_floating_point():
            self.forward_dtype = max((self.forward_dtype, logits.dtype),
                                     key=lambda d: float(torch.finfo(d).eps))

    def _checked_forward(self, params: dict[str, torch.Tensor], batch: Batch) -> object:
        """The forward of a batch's clean evaluation, its raw torch errors turned into a
        ``ValueError`` naming the batch and its inputs' shapes and dtypes."""
        try:
            return torch.func.functional_call(self.model, (params, self.buffers), batch.args,
                                              batch.kwargs)
        except (RuntimeError, IndexError, AttributeError) as err:
            # AttributeError: an input in the wrong position (GPT-2 reads a positional
            # attention mask as its past key values and calls a method of theirs on it)
            if type(err) not in (RuntimeError, IndexError, AttributeError):
                raise           # a subclass (out of memory, a user's own): unchanged
            inputs = ", ".join(f"{name}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                               for name, t in _input_tensors(batch)) or "none"
            dtypes = sorted({str(d).removeprefix("torch.") for d in self.dtypes.values()})
            embeddings = [f"{n} ({m.num_embeddings} rows)" for n, m in
                          self.model.named_modules() if isinstance(m, nn.Embedding)]
            culprit = (out_of_range_lookup(
                self.model, lambda: torch.func.functional_call(
                    self.model, (params, self.buffers), batch.args, batch.kwargs),
                _input_tensors(batch)) if isinstance(err, IndexError) else None)
            hint = (f": {culprit}" if culprit is not None
                    else f"; its embedding tables: {', '.join(embeddings[:4])}: token ids must "
                    "lie in [0, rows)" if isinstance(err, IndexError) and embeddings else "")
            raise ValueError(f"{batch.label}: the model's forward failed on inputs {{{inputs}}} "
                             f"(parameters {', '.join(dtypes)}){hint}: {type(err).__name__}: "
                             f"{err}") from err

    def finite_output_at_theta(self, batch: Batch) -> bool:
        """Whether the forward at theta returns finite logits (``False`` where it returns none
        or fails: the cause is then not known to be the loss). For a diagnosis only."""
        try:
            params = {name: self._unperturbed(name) for name in self.theta}
            with torch.no_grad():
                logits = output_tensor(torch.func.functional_call(
                    self.model, (params, self.buffers), batch.args, batch.kwargs))
        except Exception:       # noqa: BLE001 - a diagnosis only: the loss's error is reported
            return False
        return (logits is not None and logits.is_floating_point()
                and bool(torch.isfinite(logits).all()))

    def nonfinite_gradients(self, batch: Batch) -> list[str]:
        """The trainable parameters whose loss gradient at theta is not finite while the loss
        is (one forward+backward, for a diagnosis; empty where the loss is not finite)."""
        loss, gradients = self.loss_and_gradients(batch)
        if not bool(torch.isfinite(loss)):
            return []
        return [name for name, gradient in gradients.items()
                if gradient is not None and not bool(torch.isfinite(gradient).all())]

    def loss_and_gradients(self, batch: Batch
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """The loss at ``theta`` and its gradient per trainable parameter (geometry dtype).

        A parameter the loss does not depend on gets ``None``. The leaves are private copies
        of the parameters, so the forward may write to them without touching the model.
        """
        leaves = {n: self.theta_geometry[n].clone().requires_grad_(True) for n in self.trainable}
        with torch.enable_grad():
            loss = self.loss(batch, leaves)
            if not loss.requires_grad:
                return loss.detach(), dict.fromkeys(self.trainable)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return loss.detach(), dict(zip(leaves, grads, strict=True))


def _generator_class(model: nn.Module) -> tuple[str, Any] | None:
    """The class name and ``config`` of a HuggingFace model that generates (under a PEFT
    wrapper too), ``None`` for any other model: a generating model's own loss reads its labels
    as the tokens to predict, which sharpness's loss compares position by position."""
    get_base = getattr(model, "get_base_model", None)
    inner = get_base() if callable(get_base) else model
    can_generate = getattr(inner, "can_generate", None)
    config = getattr(inner, "config", None)
    try:
        generates = config is not None and callable(can_generate) and bool(can_generate())
    except (TypeError, AttributeError):        # a method of that name of one's own
        return None
    return (type(inner).__name__, config) if generates else None


def shifting_language_model(model: nn.Module) -> str | None:
    """The class name of a HuggingFace causal language model (under a PEFT wrapper too): one
    that generates and is not an encoder-decoder, whose own loss compares the logits at position
    ``t`` with the label at ``t + 1``; ``None`` for any other model."""
    found = _generator_class(model)
    if found is None or getattr(found[1], "is_encoder_decoder", False):
        return None
    return found[0]


def encoder_decoder_model(model: nn.Module) -> str | None:
    """The class name of a HuggingFace sequence-to-sequence model (one that generates and whose
    ``config.is_encoder_decoder``: BART, T5, Whisper, ...; under a PEFT wrapper too), ``None``
    for any other model (an encoder-decoder with a classification head reads its labels as
    classes, and builds its decoder's inputs from ``input_ids`` by design)."""
    found = _generator_class(model)
    return found[0] if found is not None and getattr(found[1], "is_encoder_decoder",
                                                     False) is True else None


def check_decoder_inputs(batch: Batch, model_class: str) -> None:
    """Refuse a batch with a target but no ``decoder_input_ids`` (or ``decoder_inputs_embeds``)
    for an encoder-decoder: HuggingFace builds the decoder's inputs from the labels inside the
    model's own loss, but sharpness passes the labels to its loss only, so the decoder would
    read what the model makes of the encoder's inputs (BART: ``input_ids`` shifted right, a
    silently different loss) or fail with an error that names neither (T5, Whisper)."""
    if batch.target is None or {"decoder_input_ids", "decoder_inputs_embeds"} & batch.kwargs.keys():
        return
    raise ValueError(
        f"{batch.label}: {model_class} is an encoder-decoder, and the batch has labels but no "
        "decoder_input_ids: the model's own loss builds the decoder's inputs from the labels "
        "(shifted right), but sharpness gives the labels to its loss only, so the decoder would "
        "not read them (BART reads input_ids shifted right instead: another loss). Pass "
        "decoder_input_ids in each batch: the labels shifted right after the decoder's start "
        "token (model.prepare_decoder_input_ids_from_labels(labels=labels) where the model "
        "has it)")


def check_unshifted_labels(batch: Batch, model_class: str) -> None:
    """Refuse labels equal to ``input_ids`` (where not ``-100``) for a causal LM: HuggingFace's
    convention, which most such models' own loss shifts by one position (``BartForCausalLM``'s
    does not); the built-in cross-entropy compares position by position and would measure
    predicting each token from itself."""
    ids, target = batch.kwargs.get("input_ids"), batch.target
    if ids is None and batch.args:
        ids = batch.args[0]          # the (inputs, target) form: input_ids come first
    if not (isinstance(ids, torch.Tensor) and isinstance(target, torch.Tensor)
            and target.shape == ids.shape and not target.is_floating_point()
            and target.dtype != torch.bool):
        return
    kept = target != IGNORE_INDEX
    if bool(kept.any()) and bool((target[kept] == ids[kept].to(target.device)).all()):
        raise ValueError(
            f"{batch.label}: the labels equal input_ids for {model_class}, a causal language "
            "model: sharpness compares the logits with the labels position by position, which "
            "would measure predicting each token from itself (most HuggingFace causal LMs "
            "shift such labels by one position inside their own loss; sharpness does not). "
            "Give the labels shifted (labels[:, :-1] = input_ids[:, 1:], labels[:, -1] = -100) "
            "or pass loss=callable(output, target)")


def vocabulary_size(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (``get_input_embeddings()``), else
    ``model.config.vocab_size``; ``None`` when the model has neither."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            embedding = get()
        except (NotImplementedError, AttributeError):
            embedding = None
        if isinstance(embedding, nn.Embedding):
            return embedding.num_embeddings
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    # a model of one's own with a single embedding table: the token ids index it
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return tables[0].num_embeddings if len(tables) == 1 else None


def _same_values(new: torch.Tensor, old: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (an input with NaN is diagnosed by the clean loss)."""
    if torch.equal(new, old):
        return True
    return new.is_floating_point() and bool(((new == old) | (new.isnan() & old.isnan())).all())


def _input_tensors(batch: Batch) -> list[tuple[str, torch.Tensor]]:
    named = [(f"input {i}", t) for i, t in enumerate(batch.args)] + list(batch.kwargs.items())
    return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]


def nonfinite_inputs(batch: Batch) -> list[str]:
    """The names of the batch's floating-point input tensors holding NaN or inf."""
    return [n for n, t in _input_tensors(batch)
            if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def clean_loss_cause(batch: Batch, model: FunctionalModel | None = None) -> str:
    """Why the loss at the unperturbed parameters is not finite: the first cause found."""
    target = batch.target
    if isinstance(target, torch.Tensor):
        if target.numel() == 0:
            return "the batch is empty"
        if not target.is_floating_point() and bool((target == IGNORE_INDEX).all()):
            return (f"every label is {IGNORE_INDEX} (the ignore_index), so the cross-entropy "
                    "averages over no target")
        if target.is_floating_point() and not bool(torch.isfinite(target).all()):
            return "the target contains NaN or inf"
    inputs = nonfinite_inputs(batch)
    if inputs:
        return f"the input(s) {inputs} contain NaN or inf"
    if model is not None:
        buffers = [n for n, b in model.buffers.items()
                   if b.is_floating_point() and bool(torch.isnan(b).any())]
        if buffers:
            return f"the buffer(s) {buffers} contain NaN"
        if model.finite_output_at_theta(batch):
            name = getattr(model.loss_function, "__name__", type(model.loss_function).__name__)
            return (f"the loss function ({name}) returned a non-finite value at theta although "
                    "the model's output there is finite: the loss leaves its domain (a log or "
                    "sqrt of a value <= 0, a division by zero, a NaN factor?)")
        # inf is allowed in a buffer (a -inf attention mask), but with a non-finite loss it is
        # the likely culprit, persistent or not
        buffers = [n for n, b in model.buffers.items()
                   if b.is_floating_point() and not bool(torch.isfinite(b).all())]
        if buffers:
            return (f"the buffer(s) {buffers} contain inf (buffers are not checked for inf, "
                    "which masks use on purpose)")
        dtypes = sorted({str(d).removeprefix("torch.") for d in model.dtypes.values()})
        return (f"the model's output at the unperturbed parameters is not finite (an overflow "
                f"in {', '.join(dtypes)}? float16 overflows above 65504)")
    return "the model's output at the unperturbed parameters is not finite"


def checked_clean_loss(loss: torch.Tensor, index: int, batch: Batch | None = None,
                       model: FunctionalModel | None = None) -> torch.Tensor:
    """``loss`` if finite, else a ``ValueError`` naming the batch and, given the batch, the
    likely cause (:func:`clean_loss_cause`). One host sync per batch."""
    if not bool(torch.isfinite(loss)):
        cause = f": {clean_loss_cause(batch, model)}" if batch is not None else ""
        raise ValueError(f"the clean loss on batch {index} is not finite ({float(loss)}){cause}")
    return loss


class _Found(Exception):
    """Raised from inside the forward at the first out-of-range lookup, to stop it there."""


def _source(ids: torch.Tensor, inputs: Sequence[tuple[str, torch.Tensor]]) -> str:
    """The batch input that is (or equals) ``ids``."""
    for name, tensor in inputs:
        if tensor is ids:
            return name
    for name, tensor in inputs:
        if (tensor.shape == ids.shape and tensor.dtype == ids.dtype
                and tensor.device == ids.device and bool(torch.equal(tensor, ids))):
            return name
    return "indices the forward computes itself"


def out_of_range_lookup(model: nn.Module, forward: Callable[[], object],
                        inputs: Sequence[tuple[str, torch.Tensor]]) -> str | None:
    """Run the failed ``forward`` again and describe its first embedding lookup outside the
    table's rows (the table, its rows, the index and which of the named ``inputs`` holds it);
    ``None`` when no lookup leaves its table."""
    found: list[str] = []

    def check(name: str, rows: int) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(module: nn.Module, args: tuple[object, ...]) -> None:
            ids = args[0] if args else None
            if (not isinstance(ids, torch.Tensor) or ids.is_floating_point()
                    or ids.numel() == 0):
                return
            low, high = torch.stack([ids.min(), ids.max()]).tolist()
            if low < 0 or high >= rows:
                value = low if low < 0 else high
                found.append(f"{_source(ids, inputs)} holds index {value}, outside the "
                             f"embedding table {name!r} (rows [0, {rows}))")
                raise _Found
        return hook

    tables = [(n, m) for n, m in model.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    handles = [m.register_forward_pre_hook(check(n, m.num_embeddings)) for n, m in tables]
    try:
        with torch.no_grad():
            forward()
    except _Found:
        return found[0]
    except Exception:       # noqa: BLE001 - the original error is reported by the caller
        return None
    finally:
        for handle in handles:
            handle.remove()
    return None
