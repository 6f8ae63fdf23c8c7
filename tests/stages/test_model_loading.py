"""Model loading: dtype "auto" by device and size, the size estimate, and the embedded model converted once."""

from __future__ import annotations

from pathlib import Path

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


def test_checkpoint_dtype_reads_the_size_only_where_auto_depends_on_it(tmp_path):
    """On a GPU auto picks by the checkpoint's size (read from its config); on the CPU, and
    for a named dtype, the config is not needed (a folder without one still resolves)."""
    from stages.model_loading import checkpoint_dtype

    random_config("random:smollm2-135m").save_pretrained(tmp_path / "small")
    random_config("random:llama-8b").save_pretrained(tmp_path / "large")
    assert checkpoint_dtype(str(tmp_path / "small"), "auto", CUDA) == torch.float32
    assert checkpoint_dtype(str(tmp_path / "large"), "auto", CUDA) == torch.bfloat16
    no_config = str(tmp_path / "none")
    assert checkpoint_dtype(no_config, "auto", torch.device("cpu")) == torch.float32
    assert checkpoint_dtype(no_config, "float16", CUDA) == torch.float16


def test_random_model_config_takes_the_shared_tokenizers_ids_and_refuses_a_small_vocabulary(monkeypatch):
    import stages.model_loading as ml
    import stages.random_models as rm

    tok = ml.load_tokenizer("random:tiny")
    cfg = ml.random_model_config("random:tiny", tok)
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    from dataclasses import replace

    monkeypatch.setitem(rm.SHAPES, "tiny", replace(rm.SHAPES["tiny"], vocab_size=100))
    with pytest.raises(ValueError, match="random:tiny: vocab_size 100 is smaller than the tokenizer's"):
        ml.random_model_config("random:tiny", tok)


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


# A child process: convert_once with a conversion that records who ran it.
_CHILD = """
import os, sys
from pathlib import Path
from stages.model_loading import convert_once

target, log = Path(sys.argv[1]), Path(sys.argv[2])

def convert(folder: Path) -> None:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_text(str(os.getpid()))

print(convert_once(target, convert))
"""


def _lock_waiters(lock: Path) -> int:
    """Processes blocked on a lock of ``lock``'s inode, as the kernel lists them (/proc/locks)."""
    ino = lock.stat().st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for ln in lines if "->" in ln and any(f.endswith(f":{ino}") for f in ln.split()))


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see waiters")
def test_two_processes_convert_once_and_the_second_reuses(tmp_path):
    """Two real processes ask for the same model folder while a third holds the lock:
    both block, then exactly one converts and the other reuses its folder."""
    import fcntl
    import subprocess
    import sys
    import time

    target, log = tmp_path / "models" / "m", tmp_path / "conversions.log"
    target.parent.mkdir()
    lock = target.parent / ".m.lock"
    repo = Path(__file__).resolve().parents[2]
    with open(lock, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(target), str(log)], cwd=repo,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        deadline = time.monotonic() + 120
        while _lock_waiters(lock) < 2:  # the event: both children wait on the lock
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            assert time.monotonic() < deadline, "the children never waited on the lock"
            time.sleep(0.05)
        assert not log.exists()  # nobody converted while the lock was held
        fcntl.flock(held, fcntl.LOCK_UN)
    outs = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == [str(target)] * 2
    converters = log.read_text().split()
    assert len(converters) == 1  # converted once; the other process reused it
    assert (target / "model.safetensors").read_text() == converters[0]
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".m-")]  # no temporary left


def test_a_complete_folder_is_reused_without_the_lock(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "model.safetensors").write_text("done")
    from stages.model_loading import convert_once

    def never(folder: Path) -> None:
        raise AssertionError("converted a complete folder")

    assert convert_once(target, never) == target
    assert not (tmp_path / ".m.lock").exists()



def test_random_weights_drawn_on_the_cpu_are_kept_and_read_back_unchanged(tmp_path, monkeypatch):
    """A random model's CPU draw is saved once; later loads read it (no second draw) and
    get exactly the weights, name and tied head a fresh draw gives."""
    import stages.model_loading as ml
    from stages.random_models import build_random_model

    tok_dir = ml.embedded_tokenizer_dir()  # the real cache's tokenizer: no conversion into tmp_path
    monkeypatch.setattr(ml, "embedded_tokenizer_dir", lambda: tok_dir)
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    drawn, tok = ml.load_causal_lm("random:tiny")
    (folder,) = (tmp_path / "models").glob("random-tiny-float32-seed0-*")

    def no_draw(*_a, **_k):
        raise AssertionError("drew the weights again")

    monkeypatch.setattr(ml, "build_random_model", no_draw)
    read, _ = ml.load_causal_lm("random:tiny")
    cfg = random_config("random:tiny", eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    fresh = build_random_model(cfg, torch.float32, torch.device("cpu"), seed=0)
    assert read.state_dict().keys() == fresh.state_dict().keys()
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in read.state_dict().items())
    ids = torch.tensor([[1, 17, 400, 9]])
    assert torch.equal(read(ids).logits, fresh(ids).logits) and torch.equal(drawn(ids).logits, fresh(ids).logits)
    assert read.config._name_or_path == "random:tiny" and not read.training
    assert read.lm_head.weight.data_ptr() == read.model.embed_tokens.weight.data_ptr()  # still tied
    assert read.generation_config.pad_token_id == tok.pad_token_id
    with pytest.raises(AssertionError, match="drew"):  # another seed is another draw
        ml.load_causal_lm("random:tiny", seed=1)
    # Not cached: an accelerator's draw (other numbers than the CPU's), or weights too big.
    assert ml.random_model_dir("random:tiny", cfg, torch.float32, torch.device("meta"), 0) is None
    monkeypatch.setattr(ml, "RANDOM_CACHE_MAX_BYTES", 1024)
    assert ml.random_model_dir("random:tiny", cfg, torch.float32, torch.device("cpu"), 0) is None
    assert folder.is_dir()
    # A cache this process cannot write: the draw is made for it alone, not a bare OSError.
    monkeypatch.setattr(ml, "RANDOM_CACHE_MAX_BYTES", 8 * 2**30)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "a-file" / "cache"))
    assert ml.random_model_dir("random:tiny", cfg, torch.float32, torch.device("cpu"), 0) is None
