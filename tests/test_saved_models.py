"""``quotientsharp.workflows.saved_models``: a saved HuggingFace model whose config does not
match its weights is named with the first weight that differs.
"""

from __future__ import annotations

import json

import pytest


def test_an_hf_config_that_does_not_match_its_weights_is_named(bert, tmp_path):
    from quotientsharp.workflows.saved_models import load_measured_model

    bert.save_pretrained(tmp_path / "bert")
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    config["intermediate_size"] = 48                    # the weights have 32
    (tmp_path / "bert" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json does not match the weights.*"
                                         r"intermediate.dense.weight: weights \(32, 16\), "
                                         r"config \(48, 16\)"):
        load_measured_model(tmp_path / "bert")


def test_weights_that_the_config_has_no_place_for_are_refused(tmp_path):
    """A config.json edited to fewer layers than the weights hold: transformers drops the
    extra layers, and a smaller model than the one saved would be measured."""
    transformers = pytest.importorskip("transformers")
    from quotientsharp.workflows.options import InputError
    from quotientsharp.workflows.saved_models import load_measured_model

    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=40,
                                     max_position_embeddings=16, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    loaded = load_measured_model(tmp_path / "bert")      # as saved: every weight is used
    assert len(loaded.bert.encoder.layer) == 2
    edited = json.loads((tmp_path / "bert" / "config.json").read_text())
    edited["num_hidden_layers"] = 1
    (tmp_path / "bert" / "config.json").write_text(json.dumps(edited))
    with pytest.raises(InputError, match=r"the weights hold \d+ tensor\(s\) that "
                                         r"BertForSequenceClassification .*no place for "
                                         r"\(bert\.encoder\.layer\.1\."):
        load_measured_model(tmp_path / "bert")


def test_a_model_saved_quantised_without_its_package_is_named(tmp_path):
    """A config.json with bitsandbytes' quantization_config where bitsandbytes is missing:
    transformers' ImportError was a raw traceback (exit status 1)."""
    transformers = pytest.importorskip("transformers")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("bitsandbytes is installed: the model loads")
    from quotientsharp.workflows.options import InputError
    from quotientsharp.workflows.saved_models import load_measured_model

    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=40,
                                     max_position_embeddings=16, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    edited = json.loads((tmp_path / "bert" / "config.json").read_text())
    edited["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "bert" / "config.json").write_text(json.dumps(edited))
    with pytest.raises(InputError, match=rf"^MODEL {tmp_path / 'bert'}: transformers cannot "
                                         r"load it without a package .*bitsandbytes"):
        load_measured_model(tmp_path / "bert")
