# A pipeline on simulated GPUs holds no more device memory with more
# micro-batches per step: what a rank sends is let go once the compute
# stream is ordered after it, not kept until the step ends. Two steps at 2
# and at 4 micro-batches per stage (below 2 the pipeline never reaches its
# steady state, and holds less); the peak the trainer reports (the caching
# allocator's byte count, the largest over the ranks) may differ by less
# than one stage payload (micro batch x seq x d_model f32 values).
# Holding every send until the step's end costs ZB-H1 one payload per
# micro-batch.
# Four stages talk to their neighbours over NCCL links of their own
# (dist/nccl.h), where a receive lets go only of the sends to its own peer.
# Variables: TRAIN (triad-train-sim), MPIRUN (list), CONFIG, DATA, WORK,
# LAYOUTS ('@'-separated "stages:schedule").
file(REMOVE_RECURSE ${WORK})
set(micro 4)
set(seq 32)
set(width 64)
math(EXPR payload "${micro} * ${seq} * ${width} * 4")
set(common --config ${CONFIG} --set data.train=${DATA} --set device=cuda
    --set model.n_layer=4 --set model.d_model=${width} --set model.seq_len=${seq}
    --set train.micro_batch_size=${micro} --set train.steps=2 --set log.interval=100)
string(REPLACE "@" ";" layouts "${LAYOUTS}")
foreach(layout IN LISTS layouts)
  string(REPLACE ":" ";" fields "${layout}")
  list(GET fields 0 stages)
  list(GET fields 1 schedule)
  math(EXPR fewer "2 * ${stages}")
  math(EXPR more "4 * ${stages}")
  foreach(m ${fewer} ${more})
    math(EXPR batch "${m} * ${micro}")
    set(dir ${WORK}/${stages}_${schedule}_${m})
    execute_process(COMMAND ${MPIRUN} -np ${stages} ${TRAIN} ${common} --set parallel.pp=${stages}
                            --set parallel.schedule=${schedule}
                            --set train.global_batch_size=${batch} --set output.dir=${dir}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${layout} with ${m} micro-batches failed (${rc}):\n${out}")
    endif()
    file(STRINGS ${dir}/metrics.jsonl lines)
    list(GET lines -1 last)
    string(JSON peak_${m} GET "${last}" peak_memory_bytes)
  endforeach()
  math(EXPR grew "${peak_${more}} - ${peak_${fewer}}")
  message(STATUS "${layout}: peak ${peak_${fewer}} bytes at ${fewer} micro-batches, "
                 "${peak_${more}} at ${more} (one payload: ${payload})")
  if(grew GREATER_EQUAL payload)
    message(FATAL_ERROR "${layout}: the peak grew by ${grew} bytes from ${fewer} to ${more} "
                        "micro-batches; expected less than one payload (${payload})")
  endif()
endforeach()
