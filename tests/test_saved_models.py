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
