# Multi-rank `device: cuda` training on the CUDA simulator makes the host
# wait for the GPU at most once per step on every rank (the gradient norm,
# read with the loss), unless a layout names other limits, and never polls
# for a collective: NCCL waits are
# stream-ordered (dist/nccl.h). The simulator counts both (TRIAD_SIM_REPORT=1
# prints "cuda_sim: ... N host waits, M not-ready queries" at exit); a
# step's share is the difference between runs of 1 and 3 steps (steps 2 and
# 3: zb-auto's step 2 is the one it times for its order, with no wait of
# its own; the first step's one-time waits fall out). Two
# micro-batches per step. A layout under train.cuda_graph is measured over
# its replayed steps alone (the difference between runs of 3 and 5 steps:
# step 2 captures), whose checks of the device batch are read with the
# norm. The pinned staging pool's own queries (which
# never wait) make 2 per micro-batch (at most 6 per step pass), where one
# polled NCCL wait per collective made dozens.
# Variables: TRAIN (triad-train-sim), MPIRUN (list), CONFIG, DATA, WORK,
# LAYOUTS ("ranks|--set ...[|w0,w1,...[|q]]" entries joined by '@'; w_r: rank
# r's most host waits per step, 1 where not given (an empty list: 1 on
# every rank); q: the most not-ready queries per step, 6 where not given
# (multi-token prediction uploads each depth's ids and targets as well,
# each upload a query of the staging pool)).
cmake_policy(SET CMP0007 NEW)  # (an empty field keeps its place)
file(REMOVE_RECURSE ${WORK})
set(common --config ${CONFIG} --set data.train=${DATA} --set device=cuda --set model.vocab_size=300
    --set model.n_layer=2 --set model.d_model=64 --set model.seq_len=32
    --set train.global_batch_size=4 --set train.micro_batch_size=2 --set log.interval=100)
string(REPLACE "@" ";" layouts "${LAYOUTS}")
set(index 0)
foreach(layout IN LISTS layouts)
  math(EXPR index "${index} + 1")
  string(REPLACE "|" ";" fields "${layout}")
  list(GET fields 0 np)
  list(GET fields 1 flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(limits "")
  set(most_queries 6)
  list(LENGTH fields nfields)
  if(nfields GREATER 2)
    list(GET fields 2 limits)
    string(REPLACE "," ";" limits "${limits}")
  endif()
  if(nfields GREATER 3)
    list(GET fields 3 most_queries)
  endif()
  set(fewer 1)
  set(more 3)
  if(flags MATCHES "train.cuda_graph=true")
    set(fewer 3)
    set(more 5)
  endif()
  foreach(steps ${fewer} ${more})
    set(dir ${WORK}/layout${index}_${steps})
    execute_process(COMMAND ${MPIRUN} -np ${np} -x TRIAD_SIM_REPORT=1 --output-filename ${dir}/ranks
                            ${TRAIN} ${common} ${flags} --set train.steps=${steps}
                            --set output.dir=${dir}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "layout '${layout}', ${steps} steps failed (${rc}):\n${out}")
    endif()
  endforeach()
  math(EXPR last "${np} - 1")
  foreach(rank RANGE ${last})
    foreach(steps ${fewer} ${more})
      file(GLOB err ${WORK}/layout${index}_${steps}/ranks/*/rank.${rank}/stderr)
      file(STRINGS "${err}" line REGEX "^cuda_sim: ")
      if(NOT line MATCHES " ([0-9]+) host waits, ([0-9]+) not-ready queries")
        message(FATAL_ERROR "layout '${layout}' rank ${rank}: no simulator report in ${err}")
      endif()
      set(waits_${steps} ${CMAKE_MATCH_1})
      set(queries_${steps} ${CMAKE_MATCH_2})
    endforeach()
    math(EXPR waits "(${waits_${more}} - ${waits_${fewer}}) / 2")
    math(EXPR queries "(${queries_${more}} - ${queries_${fewer}}) / 2")
    message(STATUS "layout '${layout}' rank ${rank}: ${waits} host waits, ${queries} not-ready queries per step")
    set(most 1)
    if(limits)
      list(GET limits ${rank} most)
    endif()
    if(waits GREATER most OR queries GREATER most_queries)
      message(FATAL_ERROR "layout '${layout}' rank ${rank}: ${waits} host waits and ${queries} "
                          "not-ready queries per step; expected at most ${most} and ${most_queries}")
    endif()
  endforeach()
endforeach()
