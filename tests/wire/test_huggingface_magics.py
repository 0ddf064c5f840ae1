"""``%serve export`` of transformers objects: a pipeline as it is, a model with ``--tokenizer`` and ``--task``, served
by the kernel's server as soon as the magic returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import requests
from IPython.core.error import UsageError
from transformers import pipeline

from tests import hf_models


@pytest.fixture(scope="module")
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


def test_serve_export_writes_pipelines_and_models_with_their_tokenizer(ip, tmp_path):
    tokenizer = hf_models.tokenizer()
    classifier = pipeline(
        "text-classification", model=hf_models.model("text-classification", len(tokenizer)), tokenizer=tokenizer
    )
    ip.user_ns.update(
        classifier=classifier,
        nli=hf_models.model("zero-shot-classification", len(tokenizer), seed=3),
        tok=tokenizer,
    )
    handle = ip.run_line_magic("serve", f"start --repo {tmp_path}")
    try:
        status = ip.run_line_magic("serve", "export classifier sentiment")
        assert "exported sentiment v1 (text: string[?]) -> (label: string[?]" in str(status)
        r = requests.post(
            f"{handle.rest_url}/v1/models/sentiment:predict", json={"instances": ["I hate trains"]}, timeout=60
        )
        assert r.status_code == 200, r.text
        want = classifier("I hate trains")[0]
        (got,) = r.json()["predictions"]
        assert got["label"] == want["label"] and np.isclose(got["score"], want["score"], rtol=1e-4)

        with pytest.raises(UsageError, match="is served with its tokenizer"):
            ip.run_line_magic("serve", "export nli topics --task zero-shot-classification")
        status = ip.run_line_magic("serve", "export nli topics --tokenizer tok --task zero-shot-classification")
        assert "candidate_labels: string[?, ?]" in str(status)
        body = {"instances": [{"text": "I hate trains", "candidate_labels": ["travel", "food"]}]}
        r = requests.post(f"{handle.rest_url}/v1/models/topics:predict", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["predictions"][0]["labels"]) == ["food", "travel"]
    finally:
        ip.run_line_magic("serve", "stop --all")
