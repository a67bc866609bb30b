# A checkpoint as a model. triad-export --checkpoint: the run's last
# checkpoint exports to the same bytes as its final model (the same tensors
# in the same order), an earlier one to other weights, and a path that is no
# checkpoint or a config it does not fit is refused, naming why.
# triad-generate --checkpoint samples as the run does, and a new run with
# init.from the checkpoint trains as one from the final model. --average 2
# (the mean of steps 3 and 6) exports weights of neither; --average 1 is the
# latest alone, and more checkpoints than there are is refused. The run
# keeps an average of its weights (train.ema_decay): --ema exports the run's
# model_ema.safetensors and the last checkpoint's average to the same bytes,
# other than the weights'.
# EXTRA: more --set flags for the training run (model.lora: its adapters
# are merged into the run's model and into what is read of a checkpoint).
#   -DTRAIN= -DEXPORT= -DGENERATE= -DCONFIG= -DOTHER_CONFIG= -DDATA= -DWORK= [-DEXTRA=]
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
set(batch --set train.global_batch_size=4 --set train.micro_batch_size=4)
run(training ${TRAIN} --config ${CONFIG} --set data.train=${DATA} ${batch} --set train.steps=6
    --set train.warmup_steps=2 --set output.dir=${WORK}/run --set checkpoint.dir=${WORK}/ck
    --set checkpoint.interval=3 --set train.ema_decay=0.8 ${extra})
run("export of the run" ${EXPORT} --run ${WORK}/run --output ${WORK}/from_run)
run("export of the latest checkpoint" ${EXPORT} --checkpoint ${WORK}/ck --output ${WORK}/latest)
run("export of step 3" ${EXPORT} --checkpoint ${WORK}/ck/step_3 --output ${WORK}/step3)
run("export of the mean of steps 3 and 6" ${EXPORT} --checkpoint ${WORK}/ck --average 2
    --output ${WORK}/mean)
run("export of the latest one averaged alone" ${EXPORT} --checkpoint ${WORK}/ck --average 1
    --output ${WORK}/alone)
# expect_files(same|different A B why): the two files' bytes must be the
# same (or differ), else the test fails saying why.
function(expect_files want a b why)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${a} ${b} RESULT_VARIABLE differ)
  if((want STREQUAL "same" AND differ) OR (want STREQUAL "different" AND NOT differ))
    message(FATAL_ERROR "${why}")
  endif()
endfunction()
foreach(other latest step3)
  expect_files(different ${WORK}/mean/model.safetensors ${WORK}/${other}/model.safetensors
               "the mean of steps 3 and 6 is ${other}'s weights")
endforeach()
expect_files(same ${WORK}/alone/model.safetensors ${WORK}/latest/model.safetensors
             "--average 1 is not the latest checkpoint's weights")
foreach(f model.safetensors config.json)
  expect_files(same ${WORK}/from_run/${f} ${WORK}/latest/${f}
               "the last checkpoint's ${f} differs from the run's")
endforeach()
expect_files(different ${WORK}/latest/model.safetensors ${WORK}/step3/model.safetensors
             "step 3's weights are step 6's")
# triad-generate --checkpoint samples what the run's model samples.
set(sample --prompt "Once upon" --tokens 40 --temperature 1 --top-k 0 --seed 3 --stop-token -1)
execute_process(COMMAND ${GENERATE} --run ${WORK}/run ${sample}
                RESULT_VARIABLE rc1 OUTPUT_VARIABLE from_run ERROR_VARIABLE err1)
execute_process(COMMAND ${GENERATE} --checkpoint ${WORK}/ck ${sample}
                RESULT_VARIABLE rc2 OUTPUT_VARIABLE from_checkpoint ERROR_VARIABLE err2)
if(rc1 OR rc2 OR NOT from_run STREQUAL from_checkpoint OR NOT from_run MATCHES "^Once upon")
  message(FATAL_ERROR "samples differ (${rc1}, ${rc2}):\nrun: ${from_run}\ncheckpoint: "
                      "${from_checkpoint}\n${err1}\n${err2}")
endif()
run("export of the run's average" ${EXPORT} --run ${WORK}/run --ema --output ${WORK}/ema_run)
run("export of the latest checkpoint's average" ${EXPORT} --checkpoint ${WORK}/ck --ema
    --output ${WORK}/ema_latest)
expect_files(same ${WORK}/ema_run/model.safetensors ${WORK}/ema_latest/model.safetensors
             "the last checkpoint's average exports other weights than model_ema.safetensors")
expect_files(different ${WORK}/ema_run/model.safetensors ${WORK}/from_run/model.safetensors
             "--ema exports the run's weights, not their average")
# init.from a checkpoint: the same losses as from the run's model.
expect_init_from_checkpoint("one process" ${WORK}/ck ${WORK}/run/model.safetensors ${WORK}
                            ${TRAIN} --config ${CONFIG} --set data.train=${DATA} ${batch}
                            --set train.steps=3)
# Refusals.
function(refused what expected)
  run_expecting_error("${what}" "${expected}" ${EXPORT} ${ARGN})
endfunction()
refused("a run directory" "neither a checkpoint .a step_<N> directory with manifest.json., a checkpoint.dir"
        --checkpoint ${WORK}/run --output ${WORK}/never)
refused("another model" "holds no parameter '[^']+', which the configured model has"
        --checkpoint ${WORK}/ck --config ${OTHER_CONFIG} --output ${WORK}/never)
refused("both sources" "give --weights or --checkpoint, not both"
        --checkpoint ${WORK}/ck --weights ${WORK}/run/model.safetensors --output ${WORK}/never)
refused("too many to average" "holds 2 checkpoint.s. up to step 6 .6, 3., not the 3 asked for"
        --checkpoint ${WORK}/ck --average 3 --output ${WORK}/never)
refused("averaging a run" "--average 2 averages checkpoints: give --checkpoint"
        --run ${WORK}/run --average 2 --output ${WORK}/never)
refused("--ema with a weights file" "--ema reads a run's averaged weights: give --run or --checkpoint, not --weights"
        --config ${WORK}/run/config.yaml --weights ${WORK}/run/model.safetensors --ema --output ${WORK}/never)
# A run that kept no average, and one whose name the system refuses (too
# long a name: the check for the average must not throw filesystem_error).
file(MAKE_DIRECTORY ${WORK}/plain_run)
file(COPY ${WORK}/run/config.yaml ${WORK}/run/model.safetensors DESTINATION ${WORK}/plain_run)
refused("--ema with a run that kept no average" "run '[^']*plain_run' has no model_ema.safetensors"
        --run ${WORK}/plain_run --ema --output ${WORK}/never)
string(REPEAT "r" 300 long_name)
refused("--ema with a run named past the system's limit" "has no model_ema.safetensors"
        --run ${WORK}/${long_name} --ema --output ${WORK}/never)
if(EXISTS ${WORK}/never)
  message(FATAL_ERROR "a refused export wrote ${WORK}/never")
endif()
message(STATUS "the last checkpoint exports, samples and starts a run as the run's model")
