# benchmarks/gpu/run_all.sh on a machine without a GPU, as CI can check it.
# A broken script would cost a lent GPU's whole call (15 minutes a session),
# so:
# - its `gpu_test` lines must be exactly the tests of CTest's gpu label,
#   with their commands (EXPECTED: "NAME PROGRAM ARGS..." for each, from
#   triad_gpu_test), since it runs them without CTest;
# - unpacking a pack made from these sources (a tar.xz of the programs,
#   here links to this build's, and the stamp source_stamp.sh prints), its
#   build and test stages must run to their end, list each gpu test as
#   skipped (never passed) and finish with status 0, and a second call
#   with SKIP_BUILD=1 must find the unpacked programs' libraries; a pack from other
#   sources must not be unpacked (the script compiles instead, here a
#   stand-in `cmake` that fails);
# - its profile stage must import ncu's report into ncu.csv and summarise
#   each kernel (a stand-in ncu), and say so when ncu cannot profile;
# - with a budget too small for anything (BUDGET_S=1), it must skip its
#   steps, name them, and exit non-zero;
# - when the conformance suite crashes, it must run again, each in a
#   process of its own, exactly the tests the suite did not finish, and
#   those failing there under the sanitizer (stand-in programs here).
# Variables: SCRIPT (run_all.sh), WORK, DEVICES (triad-devices), GPU_TESTS
# (triad_gpu_tests), NCCL_TESTS (triad_collectives_nccl_tests, when built),
# EXPECTED.
file(STRINGS ${SCRIPT} lines REGEX "^ *gpu_test ")
set(listed "")
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^ *gpu_test ([^ ]+) \"\\$BUILD_DIR/[^\"]*/([^\"/]+)\"(.*)$")
    message(FATAL_ERROR "run_all.sh: a gpu_test line not of the form "
                        "gpu_test NAME \"$BUILD_DIR/DIR/PROGRAM\" ARGS: '${line}'")
  endif()
  string(STRIP "${CMAKE_MATCH_1} ${CMAKE_MATCH_2}${CMAKE_MATCH_3}" entry)
  list(APPEND listed "${entry}")
endforeach()
list(SORT listed)
set(expected ${EXPECTED})
list(SORT expected)
if(NOT listed STREQUAL expected)
  message(FATAL_ERROR "run_all.sh runs the gpu tests [${listed}] but CTest's gpu label has "
                      "[${expected}]: add or mend its gpu_test lines")
endif()

execute_process(COMMAND ${DEVICES} --require RESULT_VARIABLE none OUTPUT_QUIET ERROR_QUIET)
if(none EQUAL 0)
  message(STATUS "run_all.sh check skipped: a GPU is visible (the gpu label runs the real suite)")
  return()
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/stage/examples ${WORK}/stage/tests ${WORK}/prebuilt)
file(CREATE_LINK ${DEVICES} ${WORK}/stage/examples/triad-devices SYMBOLIC)
file(CREATE_LINK ${GPU_TESTS} ${WORK}/stage/tests/triad_gpu_tests SYMBOLIC)
set(packed run_all_build.log examples/triad-devices tests/triad_gpu_tests)
set(nccl OFF)
if(NCCL_TESTS)
  file(CREATE_LINK ${NCCL_TESTS} ${WORK}/stage/tests/triad_collectives_nccl_tests SYMBOLIC)
  list(APPEND packed tests/triad_collectives_nccl_tests)
  set(nccl ON)
endif()
file(WRITE ${WORK}/stage/run_all_build.log
     "-- triad: TRIAD_WITH_CUDA=ON TRIAD_WITH_MPI=OFF NCCL=${nccl} cuDNN=OFF gzip= zstd=OFF\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E tar cJf ${WORK}/prebuilt/triad-gpu.tar.xz ${packed}
                WORKING_DIRECTORY ${WORK}/stage RESULT_VARIABLE rc)
