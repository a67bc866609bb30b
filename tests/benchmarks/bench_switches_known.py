"""Every setting bench_train_gpu reports is one summarize_train.py knows.

Runs the simulator's bench_train_gpu once (a tiny step) and reads its JSON
line. Each setting it reports as true or false must be a key of
summarize_train.DEFAULTS (so that a run's label names it when it differs)
or part of the mixture's label, and each whose flag is `--` and the key
with dashes must be one of summarize_train.SWITCHES (so that run_all.sh's
--helpful-switches can count it). A switch added to the bench without
them would run on the GPU and be left out of the tables and the combined
run: this fails instead, naming it.

Usage: bench_switches_known.py BENCH SUMMARIZE_TRAIN_PY
"""
import importlib.util
import json
import subprocess
import sys

bench, script = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("summarize_train", script)
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)

run = subprocess.run([bench, "--preset", "tiny", "--batch", "1", "--seq", "32", "--steps", "1",
                      "--warmup", "0", "--vocab", "256"], capture_output=True, text=True,
                     check=True)
line = [l for l in run.stdout.splitlines() if l.startswith("{")][-1]
result = json.loads(line)
help_text = subprocess.run([bench, "--help"], capture_output=True, text=True, check=True).stdout

IN_THE_MIXTURE_LABEL = {"pad_to_capacity", "host_routing"}
settings = [k for k, v in result.items() if isinstance(v, bool)]
problems = []
for key in settings:
    if key not in summary.DEFAULTS and key not in IN_THE_MIXTURE_LABEL:
        problems.append(f"'{key}' is not in summarize_train.DEFAULTS")
    flag = "--" + key.replace("_", "-")
    if flag + " " in help_text or flag + "\n" in help_text:
        if key not in summary.SWITCHES and key not in IN_THE_MIXTURE_LABEL:
            problems.append(f"'{flag}' is not in summarize_train.SWITCHES")
if len(settings) < 5:
    problems.append(f"only {len(settings)} true/false settings in the JSON line: {line}")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"{len(settings)} settings known: {', '.join(sorted(settings))}")
