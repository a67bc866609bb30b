# benchmarks/gpu/summarize_train.py over a fixture of run_all.sh's training
# lines (SCRIPT, RUNS): every run named by what it changed, set against
# PyTorch and its model's first run, the planner's prediction beside them
# the log line between them skipped, and the host's work a step (GEMM
# queries, cudaMallocs) where a run reports it; the example trainer's run
# (triad-train) against the first run of its model, at that run's MFU for
# its pace.
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${RUNS} OUTPUT_VARIABLE out ERROR_VARIABLE err
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "summarize_train.py failed (${rc}): ${err}")
endif()
foreach(
  want
  "\\| 350m \\| 16 \\| the planner's prediction \\| 210.6k \\| 51.58% \\| 77.81 \\|  \\|  \\|  \\|"
  "\\| 350m \\| 16 \\| defaults \\| 203.6k \\| 49.90% \\| 80.47 \\| 1.0999x \\|  \\|  \\|"
  "\\| 350m \\| 16 \\| gemm-autotune 8 \\(3 of 40 products changed\\) \\| 205.6k \\| 50.40% \\| 79.67 \\| 1.1109x \\| \\+1.00% \\|  \\|"
  "\\| 350m \\| 16 \\| PyTorch \\| 185.1k \\| 45.30% \\| 88.51 \\|  \\|  \\|  \\|"
  "\\| 124m \\| 16 \\| attention-nondeterministic, experts 8 top 2 capacity 1.25 z-loss 0.001 \\| 101.9k \\| 12.30% \\| 160.80 \\|  \\|  \\| 0.4 / 1.25 \\|"
  "\\| 350m \\| 16 \\| triad-train \\(the example trainer\\) \\| 200.0k \\| 49.02% \\| 81.92 \\| 1.0805x \\| -1.77% \\|  \\|"
  "\\| 350m \\| 16 \\| triad-train \\(the example trainer, train.cuda_graph\\) \\| 204.8k \\| 50.19% \\| 80.00 \\| 1.1064x \\| \\+0.59% \\|  \\|")
  if(NOT out MATCHES "${want}")
    message(FATAL_ERROR "no line matching ${want} in:\n${out}")
  endif()
endforeach()
string(REGEX MATCHALL "\n\\|" rows "${out}")
list(LENGTH rows count)
if(NOT count EQUAL 8)  # the header's rule and the seven runs
  message(FATAL_ERROR "${count} rows after the header, expected 8:\n${out}")
endif()

# --helpful-switches: the switches that alone beat their model's first run
# (the defaults) by at least the gain asked, as bench_train_gpu's flags, in
# the order they ran; never one run beside another change, with another
# switch, at another batch, or a second time (SWITCH_RUNS).
foreach(
  case
  "350m|--gemm-autotune 8 --sync-free --gelu-apart"
  "350m --min-gain 0.05|--gemm-autotune 8 --add-norm-bias-sums --sync-free --gelu-apart"
  "124m|--bias-grad-epilogue"
  "124m --min-gain 10|"
  "2b|")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 given)
  list(LENGTH parts n)
  set(expected "")
  if(n EQUAL 2)
    list(GET parts 1 expected)
  endif()
  separate_arguments(given UNIX_COMMAND "${given}")
  execute_process(COMMAND ${PYTHON} ${SCRIPT} --helpful-switches ${given} ${SWITCH_RUNS}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT out STREQUAL "${expected}")
    message(FATAL_ERROR "--helpful-switches ${given}: '${out}' (exit ${rc}: ${err}), "
                        "expected '${expected}'")
  endif()
endforeach()

# --graph-estimate: the first profiled run of each model, its backend calls
# a step (1000 here: 96 + 49 + 855) times the probe's stream-less-graph
# device time a launch (2.5 - 1.2 us), against its step, and the host's
# time to queue its passes against the device's (GAP_KERNELS,
# PROFILED_RUNS); a clear line where the probe or a profile is missing.
foreach(
  case
  "${GAP_KERNELS}|${PROFILED_RUNS}|350m batch 16: 1000 backend calls a step x \\(2.50 - 1.20\\) us a launch = up to 1.30 ms of its 80.00 ms step \\(1.62%\\) from a CUDA graph \\(the host queued its passes in 9.25 ms of the device's 74.75\\)$"
  "${RUNS}|${PROFILED_RUNS}|^\\(no launch-gap rows among the kernels' lines: no estimate\\)$"
  "${GAP_KERNELS}|${RUNS}|^\\(no profiled Triad run: no estimate\\)$")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 kernels)
  list(GET parts 1 runs)
  list(GET parts 2 want)
  execute_process(COMMAND ${PYTHON} ${SCRIPT} --graph-estimate ${kernels} ${runs}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "${want}")
    message(FATAL_ERROR "--graph-estimate ${kernels} ${runs}: '${out}' (exit ${rc}: ${err}), "
                        "expected a match of '${want}'")
  endif()
endforeach()
