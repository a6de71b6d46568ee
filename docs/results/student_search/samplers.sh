#!/usr/bin/env bash
# The samplers at 25% over three seeds (2026-12-08), run from docs/results/student_search/.
# Each seed is its own calibration sample (so its own plan) and its own sampler seed. Ran as
# two to three of these studies at once on the 2-core machine (about 65 min in all).
S=~/.cache/transformer-alloc/smollm2
export PYTHONPATH=$(cd ../../.. && pwd)  # bench/ runs from the checkout, not the install
KV=0.25 TAG=latent25
study() {  # SPACE NAME SAMPLER SEED TRIALS [--resume]
  python -m workers.search --space $1 --teacher $S/bf16 --data $S/tokens/docs \
    --eval $S/tokens/code --kv-cache $KV --storage sqlite:///studies.db \
    --study smollm2-$TAG-$2-s$4 --sampler $3 --seed $4 --trials $5 $6 \
    --storage-path ray --max-concurrent 1 --quiet
}
for seed in 0 1 2; do
  study latent_1.yaml prior prior $seed 24
  study latent_1.yaml random random $seed 60       # stage 1
  # a third study that follows them: refit at once from their students, the prior around it
  study latent_refit.yaml refit prior $seed 24
done
for seed in 0 1 2; do
  study latent_1.yaml random random $seed 100 --resume   # stage 2: 40 more draws a seed
  python -m workers.confirm --storage sqlite:///studies.db --study smollm2-latent25-refit-s$seed \
    --eval $S/tokens/code --top 1 > confirm-refit-s$seed-code.txt
done
python -m bench.student_samplers --storage sqlite:///studies.db --prefix smollm2-latent25 \
  --samplers prior random           # the prior against random search (their own best)
python -m bench.student_samplers --storage sqlite:///studies.db --prefix smollm2-latent25 \
  --samplers prior random refit     # with the study that follows them
# 12.5%: random search's length fixed in advance at 80 a seed; the follow-up's refit pools both
# budgets' students of the seed's measurements
KV=0.125 TAG=latent12
for seed in 0 1 2; do
  study latent_1.yaml prior prior $seed 24
  study latent_1.yaml random random $seed 80
  study latent_refit.yaml refit prior $seed 24
done
python -m bench.student_samplers --storage sqlite:///studies.db --prefix smollm2-latent12 \
  --samplers prior random refit
