# Helpers of the planner's scripts (included with -P scripts).

# One layout's pricing in `first` (an object, or with `where` 0 a list's
# first) and in `second` (an object) must be one: the step time and memory
# to the last digit, and the layout.
function(expect_same_pricing what first where second)
  foreach(key step_time_s memory_per_gpu_gb tp pp dp vpp cp ep micro_batch schedule recompute
          recompute_layers sequence_parallel zero1 stage_layers)
    string(JSON want GET "${first}" ${where} ${key})
    string(JSON got GET "${second}" ${key})
    if(NOT want STREQUAL got)
      message(FATAL_ERROR "${key}: ${what} ${want} against ${got}\n${first}\n${second}")
    endif()
  endforeach()
endfunction()
