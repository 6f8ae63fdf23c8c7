"""AutoCompressors (Chevalier et al., 2023): summary vectors as a soft prompt.

model.py: the wrapper (LM + summary-token embeddings; compress, training forward).
checkpoint.py: our small LoRA directory format and the published princeton-nlp checkpoints.
prefill.py: the generate actor's prefill strategy.
data.py / train.py: the training job's data blocks and loop (pipeline/train/autocompressor.py
is its CLI).
"""
