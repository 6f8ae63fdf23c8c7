cd /work/main && exec nice -n 5 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python -c "import typer; from pipeline.train.autocompressor import train_autocompressor as f; typer.run(f)" \
  --data out/ac-corpus/train.jsonl --out out/ac-smollm2 \
  --summary-length 50 --block-tokens 1024 --substeps 2 --segments-per-substep 2 --min-segment-tokens 64 \
  --batch-size 1 --grad-accum 1 --steps 240 --lr 1e-3 --warmup-steps 15 \
  --lora-r 8 --lora-alpha 16 --lora-dropout 0.05 --device cpu --dtype float32 --seed 0 \
  --log-every 1 --save-every 20 --threads 1 "$@"
