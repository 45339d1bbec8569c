#!/usr/bin/env bash
# The TOFU-20 study (results §24) goes on on this machine for SECONDS, from where its committed snapshot stands:
#   bash scripts/tofu20_study.sh SECONDS [STUDY_DIR]     (STUDY_DIR: runs/tofu20-study by default)
# SWEEP=rmu runs the RMU sweep over a wider learning-rate range instead (configs/sweep/smollm2_tofu20_rmu.yaml; its
# snapshot docs/sweeps/smollm2_tofu20_rmu_cpu, its folder runs/tofu20-rmu-study by default); SWEEP=forget05 runs each
# method's selected point again on the 5% forget split (configs/sweep/smollm2_tofu20_forget05.yaml, written by
# `obliviate compare docs/sweeps/smollm2_tofu20_cpu --transfer`; its retain model is fine-tuned on retain95; snapshot
# docs/sweeps/smollm2_tofu20_forget05_cpu; its target is its own, made on the first machine that ran it, whichever
# kind: it checks its own recorded kernels only); SWEEP=forget05_asu runs ASU with its teacher at the teacher map's
# floor on the forget05 study's target (configs/sweep/smollm2_tofu20_forget05_asu_floor.yaml, snapshot
# docs/sweeps/smollm2_tofu20_forget05_asu_cpu, the kernels the forget05 study records); SWEEP=forget05_search
# searches every method on the 5% split from its recipe as the main study does on forget10
# (configs/sweep/smollm2_tofu20_forget05_search.yaml, snapshot docs/sweeps/smollm2_tofu20_forget05_search_cpu, the
# same target and kernels as the forget05 study); SWEEP=main is the default.
# 1. TOFU's last 20 authors (data/tofu-20) and both fine-tunes (the target, the retain model), each skipped when
#    already there; they are deterministic, and the sweep refuses a target or retain model whose weights differ from
#    those the study was made with (another kind of machine fine-tunes other weights: start a new study there).
#    The retain model is skipped too once the study records its outputs (the first worker that loads it writes them).
#    Before them, the CPU kernels: where the study records those its target was made with (sweep/machine.py), the
#    setting that reproduces them here is exported, or the script stops when none does; after them, the target's
#    weights are checked against the study's and this machine's kernels recorded.
# 2. STUDY_DIR starts as a copy of the committed study (the snapshot's sweep.db) when it is new; the RMU sweep takes
#    the retain model's recorded outputs from the main study when both were made with the same models and rows.
# 3. WORKERS workers of one thread (2 by default; each needs up to 12 GB of memory) run trials until SECONDS have
#    passed; none starts one in the last DRAIN seconds (1500 by default, longer than a trial here), so none is cut.
#    A trial cut anyway is done again by the next run.
# 4. The study is written back as the committed snapshot, with its report (obliviate compare; with the bests' audits
#    when scripts/tofu20_audits.sh has made some). Run from the repository root.
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: bash scripts/tofu20_study.sh SECONDS [STUDY_DIR]" >&2; exit 2; fi
case "${SWEEP:-main}" in
  main) snap=docs/sweeps/smollm2_tofu20_cpu; config=configs/sweep/smollm2_tofu20.yaml; mine=runs/tofu20-study
        extra=(warm_start=tofu20-cpu);;
  rmu) snap=docs/sweeps/smollm2_tofu20_rmu_cpu; config=configs/sweep/smollm2_tofu20_rmu.yaml
       mine=runs/tofu20-rmu-study; extra=();;
  forget05) snap=docs/sweeps/smollm2_tofu20_forget05_cpu; config=configs/sweep/smollm2_tofu20_forget05.yaml
            mine=runs/tofu20-forget05-study; extra=();;
  forget05_asu) snap=docs/sweeps/smollm2_tofu20_forget05_asu_cpu
                config=configs/sweep/smollm2_tofu20_forget05_asu_floor.yaml; mine=runs/tofu20-forget05-asu-study
                extra=();;
  forget05_search) snap=docs/sweeps/smollm2_tofu20_forget05_search_cpu
                   config=configs/sweep/smollm2_tofu20_forget05_search.yaml; mine=runs/tofu20-forget05-search-study
                   extra=();;
  *) echo "SWEEP must be main, rmu, forget05, forget05_asu or forget05_search, not '$SWEEP'" >&2; exit 2;;
