#!/usr/bin/env bash
# Each method's best of a finished unlearn (TOFU) sweep trained again alone and attacked by the audit, then the
# sweep's report with a table of the recovered shares (obliviate compare --audits).
#   bash scripts/audit_bests.sh SWEEP_DIR OUTPUT_DIR JOBS [key=value ...]
# e.g. bash scripts/audit_bests.sh tofu20-sweep tofu20-audits 3 audit.quant_schemes=[nf4,gguf_q4_0]
# JOBS runs at once (on one GPU, several share it); the key=value overrides go to every `obliviate unlearn`.
# Writes OUTPUT_DIR/best/<method>.yaml, OUTPUT_DIR/<method>/ (the model, its metrics, audit/audit.json and best.yaml,
# the config it trained), OUTPUT_DIR/logs/<method>.log and the report in OUTPUT_DIR/report/. Needs obliviate
# importable by $PYTHON (default python3).
# Resumable: a method whose OUTPUT_DIR/<method> holds an audit of its current best (the same best.yaml) is not audited
# again; one whose best changed is audited again (its folder replaced once the new audit is done). With UNTIL set
# (seconds since the epoch), no audit starts after that time; the report then shows those done so far.
set -uo pipefail
py=${PYTHON:-python3}
if [ $# -lt 3 ]; then
  echo "usage: bash scripts/audit_bests.sh SWEEP_DIR OUTPUT_DIR JOBS [key=value ...]" >&2; exit 2
fi
sweep=$1; out=$2; jobs=$3; shift 3
case "$jobs" in ''|*[!0-9]*|0) echo "JOBS must be a whole number of at least 1, not '$jobs'" >&2; exit 2;; esac
case "${UNTIL:-}" in *[!0-9]*) echo "UNTIL must be a time in seconds since the epoch, not '$UNTIL'" >&2; exit 2;; esac
[ -f "$sweep/sweep.yaml" ] || { echo "no sweep in $sweep (no sweep.yaml): run obliviate sweep first" >&2; exit 2; }
"$py" -m obliviate compare "$sweep" --best-configs "$out/best" --out "$out/report" || exit $?
mkdir -p "$out/logs"
for config in "$out"/best/*.yaml; do  # every config checked before the first run starts
  [ -e "$config" ] || { echo "no best at matched utility in $sweep: nothing to audit" >&2; exit 1; }
  grep -q "^# Run: obliviate unlearn " "$config" || { echo "$config is not an unlearn (TOFU) config: this script audits \
the bests of unlearn sweeps; run a demo or knowledge sweep's best with obliviate demo --config $config" >&2; exit 2; }
done
audit() {  # one best trained again and audited; its config kept beside the audit once the run succeeded
  local config=$1 method=$2 again=(); shift 2
  [ -e "$out/$method" ] && again=(overwrite=true)  # an audit of an earlier best, replaced when this one is done
  "$py" -m obliviate unlearn --config "$config" audit.enabled=true "output_dir=$out/$method" "${again[@]}" "$@" \
    > "$out/logs/$method.log" 2>&1 && cp "$config" "$out/$method/best.yaml"
}
status=0; pids=(); late=0
for config in "$out"/best/*.yaml; do
  method=$(basename "$config" .yaml)
  if [ -f "$out/$method/audit/audit.json" ] && cmp -s "$config" "$out/$method/best.yaml"; then
    echo "$method: its best is audited already ($out/$method)"; continue
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 2; done
  if [ -n "${UNTIL:-}" ] && [ "$(date +%s)" -ge "$UNTIL" ]; then late=$((late + 1)); continue; fi
  audit "$config" "$method" "$@" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status -eq 0 ] || echo "an audit failed: see $out/logs/" >&2
[ $late -eq 0 ] || echo "$late audits not started (UNTIL has passed): run this again to do them" >&2
"$py" -m obliviate compare "$sweep" --audits "$out" --out "$out/report" || exit $?
exit $status
