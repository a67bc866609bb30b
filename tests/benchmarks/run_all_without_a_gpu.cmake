# benchmarks/gpu/run_all.sh's test stage on a machine without a GPU: the
# script must run to its end, list each gpu test as skipped (never passed)
# and finish with status 0. A broken script would cost a lent GPU's whole
# call, so CI runs it. It runs against a build directory of its own that
# holds only the gpu tests (so its ctest does not share the outer run's
# logs), each pointing at this build's programs.
# Variables: SCRIPT (run_all.sh), WORK, DEVICES (triad-devices),
# GPU_TESTS (triad_gpu_tests).
execute_process(COMMAND ${DEVICES} --require RESULT_VARIABLE none OUTPUT_QUIET ERROR_QUIET)
if(none EQUAL 0)
  message(STATUS "run_all.sh check skipped: a GPU is visible (the gpu label runs the real suite)")
  return()
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/build/examples ${WORK}/build/tests ${WORK}/out)
file(CREATE_LINK ${DEVICES} ${WORK}/build/examples/triad-devices SYMBOLIC)
file(CREATE_LINK ${GPU_TESTS} ${WORK}/build/tests/triad_gpu_tests SYMBOLIC)
file(WRITE ${WORK}/build/CTestTestfile.cmake
     "add_test(gpu.devices \"${DEVICES}\" \"--require\")\n"
     "set_tests_properties(gpu.devices PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)\n"
     "add_test(gpu.conformance \"${GPU_TESTS}\")\n"
     "set_tests_properties(gpu.conformance PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E env BUILD_DIR=${WORK}/build STAGES=tests
                        OUT=${WORK}/out bash ${SCRIPT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "run_all.sh exited ${rc}")
endif()
foreach(test gpu.devices gpu.conformance)
  if(NOT out MATCHES "Test +#[0-9]+: ${test} [.]+[*]+Skipped")
    message(FATAL_ERROR "run_all.sh did not report ${test} as skipped")
  endif()
endforeach()
if(NOT out MATCHES "== done, status 0")
  message(FATAL_ERROR "run_all.sh did not finish with status 0")
endif()
if(NOT EXISTS ${WORK}/out/gpu_tests.log OR NOT EXISTS ${WORK}/out/summary.log)
  message(FATAL_ERROR "run_all.sh left no gpu_tests.log or summary.log in OUT")
endif()