esac
retain=retain; case "${SWEEP:-main}" in forget05*) retain=retain95;; esac  # never saw the forget05 author
seconds=$1; study=${2:-$mine}; workers=${WORKERS:-2}
case "$seconds$workers" in ''|*[!0-9]*) echo "SECONDS and WORKERS must be whole numbers" >&2; exit 2;; esac
[ -f "$config" ] || { echo "no $config: run this from the repository root" >&2; exit 2; }
end=$(( $(date +%s) + seconds ))
[ -d data/tofu-20 ] || python3 -m obliviate prepare tofu --authors 20 || exit $?
if [ ! -f "$study/sweep.db" ] && [ -f "$snap/sweep.db" ]; then  # else the sweep starts its study afresh
  mkdir -p "$study" && cp "$snap/sweep.yaml" "$study/sweep.yaml" && cp "$snap/sweep.db" "$study/sweep.db" || exit $?
fi
main_db=runs/tofu20-study/sweep.db; [ -f "$main_db" ] || main_db=docs/sweeps/smollm2_tofu20_cpu/sweep.db
if [ "${SWEEP:-main}" = rmu ] && [ -f "$study/sweep.db" ] && [ -f "$main_db" ]; then  # the same retain model and rows
  python3 -m obliviate.sweep.retained "$main_db" "$study/sweep.db" || exit $?
fi
recorded() {  # the study's storage records the retain model's outputs with their scores (sweep/retained.py)
  [ -f "$1" ] && python3 - "$1" 2>/dev/null <<'EOF'
import json, sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("SELECT value_json FROM study_user_attributes WHERE key = 'retain_outputs'")
sys.exit(0 if any(json.loads(v).get("scores") for (v,) in rows) else 1)
EOF
}
shares=("$main_db")  # the studies whose target this one is
case "${SWEEP:-main}" in
  forget05) shares=();;
  forget05_asu|forget05_search) shares=(runs/tofu20-forget05-study/sweep.db)  # the forget05 study's target, its kernels
                [ -f "${shares[0]}" ] || shares=(docs/sweeps/smollm2_tofu20_forget05_cpu/sweep.db);;
esac
kernels=$(python3 -m obliviate.sweep.machine env "$study/sweep.db" "${shares[@]}") || exit $?  # before the fine-tunes
if [ -n "$kernels" ]; then echo "the study's CPU kernels on this machine: $kernels"; eval "$kernels"; fi
for which in target "$retain"; do  # reused when already there (the same settings, weights and data)
  if [ "$which" = "$retain" ] && recorded "$study/sweep.db"; then
    echo "the retain model's outputs are recorded in the study: not fine-tuned here"; continue
  fi
  python3 -m obliviate finetune --config "configs/tofu/smollm2/finetune_$which.yaml" || exit $?
done
if [ -f "$study/sweep.db" ]; then  # the target's weights are the study's: its kernels recorded for later machines
  python3 -m obliviate.sweep.machine record "$study/sweep.db" runs/tofu20-smollm2-target || exit $?
fi
left=$(( end - $(date +%s) ))
if [ "$left" -gt "${DRAIN:-1500}" ]; then
  DRAIN=${DRAIN:-1500} bash scripts/sweep_workers.sh "$config" "$study" "$workers" "$left" \
    stale_after_s=3600 "${extra[@]}"
else
  echo "no time left for a trial after the fine-tunes ($left s); the study is as it was" >&2
fi
[ -f "$study/sweep.db" ] || { echo "no study in $study: nothing to write back" >&2; exit 1; }
# a study its first workers made here records this machine's kernels now (else: "recorded already")
python3 -m obliviate.sweep.machine record "$study/sweep.db" runs/tofu20-smollm2-target || exit $?
if [ ! -f "$snap/sweep.yaml" ]; then mkdir -p "$snap" && cp "$study/sweep.yaml" "$snap/sweep.yaml" || exit $?; fi
python3 - "$study/sweep.db" "$snap/sweep.db" <<'EOF' || exit $?
import sqlite3, sys  # a consistent copy even while a worker of another run writes
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close(); src.close()
EOF
if [ -d "$snap/audits" ]; then  # with the bests' audits (scripts/tofu20_audits.sh), unless none is of a current best
  python3 -m obliviate compare "$snap" --audits "$snap/audits" --out "$snap" || python3 -m obliviate compare "$snap" --out "$snap"
else
  python3 -m obliviate compare "$snap" --out "$snap"
fi
