#!/usr/bin/env bash
# Each method's best in the TOFU-20 study (results §24) trained again alone and attacked by the audit (relearning,
# NF4 and GGUF Q4_0 quantisation, paraphrases, membership inference), for SECONDS, from where the committed audits
# stand:
#   bash scripts/tofu20_audits.sh SECONDS [OUTPUT_DIR]     (OUTPUT_DIR: runs/tofu20-audits by default)
# SWEEP=forget05 audits the forget05 study's points instead (docs/sweeps/smollm2_tofu20_forget05_cpu, on its own
# target, whose kernels it records: a machine of that study's kind; OUTPUT_DIR runs/tofu20-forget05-audits);
# SWEEP=forget05_asu those of ASU at the teacher map's floor on the same target (OUTPUT_DIR
# runs/tofu20-forget05-asu-audits); SWEEP=forget05_search the bests of the forget05 search (OUTPUT_DIR
# runs/tofu20-forget05-search-audits).
# REF0=retain takes the study's retain model as the audit's 0% reference, attacked the same way (relearned on the same
# rows, quantised, probed): recovery is then what an attack gives beyond what it gives a model that never saw the
# forget rows. It fine-tunes that model when missing, keeps those audits apart (<snapshot>/audits-retain, OUTPUT_DIR
# <default>-retain), and the snapshot's report shows them once any exist (else those against the unlearned model).
# 1. TOFU's last 20 authors and the target fine-tune, each skipped when already there, with the study's CPU kernels
#    (scripts/tofu20_study.sh) and its weights checked against the study's (the retain model only with REF0=retain,
#    its weights checked too: else the audit's 0% reference is the unlearned model itself; the runs skip the
#    evaluation the study has made).
# 2. OUTPUT_DIR starts with the committed audits (docs/sweeps/smollm2_tofu20_cpu/audits/<method>: the config each
#    audit trained and its audit.json); scripts/audit_bests.sh skips a method whose audit is of its current best.
# 3. JOBS audits of one thread at once (2 by default); none starts in the last DRAIN seconds (2400 by default, longer
#    than an audit here).
# 4. The audits done are written back beside the snapshot (configs and audit.json only, not the weights), with the
#    snapshot's report. Run from the repository root.
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: bash scripts/tofu20_audits.sh SECONDS [OUTPUT_DIR]" >&2; exit 2; fi
case "${SWEEP:-main}" in
  main) snap=docs/sweeps/smollm2_tofu20_cpu; mine=runs/tofu20-audits; retain=retain;;
  forget05) snap=docs/sweeps/smollm2_tofu20_forget05_cpu; mine=runs/tofu20-forget05-audits; retain=retain95;;
  forget05_asu) snap=docs/sweeps/smollm2_tofu20_forget05_asu_cpu; mine=runs/tofu20-forget05-asu-audits
                retain=retain95;;
  forget05_search) snap=docs/sweeps/smollm2_tofu20_forget05_search_cpu; mine=runs/tofu20-forget05-search-audits
                   retain=retain95;;
  *) echo "SWEEP must be main, forget05, forget05_asu or forget05_search, not '$SWEEP'" >&2; exit 2;;
esac
model=$(sed -n 's/^output_dir: *//p' "configs/tofu/smollm2/finetune_$retain.yaml" 2>/dev/null)  # where it writes
ref=(); kept=$snap/audits
case "${REF0:-unlearned}" in
  unlearned) ;;
  retain) ref=("audit.retain_model=$model"); kept=$snap/audits-retain; mine=$mine-retain;;
  *) echo "REF0 must be unlearned or retain, not '$REF0'" >&2; exit 2;;
esac
seconds=$1; out=${2:-$mine}; jobs=${JOBS:-2}; drain=${DRAIN:-2400}
case "$seconds$jobs$drain" in ''|*[!0-9]*) echo "SECONDS, JOBS and DRAIN must be whole numbers" >&2; exit 2;; esac
[ -f "$snap/sweep.yaml" ] || { echo "no $snap/sweep.yaml: run this from the repository root" >&2; exit 2; }
end=$(( $(date +%s) + seconds ))
[ -d data/tofu-20 ] || python3 -m obliviate prepare tofu --authors 20 || exit $?
kernels=$(python3 -m obliviate.sweep.machine env "$snap/sweep.db") || exit $?  # the study's CPU kernels here
if [ -n "$kernels" ]; then echo "the study's CPU kernels on this machine: $kernels"; eval "$kernels"; fi
python3 -m obliviate finetune --config configs/tofu/smollm2/finetune_target.yaml || exit $?
python3 -m obliviate.sweep.machine record "$snap/sweep.db" runs/tofu20-smollm2-target || exit $?
if [ ${#ref[@]} -gt 0 ]; then  # the 0% reference: the study's retain model (reused when already there)
  python3 -m obliviate finetune --config "configs/tofu/smollm2/finetune_$retain.yaml" || exit $?
  python3 -m obliviate.sweep.machine retain "$snap/sweep.db" "$model" || exit $?  # its weights
fi
for done in "$kept"/*/best.yaml; do  # the committed audits, unless this folder has its own
  [ -e "$done" ] || continue
  method=$(basename "$(dirname "$done")")
  [ -e "$out/$method" ] && continue
  mkdir -p "$out/$method/audit" && cp "$done" "$out/$method/best.yaml" \
    && cp "$kept/$method/audit/audit.json" "$out/$method/audit/audit.json" || exit $?
done
UNTIL=$(( end - drain )) OMP_NUM_THREADS=1 bash scripts/audit_bests.sh "$snap" "$out" "$jobs" \
  "audit.quant_schemes=[nf4,gguf_q4_0]" eval.enabled=false "${ref[@]}"
status=$?
for done in "$out"/*/best.yaml; do  # each audit with the config it trained, back beside the snapshot
  [ -e "$done" ] || continue
  method=$(basename "$(dirname "$done")")
  [ -f "$out/$method/audit/audit.json" ] || continue
  mkdir -p "$kept/$method/audit" && cp "$done" "$kept/$method/best.yaml" \
    && cp "$out/$method/audit/audit.json" "$kept/$method/audit/audit.json" || exit $?
done
shown=$snap/audits-retain; [ -d "$shown" ] || shown=$snap/audits  # against the retain model once there are any
[ -d "$shown" ] && python3 -m obliviate compare "$snap" --audits "$shown" --out "$snap"
exit $status
