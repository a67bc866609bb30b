# A LoRA run's PEFT adapter merged onto its base as the base is read
# (--adapter, as init.adapter): the base model (exported in Hugging Face's
# names, as a base read from Hugging Face is) with the adapter samples what
# the LoRA run's own merged model samples, and exports to a model that
# does too. A checkpoint is refused, naming why.
#   -DTRAIN= -DEXPORT= -DGENERATE= -DCONFIG= -DDATA= -DWORK=
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set train.global_batch_size=4
    --set train.micro_batch_size=4 --set train.warmup_steps=1)
run("base run" ${TRAIN} ${common} --set train.steps=2 --set output.dir=${WORK}/base
    --set checkpoint.dir=${WORK}/ck --set checkpoint.interval=2)
run("base export" ${EXPORT} --run ${WORK}/base --output ${WORK}/base_hf)
run("LoRA run" ${TRAIN} ${common} --set train.steps=3 --set output.dir=${WORK}/lora
    --set init.from=${WORK}/base_hf --set "model.lora={rank: 4, alpha: 8}" --set train.lr=5e-2)
if(NOT EXISTS ${WORK}/lora/adapter/adapter_model.safetensors)
  message(FATAL_ERROR "the LoRA run wrote no PEFT adapter")
endif()
set(sample --prompt "Once upon" --tokens 40 --temperature 0 --stop-token -1)
function(sample_of out)
  execute_process(COMMAND ${GENERATE} ${ARGN} ${sample}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "triad-generate ${ARGN} failed (${rc}):\n${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
sample_of(tuned --run ${WORK}/lora)
sample_of(adapted --config ${WORK}/base/config.yaml --weights ${WORK}/base_hf
          --adapter ${WORK}/lora/adapter)
sample_of(plain --config ${WORK}/base/config.yaml --weights ${WORK}/base_hf)
if(NOT tuned STREQUAL adapted)
  message(FATAL_ERROR "the base with the adapter samples\n${adapted}\nthe LoRA run\n${tuned}")
endif()
if(plain STREQUAL tuned)
  message(FATAL_ERROR "the adapter changed nothing: both sample\n${plain}")
endif()
run("export with the adapter" ${EXPORT} --config ${WORK}/base/config.yaml --weights ${WORK}/base_hf
    --adapter ${WORK}/lora/adapter --output ${WORK}/adapted_hf)
sample_of(exported --config ${WORK}/base/config.yaml --weights ${WORK}/adapted_hf)
if(NOT exported STREQUAL tuned)
  message(FATAL_ERROR "the export with the adapter samples\n${exported}\nthe LoRA run\n${tuned}")
endif()
execute_process(COMMAND ${EXPORT} --checkpoint ${WORK}/ck --adapter ${WORK}/lora/adapter
                        --output ${WORK}/never
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0 OR NOT out MATCHES "is merged into a weights file .--weights or --run., not a checkpoint")
  message(FATAL_ERROR "--adapter with a checkpoint: expected a refusal, got (${rc}):\n${out}")
endif()
