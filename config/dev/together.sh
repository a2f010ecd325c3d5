#!/usr/bin/env bash
# Run commands side by side and wait for all of them: together.sh NAME 'COMMAND' [NAME 'COMMAND' ...].
# Each one's output goes to var/log/together-NAME.log and is printed, whole, once all have ended (in the
# order given, with its exit status and seconds); the exit status is 1 if any failed. `make test` runs the
# browser and the several-host tests this way, .ci/run bench-smoke and prod-smoke: each pair is mostly
# waiting (browsers, engines starting, clusters converging), so side by side costs the longer of the two,
# not the sum. Only commands that share nothing (databases, Redis dbs, engines, addresses) may run together.
set -uo pipefail
mkdir -p var/log
names=() pids=() started=$(date +%s)
while [ $# -ge 2 ]; do
  name=$1 command=$2; shift 2
  log=var/log/together-$name.log
  echo "together: $name started (output in $log, printed when all have ended)"
  (bash -c "$command" >"$log" 2>&1 </dev/null; status=$?; echo $(( $(date +%s) - started )) >"$log.end"; exit $status) &
  names+=("$name") pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  statuses[$i]=$status ended[$i]=$(cat "var/log/together-${names[$i]}.log.end" 2>/dev/null || echo "?")
done
for i in "${!names[@]}"; do
  echo "==================== ${names[$i]} (exit ${statuses[$i]}, ended after ${ended[$i]} s) ===================="
  cat "var/log/together-${names[$i]}.log"
  [ "${statuses[$i]}" = 0 ] || failed=1
done
for i in "${!names[@]}"; do echo "together: ${names[$i]} exit ${statuses[$i]} after ${ended[$i]} s"; done
exit $failed
