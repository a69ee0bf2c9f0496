# Wall-clock seconds per step, for .ci/run, scripts/test and scripts/fuzz: sourced, not run.
#
#   source scripts/steps.sh
#   steps_begin                 # the outermost script: a new record, its table at exit
#   step "cargo fmt" cargo fmt --all -- --check
#   step "peers (background)" scripts/peers &   # a step in the background is timed too
#
# Each step appends "name<TAB>seconds<TAB>ok|FAILED (rc)" to $LLMGATE_STEPS when it ends,
# so a step run in the background, or by a script this one calls, lands in the same
# record. The script that called steps_begin prints the table when it exits, also when a
# step failed (set -e stops it, the EXIT trap still runs): a red or slow CI log ends with
# where the time went.

steps_begin() {
  # A script called by another that already keeps the record adds to it.
  if [[ -n "${LLMGATE_STEPS:-}" ]]; then
    return
  fi
  mkdir -p target
  export LLMGATE_STEPS="$PWD/target/ci-steps.tsv"
  : >"$LLMGATE_STEPS"
  STEPS_STARTED=$(date +%s)
  trap steps_table EXIT
}

# step [--limit SECONDS] NAME COMMAND...: runs COMMAND, records its wall seconds, returns
# its status. With --limit, COMMAND and every process it started are stopped past SECONDS
# (timeout(1): TERM to its process group, KILL 30 s later) and the step fails with 124: a
# hung test costs its step's limit, not CI's whole budget, and the table still prints
# (CI once spent 65 minutes on a browser test waiting for a process a failed test left).
step() {
  local limit=""
  if [[ "$1" == --limit ]]; then
    limit="$2"
    shift 2
  fi
  local name="$1" start rc=0
  shift
  start=$(date +%s)
  if [[ -n "$limit" ]]; then
    timeout --kill-after=30 "$limit" "$@" || rc=$?
  else
    "$@" || rc=$?
  fi
  if [[ -n "${LLMGATE_STEPS:-}" ]]; then
    local status="ok"
    [[ $rc -eq 0 ]] || status="FAILED ($rc)"
    printf '%s\t%s\t%s\n' "$name" "$(($(date +%s) - start))" "$status" >>"$LLMGATE_STEPS"
  fi
  return "$rc"
}

steps_table() {
  local rc=$?
  [[ -s "${LLMGATE_STEPS:-}" ]] || return "$rc"
  echo
  echo "Wall seconds per step (steps in the background overlap the others):"
  awk -F'\t' '{ printf "  %-52s %6ss  %s\n", $1, $2, $3 }' "$LLMGATE_STEPS"
  printf '  %-52s %6ss  %s\n' "total" "$(($(date +%s) - STEPS_STARTED))" \
    "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")"
  return "$rc"
}
