# train.cuda_graph on the simulated GPU across the model families' tiny
# configs: each entry of RUNS ('@'-separated "config.yaml|--set ..." pairs,
# the config a file under CONFIG_DIR) trains 4 steps of 2 micro-batches (in
# bf16 unless the flags say otherwise) captured as it trains uncaptured, every step's loss, gradient norm,
# output z-loss and multi-token prediction losses to the last digit, and
# says it captured its passes.
# Variables: TRAIN (triad-train-sim), CONFIG_DIR, DATA, WORK, RUNS.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
string(REPLACE "@" ";" runs "${RUNS}")
set(i 0)
foreach(run IN LISTS runs)
  string(REPLACE "|" ";" parts "${run}")
  list(GET parts 0 config)
  set(flags)
  list(LENGTH parts n)
  if(n GREATER 1)
    list(GET parts 1 extra)
    separate_arguments(flags UNIX_COMMAND "${extra}")
  endif()
  set(common --config ${CONFIG_DIR}/${config} --set data.train=${DATA} --set device=cuda
      --set train.steps=4 --set model.n_layer=2 --set model.seq_len=32
      --set train.global_batch_size=4 --set train.micro_batch_size=2 --set train.precision=bf16
      --set log.interval=1 --set data.val=null --set eval.interval=0 ${flags})
  run("${run} uncaptured" ${TRAIN} ${common} --set output.dir=${WORK}/eager${i})
  run("${run} captured" ${TRAIN} ${common} --set train.cuda_graph=true
      --set output.dir=${WORK}/graph${i})
  expect_captured_as_uncaptured("${run}" "${run_output}" ${WORK}/eager${i} ${WORK}/graph${i} 4
                                losses)
  message(STATUS "${run}: the same losses captured (${losses})")
  math(EXPR i "${i} + 1")
endforeach()