get_filename_component(gpu_dir ${SCRIPT} DIRECTORY)
execute_process(COMMAND bash ${gpu_dir}/source_stamp.sh OUTPUT_VARIABLE stamp RESULT_VARIABLE rc2
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT stamp MATCHES "^[0-9a-f]+$")
  message(FATAL_ERROR "could not make the pack (tar ${rc}, source_stamp.sh ${rc2}: '${stamp}')")
endif()
file(WRITE ${WORK}/prebuilt/stamp "${stamp}\n")

# The script never compiles here: a `cmake` first on its PATH says it was
# called and fails, so a pack it should have unpacked fails at once.
file(WRITE ${WORK}/no_cmake/cmake "#!/bin/sh\necho \"cmake called: $*\"\nexit 1\n")
file(CHMOD ${WORK}/no_cmake/cmake PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)

# run_all ENV... : the script with these environment settings (later ones
# win); its output in `out`, its exit status in `rc`.
function(run_all)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PATH=${WORK}/no_cmake:$ENV{PATH}"
                          BUILD_DIR=${WORK}/build PREBUILT=${WORK}/prebuilt ${ARGN} bash ${SCRIPT}
                  RESULT_VARIABLE code OUTPUT_VARIABLE text ERROR_VARIABLE text)
  message(STATUS "${text}")
  set(out "${text}" PARENT_SCOPE)
  set(rc "${code}" PARENT_SCOPE)
endfunction()

run_all("STAGES=build tests" OUT=${WORK}/out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "run_all.sh exited ${rc}")
endif()
if(NOT out MATCHES "== build: unpacking [^\n]*triad-gpu.tar.xz [(]made from these sources, ${stamp}[)]")
  message(FATAL_ERROR "run_all.sh did not unpack the pack made from these sources")
endif()
foreach(entry IN LISTS expected)
  string(REGEX MATCH "^[^ ]+" test "${entry}")
  if(NOT out MATCHES "\nskipped  ${test} [(]no GPU[)]")
    message(FATAL_ERROR "run_all.sh did not report ${test} as skipped")
  endif()
endforeach()
if(out MATCHES "\n(passed|FAILED|TIMEOUT) ")
  message(FATAL_ERROR "run_all.sh reported a gpu test as run without a GPU")
endif()
if(NOT out MATCHES "== done, status 0")
  message(FATAL_ERROR "run_all.sh did not finish with status 0")
endif()
foreach(log gpu_tests.log summary.log build.log)
  if(NOT EXISTS ${WORK}/out/${log})
    message(FATAL_ERROR "run_all.sh left no ${log} in OUT")
  endif()
endforeach()

# A second call on the same machine (SKIP_BUILD=1) runs the programs
# unpacked by the first, still pointed at the machine's CUDA and NCCL.
run_all(SKIP_BUILD=1 "STAGES=tests" OUT=${WORK}/out_again)
if(NOT rc EQUAL 0 OR NOT out MATCHES "== programs from a pack: the CUDA runtime and NCCL also from"
   OR out MATCHES "== build")
  message(FATAL_ERROR "run_all.sh SKIP_BUILD=1 after an unpacked pack did not find its libraries")
endif()

