"""AutoCompressors (Chevalier et al., 2023): summary vectors as a soft prompt.

model.py: the wrapper (LM + summary-token embeddings; compress, training forward).
kv_form.py: the second summary form, each segment kept as every k-th token's keys/values.
checkpoint.py: our small LoRA directory format and the published princeton-nlp checkpoints.
config.py: the method's settings (``AutoCompressorCompression``; the registry entry is
stages/compression/autocompressor.py).
prefill.py: the generate actor's prefill strategy.
data.py / train.py: the training job's data blocks and loop (pipeline/train/autocompressor.py
is its CLI); resume.py: resumable checkpoints and the per-step loss log; curve.py: its PNG.
checkpoints/: the checkpoint shipped for the embedded SmolLM2-135M (jobs/results/autocompressor/).
"""
