"""cProfile of method select's prefill call on one sample-qa document and its 3 questions:
the document read once for all of them (share) or once per question (noshare).

    python jobs/results/bench-job/profiles/share_reading_profile.py share|noshare THREADS [DOC_INDEX]

Results: share-reading-profile-2026-11-29-cpu.md beside this file.
"""

import cProfile
import json
import pstats
import sys
import time

import torch

from schemas.loading import load_spec
from stages.compression import method_for
from stages.prompting import PromptBuilder

share = sys.argv[1] == "share"
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
spec = load_spec("jobs/results/bench-job/specs/sample-qa-select.yaml", [f"compression.share_reading={str(share).lower()}"])
loaded = method_for(spec.compression).load(spec, torch.device("cpu"))
with open("jobs/sample-qa.jsonl") as f:
    docs = [json.loads(line) for line in f]
doc = docs[int(sys.argv[3]) if len(sys.argv) > 3 else 0]
builder = PromptBuilder(loaded.tokenizer)
ctx = builder.encode_text(doc["text"])
parts = [builder.build(ctx, spec.task.resolved_instruction, q) for q in doc["questions"]]
print("doc tokens", len(ctx), "questions", len(parts), "query tokens", [len(p.query_ids) for p in parts])
loaded.prefill(parts[:1])  # warm-up, not profiled
t = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
if share:
    loaded.prefill(parts)  # one call: the document's questions share the reading
else:
    for p in parts:  # one call per question: each reads the document
        loaded.prefill([p])
profile.disable()
print("wall", round(time.perf_counter() - t, 2))
pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