# The profile stage with a stand-in ncu: its report imported into ncu.csv,
# each kernel's time and bandwidth in the summary, ncu's progress lines
# left out; a profiler that cannot read the counters leaves no report, and
# the run says so without failing.
file(WRITE ${WORK}/ncu/ncu [=[#!/bin/sh
case " $* " in
  *" --import "*)
    echo '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    k='"void triad::kernels::(anonymous namespace)::ln_backward_fused_kernel<__nv_bfloat16, 8, true, false>(const T1 *, long)"'
    echo '"0",'"$k"',"GPU Speed Of Light Throughput","Duration","usecond","66.70"'
    echo '"0",'"$k"',"GPU Speed Of Light Throughput","DRAM Throughput","%","41.20"'
    echo '"1","adamw_multi_kernel","GPU Speed Of Light Throughput","Duration","usecond","3200"'
    exit 0 ;;
esac
report=
while [ $# -gt 0 ]; do
  [ "$1" = -o ] && report=$2
  shift
done
echo "==PROF== Connected to process 1"
echo '==PROF== Profiling "ln_backward_fused_kernel" - 0: 0%....50%....100% - 38 passes'
echo '{"kernel": "layer_norm_backward", "ms": 1}'
[ -n "$report" ] && : >"$report.ncu-rep" && echo "==PROF== Report: $report.ncu-rep"
]=])
file(WRITE ${WORK}/ncu/no_counters [=[#!/bin/sh
echo "==ERROR== Failed to initialize the profiler: LibraryNotLoaded"
exit 1
]=])
file(CHMOD ${WORK}/ncu/ncu ${WORK}/ncu/no_counters PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
run_all(SKIP_BUILD=1 STAGES=profile NCU=${WORK}/ncu/ncu OUT=${WORK}/out_profile)
if(NOT rc EQUAL 0 OR NOT out MATCHES "==PROF== Report: " OR out MATCHES "Profiling \""
   OR out MATCHES "\"kernel\"" OR NOT out MATCHES "   2 kernels profiled"
   OR NOT out MATCHES "   ln_backward_fused_kernel<__nv_bfloat16, 8, true, false>: Duration 66.70 usecond, DRAM Throughput 41.20 %"
   OR NOT EXISTS ${WORK}/out_profile/ncu.csv)
  message(FATAL_ERROR "run_all.sh's profile stage did not report the stand-in ncu's kernels")
endif()
run_all(SKIP_BUILD=1 STAGES=profile NCU=${WORK}/ncu/no_counters OUT=${WORK}/out_no_counters)
if(NOT rc EQUAL 0 OR NOT out MATCHES "==ERROR== Failed to initialize the profiler"
   OR NOT out MATCHES "no report: ncu could not profile here")
  message(FATAL_ERROR "run_all.sh's profile stage did not say that ncu could not profile")
endif()

run_all("STAGES=tests kernels" BUDGET_S=1 OUT=${WORK}/out_budget)
if(rc EQUAL 0)
  message(FATAL_ERROR "run_all.sh exited 0 with its steps skipped for the budget")
endif()
foreach(step tests kernels)
  if(NOT out MATCHES "skipped for the budget[^\n]*\n([^\n]*\n)*   STAGES=${step}\n")
    message(FATAL_ERROR "run_all.sh did not name STAGES=${step} as skipped for the budget")
  endif()
endforeach()

file(WRITE ${WORK}/prebuilt/stamp "0123456789abcdef\n")
file(REMOVE_RECURSE ${WORK}/build)
run_all(STAGES=build OUT=${WORK}/out_stale)
if(rc EQUAL 0 OR NOT out MATCHES "was made from other sources [(]0123456789abcdef, these are ${stamp}[)]: compiling"
   OR NOT out MATCHES "cmake called: -S" OR EXISTS ${WORK}/build/examples/triad-devices)
  message(FATAL_ERROR "run_all.sh did not refuse a pack made from other sources")
endif()

# A suite that crashes after A.one passed and A.two failed: A.three and
# A.four are rerun (A.four fails alone too, and goes to the sanitizer).
file(MAKE_DIRECTORY ${WORK}/crash/examples ${WORK}/crash/tests)
file(WRITE ${WORK}/crash/examples/triad-devices "#!/bin/sh\necho 'a stand-in device'\n")
file(WRITE ${WORK}/crash/tests/triad_gpu_tests [=[#!/bin/sh
case "$1" in
  --gtest_list_tests) printf 'A.\n  one\n  two\n  three\n  four\n' ;;
  --gtest_filter=A.three) echo "[       OK ] A.three (1 ms)" ;;
  --gtest_filter=A.four) echo "[  FAILED  ] A.four (1 ms)"; exit 1 ;;
  *) echo "[       OK ] A.one (1 ms)"; echo "[  FAILED  ] A.two (1 ms)"; kill -SEGV $$ ;;
