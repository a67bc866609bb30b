# log.plan_cluster: triad-train logs the planner's price of its run on that
# cluster (and at the end, against what it measured) and writes it to
# output.dir/plan.json, which is what
# `triad-plan predict --config` prices for the run's resolved config
# (output.dir/config.yaml) on as many GPUs as the run's ranks; a cluster
# file that cannot be read stops the run before training, named. The end's
# comparison by phase takes the slowest rank's passes, data-parallel wait and
# optimizer from step 2's summary (log.interval 1: step 1's one-time costs
# left out), and with a pipeline the bubble.
#   -DTRAIN= -DPLAN= -DCONFIG= -DDATA= -DCLUSTER= -DWORK= [-DMPIRUN= -DRANKS= -DEXTRA=]
include(${CMAKE_CURRENT_LIST_DIR}/../train/e2e_common.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/plan_common.cmake)
file(REMOVE_RECURSE ${WORK})
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
if(NOT RANKS)
  set(RANKS 1)
endif()
set(launch ${TRAIN})
if(MPIRUN)
  set(launch ${MPIRUN} -np ${RANKS} ${TRAIN})
endif()
run(training ${launch} --config ${CONFIG} --set data.train=${DATA} --set train.steps=2
    --set log.interval=1 --set log.plan_cluster=${CLUSTER} --set output.dir=${WORK}/out ${extra})
if(NOT run_output MATCHES "plan [(][^)]+ on [^)]+[)]: [0-9.]+ ms a step, [0-9]+ tokens/s, .*MFU")
  message(FATAL_ERROR "no plan line in the log:\n${run_output}")
endif()
# ... and at the end, the plan against what the run measured.
if(NOT run_output MATCHES
   "plan against the run: [0-9.]+ ms a step planned, [0-9.]+ measured .*GB per GPU planned, [0-9.]+ measured at the peak")
  message(FATAL_ERROR "no plan-against-the-run line in the log:\n${run_output}")
endif()
if(NOT run_output MATCHES
   "plan against the run by phase, ms a step [(]measured: the slowest rank's[)]: passes ([0-9.]+) planned, ([0-9.]+) measured [(][0-9.]+x[)] [|] dp wait [0-9.]+ planned, [0-9.]+ measured [|] optimizer [0-9.]+ planned, [0-9.]+ measured([^\n]*)")
  message(FATAL_ERROR "no plan-against-the-run line by phase in the log:\n${run_output}")
endif()
set(planned_passes ${CMAKE_MATCH_1})
set(measured_passes ${CMAKE_MATCH_2})
set(rest "${CMAKE_MATCH_3}")
if(extra MATCHES "parallel.pp=[2-9]")
  if(NOT rest MATCHES "^ [|] bubble [0-9.]+% planned, [0-9.]+% measured")
    message(FATAL_ERROR "a pipeline's plan against the run has no bubble: '${rest}'")
  endif()
elseif(NOT rest STREQUAL "")
  message(FATAL_ERROR "without a pipeline, nothing after the optimizer: '${rest}'")
endif()
if(NOT planned_passes GREATER 0)
  message(FATAL_ERROR "the plan's passes are ${planned_passes} ms a step")
endif()
if(RANKS EQUAL 1)
  # One rank: its passes are step 2's forward and backward, more than
  # either, no more than its compute (the passes and the optimizer).
  file(STRINGS ${WORK}/out/metrics.jsonl lines)
  list(GET lines 1 second)
  string(JSON forward GET "${second}" rank_timing forward max_ms)
  string(JSON backward GET "${second}" rank_timing backward max_ms)
  string(JSON compute GET "${second}" rank_timing compute max_ms)
  if(NOT measured_passes GREATER forward OR NOT measured_passes GREATER backward
     OR measured_passes GREATER compute)
    message(FATAL_ERROR "measured passes ${measured_passes} ms against step 2's forward "
                        "${forward}, backward ${backward} and compute ${compute}")
  endif()
endif()
file(READ ${WORK}/out/plan.json planned)
run_for_stdout(predict predicted ${PLAN} predict --config ${WORK}/out/config.yaml --cluster ${CLUSTER}
               --gpus ${RANKS} --json)
expect_same_pricing("the run's plan.json, then predict --config of its config.yaml,"
                    "${planned}" "" "${predicted}")
# A cluster file that is not there: the run stops, naming it.
execute_process(COMMAND ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set train.steps=2
                        --set log.plan_cluster=${WORK}/nowhere.yaml --set output.dir=${WORK}/bad
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0 OR NOT out MATCHES "cluster file '[^']*nowhere.yaml'")
  message(FATAL_ERROR "a missing cluster file: exit ${rc}\n${out}")
endif()
if(EXISTS ${WORK}/bad/model.safetensors)
  message(FATAL_ERROR "the run with a missing cluster file trained")
endif()
