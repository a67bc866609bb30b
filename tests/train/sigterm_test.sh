#!/usr/bin/env bash
# triad-train gets SIGTERM mid-run: it must finish the step, write a complete
# checkpoint, exit 0; a resumed run then continues from that step. Arguments
# after the fourth are more triad-train flags (e.g. asynchronous checkpoints).
set -u
train=$1 config=$2 data=$3 work=$4
shift 4
rm -rf "$work"
args=(--config "$config" --set data.train="$data" --set train.steps=100000 --set log.interval=1000
      --set checkpoint.dir="$work/ckpt" --set output.dir="$work/out" "$@")
"$train" "${args[@]}" > "$work.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do   # wait until it is training
  grep -q "step     1/" "$work.log" 2>/dev/null && break
  sleep 0.1
done
sleep 0.5
kill -TERM "$pid"
wait "$pid"
rc=$?
if [ "$rc" -ne 0 ]; then echo "exit code $rc after SIGTERM"; cat "$work.log"; exit 1; fi
grep -q "stopping after step" "$work.log" || { echo "no stop message"; cat "$work.log"; exit 1; }
[ -f "$work/ckpt/latest" ] || { echo "no checkpoint marker"; exit 1; }
step=$(sed 's/step_//' "$work/ckpt/latest")
[ -f "$work/ckpt/step_$step/manifest.json" ] || { echo "marker points to an incomplete checkpoint"; exit 1; }
# Resume: continues right after the checkpointed step.
"$train" "${args[@]}" --set train.steps=$((step + 2)) --set checkpoint.resume=auto > "$work.resume.log" 2>&1 || {
  echo "resume failed"; cat "$work.resume.log"; exit 1; }
grep -q "resumed from .*step_$step" "$work.resume.log" || { echo "did not resume"; cat "$work.resume.log"; exit 1; }
echo "SIGTERM at step $step: checkpointed, exit 0, resumed"