esac
]=])
file(WRITE ${WORK}/crash/sanitizer "#!/bin/sh\necho \"sanitizer ran: $*\"\n")
foreach(program examples/triad-devices tests/triad_gpu_tests sanitizer)
  file(CHMOD ${WORK}/crash/${program} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endforeach()
run_all(BUILD_DIR=${WORK}/crash STAGES=tests OUT=${WORK}/out_crash
        COMPUTE_SANITIZER=${WORK}/crash/sanitizer)
file(READ ${WORK}/out_crash/gpu_tests.log log)
if(rc EQUAL 0 OR NOT out MATCHES "\nFAILED   gpu.conformance [(]exit 139[)]"
   OR NOT out MATCHES "\nok      A.three\nFAILED  A.four\n"
   OR out MATCHES "\n(ok|FAILED) +A[.](one|two)\n"
   OR NOT log MATCHES "sanitizer ran: --tool memcheck [^\n]*--gtest_filter=A.four\n"
   OR log MATCHES "sanitizer ran: [^\n]*A[.](one|two|three)")
  message(FATAL_ERROR "run_all.sh did not rerun just the tests the crashed suite left unfinished")
endif()

# The device's ceilings by its name (the device tool lends H100s and
# H200s): bench_kernels_gpu gets the bandwidth and the peak of the GPU that
# nvidia-smi names (a stand-in here, as is the benchmark, which prints its
# arguments), a GPU other than an H200 is told the targets are not its, and
# HBM_GBS and PEAK_TFLOPS win over the name.
file(MAKE_DIRECTORY ${WORK}/ceilings/examples ${WORK}/ceilings/benchmarks ${WORK}/smi)
file(WRITE ${WORK}/ceilings/examples/triad-devices "#!/bin/sh\necho 'a stand-in device'\n")
file(WRITE ${WORK}/ceilings/benchmarks/bench_kernels_gpu "#!/bin/sh\necho \"kernels bench: $*\"\n")
file(WRITE ${WORK}/smi/nvidia-smi [=[#!/bin/sh
case "$*" in
  *--query-gpu=name\ *) echo "$STANDIN_GPU" ;;
  *) echo "name, driver_version"; echo "$STANDIN_GPU, 580" ;;
esac
]=])
foreach(program ceilings/examples/triad-devices ceilings/benchmarks/bench_kernels_gpu smi/nvidia-smi)
  file(CHMOD ${WORK}/${program} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endforeach()
set(smi_path "PATH=${WORK}/smi:${WORK}/no_cmake:$ENV{PATH}")
run_all(BUILD_DIR=${WORK}/ceilings STAGES=kernels OUT=${WORK}/out_h100 ${smi_path}
        "STANDIN_GPU=NVIDIA H100 80GB HBM3")
if(NOT rc EQUAL 0 OR NOT out MATCHES "kernels bench: --hbm-gbs 3350 --peak-tflops 989"
   OR NOT out MATCHES "planner cluster configs/clusters/dgx_h100.yaml"
   OR NOT out MATCHES "not an H200: the targets")
  message(FATAL_ERROR "run_all.sh did not take an H100's ceilings on an H100")
endif()
run_all(BUILD_DIR=${WORK}/ceilings STAGES=kernels OUT=${WORK}/out_h200 ${smi_path}
        "STANDIN_GPU=NVIDIA H200")
if(NOT rc EQUAL 0 OR NOT out MATCHES "kernels bench: --hbm-gbs 4800 --peak-tflops 989"
   OR NOT out MATCHES "planner cluster configs/clusters/hgx_h200.yaml" OR out MATCHES "not an H200")
  message(FATAL_ERROR "run_all.sh did not take an H200's ceilings on an H200")
endif()
run_all(BUILD_DIR=${WORK}/ceilings STAGES=kernels OUT=${WORK}/out_given ${smi_path}
        "STANDIN_GPU=NVIDIA H100 PCIe" HBM_GBS=1234 PEAK_TFLOPS=567)
if(NOT rc EQUAL 0 OR NOT out MATCHES "kernels bench: --hbm-gbs 1234 --peak-tflops 567")
  message(FATAL_ERROR "run_all.sh did not keep the HBM_GBS and PEAK_TFLOPS it was given")
endif()
run_all(BUILD_DIR=${WORK}/ceilings STAGES=kernels OUT=${WORK}/out_unknown ${smi_path}
        "STANDIN_GPU=NVIDIA A10")
if(NOT rc EQUAL 0 OR NOT out MATCHES "unknown GPU 'NVIDIA A10': an H200's ceilings assumed"
   OR NOT out MATCHES "kernels bench: --hbm-gbs 4800 --peak-tflops 989")
  message(FATAL_ERROR "run_all.sh did not say it assumed an H200's ceilings for an unknown GPU")
endif()

# The training stage's run of every switch that helped 350M alone, all on
# at once: a stand-in bench_train_gpu (each switch moves its tokens/s: the
# autotune +2%, the add-norm sums +0.5%, --sync-free +1%, the epilogues
# -0.5% and -1%) must be called once more with exactly the three that
# helped, and the table must show that run.
file(WRITE ${WORK}/ceilings/benchmarks/bench_train_gpu [=[#!/bin/sh
preset=124m batch=16 tps=100000 extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift ;;
    --batch) batch=$2; shift ;;
    --gemm-autotune)
      extra="$extra,\"gemm_autotune\":{\"candidates\":$2,\"problems\":40,\"changed\":3}"
      tps=$((tps + 2000)); shift ;;
    --add-norm-bias-sums) extra="$extra,\"add_norm_bias_sums\":true"; tps=$((tps + 500)) ;;
    --sync-free) extra="$extra,\"sync_free\":true"; tps=$((tps + 1000)) ;;
    --bias-grad-epilogue) extra="$extra,\"bias_grad_epilogue\":true"; tps=$((tps - 500)) ;;
    --dgelu-bias-grad-epilogue)
      extra="$extra,\"dgelu_bias_grad_epilogue\":true"; tps=$((tps - 1000)) ;;
    --experts) extra="$extra,\"experts\":$2"; shift ;;
    --recompute) extra="$extra,\"recompute\":\"$2\""; shift ;;
    --vocab) extra="$extra,\"vocab\":$2"; shift ;;
    --attention-nondeterministic) extra="$extra,\"attention_deterministic\":false" ;;
    --*) case "$2" in --* | "") ;; *) shift ;; esac ;;
  esac
  shift
done
echo "{\"impl\":\"triad\",\"preset\":\"$preset\",\"batch\":$batch,\"seq\":1024,\"tokens_per_s\":$tps$extra}"
]=])
file(CHMOD ${WORK}/ceilings/benchmarks/bench_train_gpu PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
run_all(BUILD_DIR=${WORK}/ceilings STAGES=train OUT=${WORK}/out_train ${smi_path}
        "STANDIN_GPU=NVIDIA H200" SKIP_TORCH=1)
if(NOT rc EQUAL 0
   OR NOT out MATCHES "350M with every switch that made it faster alone: --gemm-autotune 8 --add-norm-bias-sums --sync-free[)]"
   OR NOT out MATCHES "\n\\| 350m \\| 16 \\| add-norm-bias-sums, sync-free, gemm-autotune 8 [(]3 of 40 products changed[)] \\| 103[.]5k \\| [^\n]* \\| [+]3[.]50% \\|")
  message(FATAL_ERROR "run_all.sh did not run 350M once more with the switches that helped alone")
endif()
