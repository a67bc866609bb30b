# train.cuda_graph under data parallelism, two ranks on simulated GPUs: each
# layout of LAYOUTS ('@'-separated --set flags) trains captured as it trains
# uncaptured, every step's loss and gradient norm to the last digit, and
# says it captured its passes and the gradients' reductions with them:
# NCCL's calls (here the mock's, over MPI) join the capture, and every one
# of the several buckets (parallel.bucket_mb 0.01) starts inside the
# backward pass, as uncaptured. ZeRO-1's gathers are waited for before each
# replay. The output z-loss and multi-token prediction's losses are
# compared too where a layout has them. Tensor parallelism is refused by
# name.
# Variables: TRAIN (triad-train-sim), MPIRUN (list), CONFIG, DATA, WORK,
# LAYOUTS.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set device=cuda --set train.steps=4
    --set model.d_model=32 --set model.n_layer=2 --set model.seq_len=32
    --set train.global_batch_size=8 --set train.micro_batch_size=2 --set log.interval=1
    --set parallel.dp=2 --set parallel.bucket_mb=0.01)
string(REPLACE "@" ";" layouts "${LAYOUTS}")
set(i 0)
foreach(layout IN LISTS layouts)
  separate_arguments(flags UNIX_COMMAND "${layout}")
  run("uncaptured (${layout})" ${MPIRUN} -np 2 ${TRAIN} ${common} ${flags}
      --set output.dir=${WORK}/eager${i})
  run("captured (${layout})" ${MPIRUN} -np 2 ${TRAIN} ${common} ${flags}
      --set train.cuda_graph=true --set output.dir=${WORK}/graph${i})
  expect_captured_as_uncaptured("${layout}" "${run_output}" ${WORK}/eager${i} ${WORK}/graph${i} 4
                                losses)
  if(NOT run_output MATCHES "the gradients' reductions too, ([0-9]+) of ([0-9]+) buckets during")
    message(FATAL_ERROR "${layout}: the captured run did not capture its reductions:\n${run_output}")
  endif()
  if(NOT CMAKE_MATCH_1 EQUAL CMAKE_MATCH_2 OR CMAKE_MATCH_2 LESS 3)
    message(FATAL_ERROR "${layout}: ${CMAKE_MATCH_1} of ${CMAKE_MATCH_2} buckets were reduced "
                        "during the captured backward pass (all of 3 or more expected)")
  endif()
  message(STATUS "${layout}: the same losses and norms captured (${losses})")
  math(EXPR i "${i} + 1")
endforeach()
# Tensor parallelism exchanges inside the passes: refused by name.
run_expecting_error("captured tp 2" "train.cuda_graph: one process or data parallelism alone \\(this run has tp 2, pp 1, cp 1, ep 1"
                    ${MPIRUN} -np 2 ${TRAIN} ${common} --set parallel.dp=1 --set parallel.tp=2
                    --set train.cuda_graph=true --set output.dir=${WORK}/tp)
