"""dtype "auto" by device and model size (issue 12's measured rule), and the size estimate."""

from __future__ import annotations

import pytest
import torch

from stages.model_loading import SMALL_MODEL_PARAMS, estimate_parameters, resolve_dtype
from stages.random_models import random_config

CUDA = torch.device("cuda")  # a device object needs no GPU


@pytest.mark.parametrize(
    ("shape", "billions"), [("smollm2-135m", 0.1345), ("llama-1b", 1.236), ("llama-8b", 8.03)]
)
def test_parameter_estimate_matches_the_published_sizes(shape, billions):
    assert estimate_parameters(random_config(f"random:{shape}")) / 1e9 == pytest.approx(billions, rel=0.01)


def test_auto_dtype_by_device_and_size():
    small, large = random_config("random:smollm2-135m"), random_config("random:llama-8b")
    assert estimate_parameters(small) < SMALL_MODEL_PARAMS < estimate_parameters(large)
    assert resolve_dtype("auto", torch.device("cpu"), large) == torch.float32
    assert resolve_dtype("auto", CUDA, small) == torch.float32
    assert resolve_dtype("auto", CUDA, large) == torch.bfloat16
    assert resolve_dtype("auto", CUDA) == torch.bfloat16  # size unknown: the large-model choice
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_unknown_dtype_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", torch.device("cpu"))


def _dirs(tmp_path, target_files: dict[str, str], new_files: dict[str, str]):
    """(converted model folder, existing target folder) holding the given files."""
    out = []
    for name, files in ((".tmp", new_files), ("target", target_files)):
        d = tmp_path / name
        d.mkdir()
        for f, text in files.items():
            (d / f).write_text(text)
        out.append(d)
    return out


def test_publish_into_a_tokenizer_only_cache(tmp_path):
    from stages.model_loading import publish_model_dir

    tmp, target = _dirs(tmp_path, {"tokenizer.json": "old"}, {n: n for n in ("config.json", "tokenizer.json", "model.safetensors")})
    publish_model_dir(tmp, target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (target / "tokenizer.json").read_text() == "tokenizer.json"


def test_publish_keeps_a_complete_model(tmp_path):
    from stages.model_loading import publish_model_dir

    tmp, target = _dirs(tmp_path, {"model.safetensors": "first"}, {"model.safetensors": "second"})
    publish_model_dir(tmp, target)
    assert (target / "model.safetensors").read_text() == "first"
