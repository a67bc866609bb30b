# A pipeline on simulated GPUs holds no more device memory with more
# micro-batches per step: what a rank sends is let go once the compute
# stream is ordered after it, not kept until the step ends. Two steps at 4
# and at 16 micro-batches per step; the peak the trainer reports (the
# caching allocator's byte count, the largest over the ranks) may differ by
# less than one stage payload (micro batch x seq x d_model f32 values).
# Holding every send until the step's end costs ZB-H1 one payload per
# micro-batch.
# Variables: TRAIN (triad-train-sim), MPIRUN (list), CONFIG, DATA, WORK,
# SCHEDULES (';'-separated).
file(REMOVE_RECURSE ${WORK})
set(micro 4)
set(seq 32)
set(width 64)
math(EXPR payload "${micro} * ${seq} * ${width} * 4")
set(common --config ${CONFIG} --set data.train=${DATA} --set device=cuda --set parallel.pp=2
    --set model.n_layer=4 --set model.d_model=${width} --set model.seq_len=${seq}
    --set train.micro_batch_size=${micro} --set train.steps=2 --set log.interval=100)
foreach(schedule IN LISTS SCHEDULES)
  foreach(m 4 16)
    math(EXPR batch "${m} * ${micro}")
    set(dir ${WORK}/${schedule}_${m})
    execute_process(COMMAND ${MPIRUN} -np 2 ${TRAIN} ${common} --set parallel.schedule=${schedule}
                            --set train.global_batch_size=${batch} --set output.dir=${dir}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${schedule} with ${m} micro-batches failed (${rc}):\n${out}")
    endif()
    file(STRINGS ${dir}/metrics.jsonl lines)
    list(GET lines -1 last)
    string(JSON peak_${m} GET "${last}" peak_memory_bytes)
  endforeach()
  math(EXPR grew "${peak_16} - ${peak_4}")
  message(STATUS "${schedule}: peak ${peak_4} bytes at 4 micro-batches, ${peak_16} at 16 "
                 "(one payload: ${payload})")
  if(grew GREATER_EQUAL payload)
    message(FATAL_ERROR "${schedule}: the peak grew by ${grew} bytes from 4 to 16 micro-batches "
                        "(${peak_4} to ${peak_16}); expected less than one payload (${payload})")
  endif()
endforeach()
