# triad-export end to end: train CONFIG for 20 steps of 4 sequences, export the run to
# Hugging Face's layout, and sample (temperature 1, a fixed seed: every
# probability matters) from the run and from the exported directory
# (init.from's reader), and from the same export in shards: the texts must
# be the same, and config.json must name the expected class. EXTRA: more
# --set flags for the run; EXPORT_ARGS: more flags for triad-export.
#   -DTRAIN= -DEXPORT= -DGENERATE= -DCONFIG= -DDATA= -DWORK= -DCLASS= [-DLOG=regex]
#   [-DEXTRA=] [-DEXPORT_ARGS=]
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
separate_arguments(export_args UNIX_COMMAND "${EXPORT_ARGS}")
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set train.steps=20
                        --set train.warmup_steps=5 --set train.global_batch_size=4
                        --set train.micro_batch_size=4 --set output.dir=${WORK}/run ${extra}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "training failed (${rc}):\n${out}")
endif()
if(DEFINED LOG AND NOT out MATCHES "${LOG}")
  message(FATAL_ERROR "the training log does not say '${LOG}':\n${out}")
endif()
execute_process(COMMAND ${EXPORT} --run ${WORK}/run --output ${WORK}/hf ${export_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "triad-export failed (${rc}):\n${out}")
endif()
file(READ ${WORK}/hf/config.json json)
if(NOT json MATCHES "\"${CLASS}\"")
  message(FATAL_ERROR "config.json does not name ${CLASS}:\n${json}")
endif()
set(sample --prompt "Once upon" --tokens 60 --temperature 1 --top-k 0 --seed 5 --stop-token -1)
execute_process(COMMAND ${GENERATE} --run ${WORK}/run ${sample}
                RESULT_VARIABLE rc1 OUTPUT_VARIABLE from_run ERROR_VARIABLE err1)
execute_process(COMMAND ${GENERATE} --config ${WORK}/run/config.yaml --weights ${WORK}/hf ${sample}
                RESULT_VARIABLE rc2 OUTPUT_VARIABLE from_hf ERROR_VARIABLE err2)
if(rc1 OR rc2)
  message(FATAL_ERROR "triad-generate failed (${rc1}, ${rc2}):\n${err1}\n${err2}")
endif()
if(NOT from_run STREQUAL from_hf OR NOT from_run MATCHES "^Once upon")
  message(FATAL_ERROR "samples differ:\nrun: ${from_run}\nexported: ${from_hf}")
endif()
# Past --max-shard-size: Hugging Face's shards and index, the same sample.
execute_process(COMMAND ${EXPORT} --run ${WORK}/run --output ${WORK}/hf_sharded
                        --max-shard-size 64KiB ${export_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc OR NOT out MATCHES "shards \\(model-00001-of-")
  message(FATAL_ERROR "triad-export --max-shard-size failed (${rc}):\n${out}")
endif()
file(GLOB shards ${WORK}/hf_sharded/model-*-of-*.safetensors)
list(LENGTH shards n)
if(n LESS 2 OR NOT EXISTS ${WORK}/hf_sharded/model.safetensors.index.json
   OR EXISTS ${WORK}/hf_sharded/model.safetensors)
  message(FATAL_ERROR "expected shards and an index, got ${n} shards: ${shards}")
endif()
execute_process(COMMAND ${GENERATE} --config ${WORK}/run/config.yaml --weights ${WORK}/hf_sharded
                        ${sample}
                RESULT_VARIABLE rc3 OUTPUT_VARIABLE from_shards ERROR_VARIABLE err3)
if(rc3 OR NOT from_run STREQUAL from_shards)
  message(FATAL_ERROR "samples differ (${rc3}):\nrun: ${from_run}\nshards: ${from_shards}\n${err3}")
endif()
message(STATUS "same sample from the run and its export: ${from_run}")
