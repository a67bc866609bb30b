# run_all.sh's run of the example trainer, on the CPU at a toy size: the
# random shard benchmarks/gpu/trainer_step_time.py writes is one triad-train
# reads, benchmarks/gpu/trainer_350m.yaml is a config it takes (its model
# shrunk and its device the CPU here), and the summary is the median step
# after the warm-up as train.jsonl's triad-train line; bad arguments are
# refused by name.
# Variables: PYTHON, SCRIPT (trainer_step_time.py), CONFIG, TRAIN (triad-train), WORK.
include(${CMAKE_CURRENT_LIST_DIR}/../train/e2e_common.cmake)  # run, run_expecting_error
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
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
set(out "${run_output}")
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
run_expecting_error("a vocabulary of 70000" "--vocab 70000: expected 1 to 65536" ${PYTHON}
                    ${SCRIPT} shard ${WORK}/bad.bin --tokens 10 --vocab 70000)
run_expecting_error("a summary of no steps" "12 steps, none after the first 12" ${PYTHON}
                    ${SCRIPT} summary ${WORK}/out/metrics.jsonl --preset tiny --batch 4 --seq 64
                    --skip 12)

# The step time is the median period between metrics.jsonl's lines
# (elapsed_s), never step_ms (here nonsense): periods 0.25, 0.5, 0.25 and
# 1.25 s after the first 2 steps, so 375 ms.
file(WRITE ${WORK}/periods.jsonl "")
foreach(line "1|1.0" "2|1.25" "3|1.5" "4|2.0" "5|2.25" "6|3.5")
  string(REPLACE "|" ";" parts "${line}")
  list(GET parts 0 step)
  list(GET parts 1 at)
  file(APPEND ${WORK}/periods.jsonl
       "{\"step\": ${step}, \"loss\": 5.0, \"step_ms\": 1.0, \"elapsed_s\": ${at}}\n")
endforeach()
run("the summary of known periods" ${PYTHON} ${SCRIPT} summary ${WORK}/periods.jsonl --preset tiny
    --batch 4 --seq 64 --skip 2)
string(JSON step_ms GET "${run_output}" step_ms)
string(JSON timed GET "${run_output}" steps_timed)
if(NOT step_ms EQUAL 375 OR NOT timed EQUAL 4)
  message(FATAL_ERROR "summary ${run_output}: expected a step of 375 ms over 4 periods")
endif()
string(JSON graph ERROR_VARIABLE no_graph GET "${run_output}" cuda_graph)
if(NOT no_graph)
  message(FATAL_ERROR "summary ${run_output}: a run without train.cuda_graph says cuda_graph")
endif()
# A run with train.cuda_graph is marked so (its own row in the table).
run("the summary of a captured run" ${PYTHON} ${SCRIPT} summary ${WORK}/periods.jsonl --preset tiny
    --batch 4 --seq 64 --skip 2 --cuda-graph)
string(JSON graph GET "${run_output}" cuda_graph)
if(NOT graph)
  message(FATAL_ERROR "summary ${run_output}: expected cuda_graph true")
endif()
file(WRITE ${WORK}/untimed.jsonl "{\"step\": 1, \"step_ms\": 1.0}\n{\"step\": 2, \"step_ms\": 1.0}\n")
run_expecting_error("a summary of steps without elapsed_s" "a step without elapsed_s" ${PYTHON}
                    ${SCRIPT} summary ${WORK}/untimed.jsonl --preset tiny --batch 4 --seq 64)
