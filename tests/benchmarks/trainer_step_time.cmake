# run_all.sh's run of the example trainer, on the CPU at a toy size: the
# random shard benchmarks/gpu/trainer_step_time.py writes is one triad-train
# reads, benchmarks/gpu/trainer_350m.yaml is a config it takes (its model
# shrunk and its device the CPU here), and the summary is the median step
# after the warm-up as train.jsonl's triad-train line; bad arguments are
# refused by name.
# Variables: PYTHON, SCRIPT (trainer_step_time.py), CONFIG, TRAIN (triad-train), WORK.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run what)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
run("the shard" ${PYTHON} ${SCRIPT} shard ${WORK}/tokens.bin --tokens 20000 --vocab 300)
file(SIZE ${WORK}/tokens.bin bytes)
if(NOT bytes EQUAL 41024)  # the 1024-byte header and 2 bytes a token
  message(FATAL_ERROR "the shard holds ${bytes} bytes, expected 41024")
endif()
run("triad-train" ${TRAIN} --config ${CONFIG} --set device=cpu --set train.precision=fp32
    --set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=320
    --set model.seq_len=64 --set train.global_batch_size=4 --set train.micro_batch_size=4
    --set data.train=${WORK}/tokens.bin --set output.dir=${WORK}/out)
run("the summary" ${PYTHON} ${SCRIPT} summary ${WORK}/out/metrics.jsonl --preset tiny --batch 4
    --seq 64)
string(JSON impl GET "${out}" impl)
string(JSON timed GET "${out}" steps_timed)
string(JSON step_ms GET "${out}" step_ms)
string(JSON tps GET "${out}" tokens_per_s)
if(NOT impl STREQUAL "triad-train" OR NOT timed EQUAL 9)  # the config's 12 steps less 3
  message(FATAL_ERROR "summary ${out}: expected impl triad-train and 9 steps timed")
endif()
if(NOT step_ms GREATER 0 OR NOT tps GREATER 0)
  message(FATAL_ERROR "summary ${out}: a step time and a pace above 0 expected")
endif()
execute_process(COMMAND ${PYTHON} ${SCRIPT} shard ${WORK}/bad.bin --tokens 10 --vocab 70000
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "--vocab 70000: expected 1 to 65536")
  message(FATAL_ERROR "a vocabulary of 70000 was taken (${rc}): ${err}")
endif()
execute_process(COMMAND ${PYTHON} ${SCRIPT} summary ${WORK}/out/metrics.jsonl --preset tiny
                        --batch 4 --seq 64 --skip 12
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "12 steps, none after the first 12")
  message(FATAL_ERROR "a summary of no steps was given (${rc}): ${err}")
endif()
