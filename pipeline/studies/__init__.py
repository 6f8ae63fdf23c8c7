"""Studies: the measurements behind a default or a figure in the READMEs.

Each module runs one study end to end (``python -m pipeline.studies.<name> --help``)
with the product's own pieces, and a smoke test runs it on a tiny input
(tests/pipeline/studies/), so a change to those pieces that breaks a study shows.
Their results are data under jobs/results/ and jobs/eval/results/, each naming the
command that made it.

- ``finch_layouts``: Finch's kept tokens laid out several ways from one compression
  per question (chose ``keep: sentences``, ``order: relevance``, ``min_relevance``).
- ``finch_needles``: needle QA at one budget, Finch's scorings and modes vs RAG and
  truncation (chose the calibrated heads and early exit).
- ``rag_chunk_recall``: answer recall of rag's kept context by chunk size (chose
  ``chunk_tokens: auto``).
- ``autocompressor_heldout``: continuation NLL with and without an AutoCompressor's
  summaries on held-out pages, with controls (another page's summaries, none).
- ``autocompressor_controls``: the eval set's NLL rows of a kv-form checkpoint split
  into what the document gives and what the adapter alone gives.
- ``kv_summary_probe``: trains and scores summaries kept as keys/values in three
  layouts (its stride layout became the AutoCompressor's kv form).
"""
