#!/usr/bin/env bash
# Several sweep workers on one machine (e.g. sharing one GPU), all stopped at a deadline, then the report.
#   bash scripts/sweep_workers.sh CONFIG OUTPUT_DIR WORKERS SECONDS [key=value ...]
# e.g. bash scripts/sweep_workers.sh configs/sweep/smollm2_tofu20.yaml tofu20-sweep 9 3600 trials=1
# Workers share OUTPUT_DIR/sweep.db; at the deadline each worker is interrupted (SIGINT: its trial is marked so, then
# killed 2 minutes later if still running), and a trial cut so is done again by the next run of the same command
# (a recipe as the recipe). With DRAIN=S in the environment, workers start no trial in the last S seconds before the
# deadline (obliviate sweep --start-before): with S longer than a trial, none is cut. Each worker's log:
# OUTPUT_DIR-logs/wN.log. Needs obliviate importable (python -m).
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: bash scripts/sweep_workers.sh CONFIG OUTPUT_DIR WORKERS SECONDS [key=value ...]" >&2; exit 2
fi
config=$1; out=$2; workers=$3; seconds=$4; shift 4
case "$workers$seconds" in *[!0-9]*) echo "WORKERS and SECONDS must be whole numbers" >&2; exit 2;; esac
drain=${DRAIN:-0}
case "$drain" in ''|*[!0-9]*) echo "DRAIN must be a whole number of seconds, not '$drain'" >&2; exit 2;; esac
[ -f "$config" ] || { echo "no such sweep config: $config" >&2; exit 2; }
deadline=$(( $(date +%s) + seconds )); logs="$out-logs"; mkdir -p "$logs"
cmd=(python3 -m obliviate sweep --config "$config" "output_dir=$out" "$@")
until_drain() {  # this worker's --start-before: the seconds from now to DRAIN seconds before the deadline
  local s=$(( deadline - drain - $(date +%s) )); [ "$drain" -eq 0 ] && return; echo --start-before $(( s > 0 ? s : 0 ))
}
# the first worker prepares the study (θ0's evaluation); the others join once it has, and reuse it
OMP_NUM_THREADS=1 timeout -s INT -k 120 $(( deadline - $(date +%s) )) "${cmd[@]}" $(until_drain) > "$logs/w1.log" 2>&1 &
first=$!
until grep -q "prepared the" "$logs/w1.log" 2>/dev/null || ! kill -0 $first 2>/dev/null \
      || [ "$(date +%s)" -ge "$deadline" ]; do sleep 3; done
for i in $(seq 2 "$workers"); do
  left=$(( deadline - $(date +%s) )); [ $left -gt 0 ] || break
  OMP_NUM_THREADS=1 timeout -s INT -k 120 $left "${cmd[@]}" $(until_drain) > "$logs/w$i.log" 2>&1 &
  sleep 1
done
wait
python3 -m obliviate compare "$out" --out "$out" > "$logs/compare.log" 2>&1 && tail -1 "$logs/compare.log"
grep -h "this worker ran" "$logs"/w*.log
