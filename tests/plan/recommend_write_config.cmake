# triad-plan recommend --config RUN --write-config BEST: BEST is RUN with the
# best layout's settings (RUN's other keys kept), `predict --config BEST`
# prices it exactly as recommend did (step time, memory, layout), and --json
# lists the layout's settings (trainer_settings, for triad-train's --set).
# With TRAIN and MPIRUN, BEST then trains on GPUS ranks, in the layout the
# planner chose (its log's "parallel:" line). With PREDICT (layout options),
# `predict --config RUN PREDICT --write-config` writes what it prices too.
#   -DPLAN= -DCLUSTER= -DGPUS= -DWORK= and -DCONFIG= (a triad-train config) or
#   -DMODEL= (a model section, given a batch and data here)
#   [-DPREDICT=] [-DTRAIN= -DMPIRUN= -DDATA=]
include(${CMAKE_CURRENT_LIST_DIR}/../train/e2e_common.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/plan_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
if(MODEL)
  file(READ ${MODEL} model_text)
  set(CONFIG ${WORK}/run.yaml)
  file(WRITE ${CONFIG} "${model_text}\n"
                       "train: {steps: 10, global_batch_size: 128, micro_batch_size: 1, "
                       "precision: bf16}\ndata: {train: data/none.bin}\noutput: {dir: out/none}\n")
endif()
set(best ${WORK}/best.yaml)
# (Their JSON on stdout; warnings go to stderr.)
run_for_stdout(recommend recommended ${PLAN} recommend --config ${CONFIG} --cluster ${CLUSTER}
               --gpus ${GPUS} --top 1 --json --write-config ${best})
run_for_stdout(predict predicted ${PLAN} predict --config ${best} --cluster ${CLUSTER} --json)
expect_same_pricing("recommend, then predict --config of what it wrote," "${recommended}" 0
                    "${predicted}")
# predict --config ... --write-config likewise writes the layout its options
# give (PREDICT: those options).
if(PREDICT)
  run_for_stdout(predict predicted_first ${PLAN} predict --config ${CONFIG} --cluster ${CLUSTER}
                 --gpus ${GPUS} ${PREDICT} --json --write-config ${WORK}/predicted.yaml)
  run_for_stdout(predict predicted_again ${PLAN} predict --config ${WORK}/predicted.yaml
                 --cluster ${CLUSTER} --json)
  expect_same_pricing("predict ${PREDICT}, then predict --config of what it wrote,"
                    "${predicted_first}" "" "${predicted_again}")
endif()
file(READ ${best} written)
# --json lists the layout's settings for triad-train's --set.
string(JSON count LENGTH "${recommended}" 0 trainer_settings)
string(JSON tp GET "${recommended}" 0 tp)
string(JSON first GET "${recommended}" 0 trainer_settings 0)
if(count LESS 19 OR NOT first STREQUAL "parallel.tp=${tp}")
  message(FATAL_ERROR "trainer settings: ${recommended}")
endif()
# RUN's own keys stay.
file(READ ${CONFIG} given)
string(REGEX MATCH "steps: [0-9]+" steps "${given}")
if(NOT written MATCHES "${steps}")
  message(FATAL_ERROR "${best} lost the config's '${steps}':\n${written}")
endif()
if(TRAIN)
  run(training ${MPIRUN} -np ${GPUS} ${TRAIN} --config ${best} --set data.train=${DATA}
      --set train.steps=2 --set log.interval=1 --set output.dir=${WORK}/out)
  string(JSON pp GET "${recommended}" 0 pp)
  string(JSON dp GET "${recommended}" 0 dp)
  if(NOT run_output MATCHES "parallel: tp ${tp} x pp ${pp} x dp ${dp} over ${GPUS} ranks"
     OR NOT run_output MATCHES "step +2/2")
    message(FATAL_ERROR "the recommended config (tp ${tp}, pp ${pp}, dp ${dp}) did not train "
                        "so:\n${run_output}")
  endif()
endif()
