# log.nvtx on a pipeline of two ranks, log.profile_ranks [1]: the NVTX
# injection library (tests/support/nvtx_recorder.cpp) writes down what
# Nsight Systems would see on each rank. Rank 1, the last stage, has each
# step's range holding its microbatches' passes and its pipeline transfers
# (posting "p2p", waiting "wait"); rank 0, left out, has none.
#   -DTRAIN= -DMPIRUN= -DRECORDER= -DCONFIG= -DDATA= -DWORK=
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
run(training ${MPIRUN} -np 2 -x NVTX_INJECTION64_PATH=${RECORDER} -x TRIAD_NVTX_LOG=${WORK}/nvtx
    ${TRAIN} --config ${CONFIG} --set data.train=${DATA} --set train.steps=3
    --set parallel.pp=2 --set log.nvtx=true --set log.profile_steps=[2,3]
    --set log.profile_ranks=[1] --set output.dir=${WORK}/run)
if(EXISTS ${WORK}/nvtx.rank0)
  file(READ ${WORK}/nvtx.rank0 left_out)
  message(FATAL_ERROR "rank 0 is not in log.profile_ranks but recorded ranges:\n${left_out}")
endif()
if(NOT EXISTS ${WORK}/nvtx.rank1)
  message(FATAL_ERROR "rank 1 recorded no NVTX ranges:\n${run_output}")
endif()
file(STRINGS ${WORK}/nvtx.rank1 events)
# Walk the pushes and pops: balanced, and what opens at depth 1 (the top
# level) and inside the steps.
set(depth 0)
set(top "")
set(inside "")
foreach(event IN LISTS events)
  if(event MATCHES "^push (.*)$")
    if(depth EQUAL 0)
      list(APPEND top "${CMAKE_MATCH_1}")
    elseif(depth EQUAL 1)
      list(APPEND inside "${CMAKE_MATCH_1}")
    endif()
    math(EXPR depth "${depth} + 1")
  elseif(event STREQUAL "pop")
    math(EXPR depth "${depth} - 1")
    if(depth LESS 0)
      message(FATAL_ERROR "a pop without a push in:\n${events}")
    endif()
  else()
    message(FATAL_ERROR "unexpected line '${event}'")
  endif()
endforeach()
if(NOT depth EQUAL 0)
  message(FATAL_ERROR "${depth} range(s) left open")
endif()
list(FILTER top INCLUDE REGEX "^step ")
if(NOT top STREQUAL "step 2;step 3")
  message(FATAL_ERROR "the profiled steps' ranges are '${top}', not steps 2 and 3")
endif()
foreach(name F0 B0 F1 B1 wait p2p optimizer)
  list(FIND inside "${name}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no '${name}' range inside the steps (they hold: ${inside})")
  endif()
endforeach()
