#!/usr/bin/env bash
# Each method's best in the TOFU-20 study (results §24) trained again alone and attacked by the audit (relearning,
# NF4 and GGUF Q4_0 quantisation, paraphrases, membership inference), for SECONDS, from where the committed audits
# stand:
#   bash scripts/tofu20_audits.sh SECONDS [OUTPUT_DIR]     (OUTPUT_DIR: runs/tofu20-audits by default)
# SWEEP=forget05 audits the forget05 study's points instead (docs/sweeps/smollm2_tofu20_forget05_cpu, on its own
# target, whose kernels it records: a machine of that study's kind; OUTPUT_DIR runs/tofu20-forget05-audits).
# 1. TOFU's last 20 authors and the target fine-tune, each skipped when already there, with the study's CPU kernels
#    (scripts/tofu20_study.sh) and its weights checked against the study's (the retain model is not needed:
#    the audit's 0% reference is the unlearned model itself, and the runs skip the evaluation the study has made).
# 2. OUTPUT_DIR starts with the committed audits (docs/sweeps/smollm2_tofu20_cpu/audits/<method>: the config each
#    audit trained and its audit.json); scripts/audit_bests.sh skips a method whose audit is of its current best.
# 3. JOBS audits of one thread at once (2 by default); none starts in the last DRAIN seconds (2400 by default, longer
#    than an audit here).
# 4. The audits done are written back beside the snapshot (configs and audit.json only, not the weights), with the
#    snapshot's report. Run from the repository root.
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: bash scripts/tofu20_audits.sh SECONDS [OUTPUT_DIR]" >&2; exit 2; fi
case "${SWEEP:-main}" in
  main) snap=docs/sweeps/smollm2_tofu20_cpu; mine=runs/tofu20-audits;;
  forget05) snap=docs/sweeps/smollm2_tofu20_forget05_cpu; mine=runs/tofu20-forget05-audits;;
  *) echo "SWEEP must be main or forget05, not '$SWEEP'" >&2; exit 2;;
esac
seconds=$1; out=${2:-$mine}; jobs=${JOBS:-2}; drain=${DRAIN:-2400}; kept=$snap/audits
case "$seconds$jobs$drain" in ''|*[!0-9]*) echo "SECONDS, JOBS and DRAIN must be whole numbers" >&2; exit 2;; esac
[ -f "$snap/sweep.yaml" ] || { echo "no $snap/sweep.yaml: run this from the repository root" >&2; exit 2; }
end=$(( $(date +%s) + seconds ))
[ -d data/tofu-20 ] || python3 -m obliviate prepare tofu --authors 20 || exit $?
kernels=$(python3 -m obliviate.sweep.machine env "$snap/sweep.db") || exit $?  # the study's CPU kernels here
if [ -n "$kernels" ]; then echo "the study's CPU kernels on this machine: $kernels"; eval "$kernels"; fi
python3 -m obliviate finetune --config configs/tofu/smollm2/finetune_target.yaml || exit $?
python3 -m obliviate.sweep.machine record "$snap/sweep.db" runs/tofu20-smollm2-target || exit $?
for done in "$kept"/*/best.yaml; do  # the committed audits, unless this folder has its own
  [ -e "$done" ] || continue
  method=$(basename "$(dirname "$done")")
  [ -e "$out/$method" ] && continue
  mkdir -p "$out/$method/audit" && cp "$done" "$out/$method/best.yaml" \
    && cp "$kept/$method/audit/audit.json" "$out/$method/audit/audit.json" || exit $?
done
UNTIL=$(( end - drain )) OMP_NUM_THREADS=1 bash scripts/audit_bests.sh "$snap" "$out" "$jobs" \
  "audit.quant_schemes=[nf4,gguf_q4_0]" eval.enabled=false
status=$?
for done in "$out"/*/best.yaml; do  # each audit with the config it trained, back beside the snapshot
  [ -e "$done" ] || continue
  method=$(basename "$(dirname "$done")")
  [ -f "$out/$method/audit/audit.json" ] || continue
  mkdir -p "$kept/$method/audit" && cp "$done" "$kept/$method/best.yaml" \
    && cp "$out/$method/audit/audit.json" "$kept/$method/audit/audit.json" || exit $?
done
[ -d "$kept" ] && python3 -m obliviate compare "$snap" --audits "$kept" --out "$snap"
exit $status
