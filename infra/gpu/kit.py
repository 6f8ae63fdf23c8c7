"""GPU-session kit: split a file into parts that fit the device tool's 64 MiB limit, join
them back with a sha256 check, and size the carry sets of each call.

Standard library only: the same file runs here (``make gpu-pack``, ``.venv/bin/python``)
and on the bare GPU machine (``make gpu-stage-2``, its ``python3``).

Contract:
- ``split_file(src, dest_dir, parts)`` writes ``dest_dir/part-1 .. part-N`` (sizes differ
  by at most one byte; their concatenation is ``src``) and ``dest_dir/manifest.json``
  {name, bytes, sha256, parts: [{name, bytes, sha256}]}; returns the manifest.
- ``join_parts(part_paths, manifest, dest)`` concatenates the parts in the manifest's
  order into ``dest`` and returns ``dest`` only if the whole file's size and sha256 match
  the manifest; otherwise it deletes the half-made ``dest`` and raises ValueError naming
  the part or the check that failed. A part missing on disk -> ValueError naming it.
- ``tree_bytes(repo)`` = bytes of what every call carries anyway: tracked files plus
  untracked files git does not ignore (``git ls-files -co --exclude-standard``), plus a
  ``shared/`` folder inside the checkout. ``carry_bytes(repo, paths)`` = bytes of the
  carried (ignored) paths that exist; a missing one is an error unless it is optional
  (OPTIONAL_CARRY). ``call_report(repo, calls)`` -> one dict per call with both, the optional
  paths not packed (``absent``) and ``ok`` = total < LIMIT_BYTES - MARGIN_BYTES.

- ``check_parts(manifest, folder)`` -> per part "ok", "absent" or "bad sha256 ..." (the
  parts arrive over several calls).

CLI: ``python3 infra/gpu/kit.py split SRC DEST_DIR [--parts 3]``,
``join MANIFEST DEST PART...``, ``check MANIFEST FOLDER`` (exit 2 on a bad part or when no
part is there), ``sizes`` (prints the calls in CALLS with their sizes, exit 1 when one is
over), ``sha256 FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

LIMIT_BYTES = 64 * 2**20  # the device tool's limit on what one call carries
# Headroom for files other engineers add to the tree between packing and the call.
MARGIN_BYTES = 2 * 2**20
CHUNK = 1 << 20

# The back-to-back calls of a GPU session (infra/README.md, "GPU session"): A, A2, then B
# (the 30-minute session) or B15 (the 15-minute one: the night, its pld step first). Three
# parts of ~31 MiB: two of 47 MiB no longer fit call A beside an 11 MiB tree (2026-11-26).
CALLS: dict[str, list[str]] = {
    "A: make gpu-stage-1": [".bench/model/part-1", ".bench/wheels", ".bench/cache"],
    "A2: make gpu-stage-part": [".bench/model/part-2"],
    "B: make gpu-stage-2": [".bench/model/part-3", ".bench/ac-corpus"],
    "B15: make gpu-night": [".bench/model/part-3"],
}
#: Carried when packed, else left out: the AutoCompressor corpus feeds only part b, which
#: skips itself without it (`make gpu-pack` packs it when out/ac-corpus exists).
OPTIONAL_CARRY = frozenset({".bench/ac-corpus"})


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split_file(src: str | Path, dest_dir: str | Path, parts: int = 3) -> dict:
    """Split ``src`` into ``parts`` near-equal parts under ``dest_dir`` (see module contract)."""
    src, dest_dir = Path(src), Path(dest_dir)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    size = src.stat().st_size
    if size < parts:
        raise ValueError(f"{src} has {size} bytes, fewer than parts={parts}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    base, extra = divmod(size, parts)
    entries = []
    with open(src, "rb") as f:
        for i in range(parts):
            n = base + (1 if i < extra else 0)
            path = dest_dir / f"part-{i + 1}"
            h = hashlib.sha256()
            with open(path, "wb") as out:
                left = n
                while left:
                    block = f.read(min(CHUNK, left))
                    out.write(block)
                    h.update(block)
                    left -= len(block)
            entries.append({"name": path.name, "bytes": n, "sha256": h.hexdigest()})
    manifest = {"name": src.name, "bytes": size, "sha256": sha256_file(src), "parts": entries}
    (dest_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def join_parts(part_paths: list[str | Path], manifest: dict, dest: str | Path) -> Path:
    """Concatenate the parts named by ``manifest`` (found among ``part_paths`` by file
    name) into ``dest``; checks every part and the whole (see module contract)."""
    dest = Path(dest)
    by_name = {Path(p).name: Path(p) for p in part_paths}
    missing = [e["name"] for e in manifest["parts"] if not by_name.get(e["name"], Path("/nonexistent")).is_file()]
    if missing:
        raise ValueError(f"join: part(s) {missing} not found among {sorted(map(str, part_paths))}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for e in manifest["parts"]:
                ph = hashlib.sha256()
                with open(by_name[e["name"]], "rb") as f:
                    while block := f.read(CHUNK):
                        out.write(block)
                        h.update(block)
                        ph.update(block)
                if ph.hexdigest() != e["sha256"]:
                    raise ValueError(f"join: {by_name[e['name']]} sha256 {ph.hexdigest()} != manifest {e['sha256']}")
        if dest.stat().st_size != manifest["bytes"] or h.hexdigest() != manifest["sha256"]:
            raise ValueError(
                f"join: {dest} is {dest.stat().st_size} bytes sha256 {h.hexdigest()}, "
                f"manifest says {manifest['bytes']} bytes sha256 {manifest['sha256']}"
            )
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _path_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def check_parts(manifest: dict, folder: str | Path) -> dict[str, str]:
    """Each part of ``manifest`` -> "ok" (in ``folder``, sha256 as listed), "absent", or
    "bad sha256 <got>"; parts arrive over several calls, so absent is not an error here."""
    folder = Path(folder)
    state = {}
    for e in manifest["parts"]:
        path = folder / e["name"]
        if not path.is_file():
            state[e["name"]] = "absent"
        else:
            got = sha256_file(path)
            state[e["name"]] = "ok" if got == e["sha256"] else f"bad sha256 {got}"
    return state


def tree_bytes(repo: str | Path) -> int:
    """Bytes every call carries: tracked + untracked-not-ignored files, plus shared/."""
    repo = Path(repo)
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, check=True, capture_output=True
    ).stdout.decode().split("\0")
    files = {repo / n for n in names if n and (repo / n).is_file()}
    shared = repo / "shared"
    if shared.is_dir():  # travels even where git ignores it; count each file once
        files |= {p for p in shared.rglob("*") if p.is_file() and not p.is_symlink()}
    return sum(p.stat().st_size for p in files)


def carry_bytes(repo: str | Path, paths: list[str], optional: frozenset[str] = frozenset()) -> int:
    """Bytes of the carried paths that exist; ValueError naming a missing path that is not
    ``optional`` (the device tool would delete it there)."""
    repo = Path(repo)
    missing = [p for p in paths if not (repo / p).exists() and p not in optional]
    if missing:
        raise ValueError(f"carry path(s) {missing} missing under {repo}; run `make gpu-pack` first")
    return sum(_path_bytes(repo / p) for p in paths if (repo / p).exists())


def call_report(repo: str | Path, calls: dict[str, list[str]] | None = None) -> list[dict]:
    """Per call: tree bytes, carried bytes, total and whether it stays under the limit."""
    tree = tree_bytes(repo)
    rows = []
    for name, paths in (calls or CALLS).items():
        carried = carry_bytes(repo, paths, OPTIONAL_CARRY)
        total = tree + carried
        absent = [p for p in paths if p in OPTIONAL_CARRY and not (Path(repo) / p).exists()]
        rows.append({"call": name, "carry": paths, "absent": absent, "tree_bytes": tree, "carry_bytes": carried,
                     "total_bytes": total, "ok": total < LIMIT_BYTES - MARGIN_BYTES})
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("src")
    s.add_argument("dest_dir")
    s.add_argument("--parts", type=int, default=3)
    j = sub.add_parser("join")
    j.add_argument("manifest")
    j.add_argument("dest")
    j.add_argument("parts", nargs="+")
    c = sub.add_parser("check")
    c.add_argument("manifest")
    c.add_argument("folder")
    sub.add_parser("sizes")
    h = sub.add_parser("sha256")
    h.add_argument("file")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "split":
            m = split_file(a.src, a.dest_dir, a.parts)
            for e in m["parts"]:
                print(f"{a.dest_dir}/{e['name']}: {e['bytes']} bytes ({_mib(e['bytes'])})")
            print(f"{m['name']}: {m['bytes']} bytes sha256 {m['sha256']}")
        elif a.cmd == "join":
            m = json.loads(Path(a.manifest).read_text())
            out = join_parts(a.parts, m, a.dest)
            print(f"joined {out}: {m['bytes']} bytes, sha256 {m['sha256']} OK")
        elif a.cmd == "sha256":
            print(sha256_file(a.file))
        elif a.cmd == "check":
            state = check_parts(json.loads(Path(a.manifest).read_text()), a.folder)
            for name, st in state.items():
                print(f"{a.folder}/{name}: {st}")
            bad = [n for n, st in state.items() if st.startswith("bad")]
            if bad:
                print(f"error: {bad} differ from {a.manifest} (re-pack with `make gpu-pack`)", file=sys.stderr)
                return 2
            if all(st == "absent" for st in state.values()):
                print(f"error: no part of {a.manifest} under {a.folder}: carry one", file=sys.stderr)
                return 2
            left = [n for n, st in state.items() if st == "absent"]
            print(f"still to carry: {left}" if left else "every part is here")
        else:
            rows = call_report(os.getcwd())
            for r in rows:
                print(f"{r['call']}: tree {_mib(r['tree_bytes'])} + carry {_mib(r['carry_bytes'])} "
                      f"= {_mib(r['total_bytes'])} of {_mib(LIMIT_BYTES)} "
                      f"({'ok' if r['ok'] else 'OVER: leave ' + _mib(MARGIN_BYTES) + ' headroom'}) carry={r['carry']}"
                      + (f" (not packed, left out: {r['absent']})" if r["absent"] else ""))
            return 0 if all(r["ok"] for r in rows) else 1
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
