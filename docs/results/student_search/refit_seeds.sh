#!/usr/bin/env bash
# Run from docs/results/student_search/. The refit at seeds 1 and 2 (each pools its seed's three 25% studies), then confirmed.
S=~/.cache/transformer-alloc/smollm2
for seed in 1 2; do
  python -m workers.search --space refit.yaml --teacher $S/bf16 --data $S/tokens/docs \
    --eval $S/tokens/code --kv-cache 0.25 --storage sqlite:///studies.db \
    --study smollm2-refit-0.25-s$seed --seed $seed --storage-path ray \
    --max-concurrent 1 --quiet > refit-s$seed.log 2>&1
  for src in code licenses; do
    python -m workers.confirm --storage sqlite:///studies.db \
      --study smollm2-refit-0.25-s$seed --eval $S/tokens/$src --top 1 --quiet > confirm-refit-s$seed-$src.txt 2>&1
  done
  echo "$seed rc=$?" >> refit_seeds.done
done
