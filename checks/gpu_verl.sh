#!/usr/bin/env bash
# verl + OAR-G on ONE CUDA GPU: 3 GRPO steps of a small model, FSDP2 actor, the oar_sync trainer (make gpu-verl).
# A USER-SIDE RECIPE for a GPU machine of your own (never run by this project): it needs vLLM and Ray, which the
# lent GPU machine lacks, cannot fetch and cannot carry (docs/scaling.md). Target: under 8 minutes on one H100.
#
# Needs, on the GPU machine, `python` on PATH from an environment of its own with verl and a rollout engine:
#   python3 -m venv .venv-gpu-verl && .venv-gpu-verl/bin/pip install -e ".[verl]" "verl[vllm]==0.9.1"
# (vLLM brings its own CUDA torch; the CPU test layer that make test-verl builds has no rollout engine), and, offline:
#   MODEL_PATH  a local HF model directory, e.g. Qwen2.5-0.5B-Instruct
#   TRAIN_FILE / VAL_FILE  parquet files from verl's examples/data_preprocess/gsm8k.py (or math_dataset.py)
# What it checks (exit code != 0 otherwise): verl logs the plugin registration, the run finishes 3 steps,
# and every step logged the OAR metrics with a non-zero share of scored completions.
set -euo pipefail
: "${MODEL_PATH:?set MODEL_PATH to a local HF model directory (e.g. Qwen2.5-0.5B-Instruct)}"
: "${TRAIN_FILE:?set TRAIN_FILE to a verl GSM8K/MATH train parquet}"
: "${VAL_FILE:?set VAL_FILE to a verl GSM8K/MATH test parquet}"
ROLLOUT="${ROLLOUT:-vllm}"
OUT="${OUT:-runs/gpu-verl}"
for f in "$MODEL_PATH" "$TRAIN_FILE" "$VAL_FILE"; do [ -e "$f" ] || { echo "gpu-verl: missing $f" >&2; exit 2; }; done
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-verl: no CUDA device')"
python -c "import $ROLLOUT" || { echo "gpu-verl: rollout engine '$ROLLOUT' is not installed" >&2; exit 2; }
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 VERL_USE_EXTERNAL_PLUGINS=auto

timeout 480 python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  trainer.use_v1=true trainer.v1.trainer_mode=oar_sync \
  +oar.credit=oar-g +oar.batch_size=2 +oar.options.tau=0.25 \
  data.train_files="$TRAIN_FILE" data.val_files="$VAL_FILE" \
  data.train_batch_size=16 data.max_prompt_length=512 data.max_response_length=512 \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.rollout.name="$ROLLOUT" actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=3 trainer.test_freq=-1 \
  trainer.save_freq=-1 trainer.val_before_train=false trainer.logger='["console"]' \
  trainer.default_local_dir="$OUT/ckpt" 2>&1 | tee "$OUT/log.txt"

grep -q "oar verl plugin: registered trainer 'oar_sync'" "$OUT/log.txt" \
  || { echo "gpu-verl: the plugin registration line is missing" >&2; exit 1; }
steps=$(grep -c "oar/frac_scored" "$OUT/log.txt" || true)
[ "$steps" -ge 3 ] || { echo "gpu-verl: expected 3 steps with OAR metrics, found $steps" >&2; exit 1; }
grep -o "oar/frac_scored:[0-9.e+-]*" "$OUT/log.txt" | awk -F: '$2 > 0 {ok=1} END {exit !ok}' \
  || { echo "gpu-verl: no completion was scored in any step" >&2; exit 1; }
echo "gpu-verl: OK ($steps steps with OAR metrics; log in $OUT/log.txt)"
