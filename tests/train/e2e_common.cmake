# Helpers of the end-to-end training scripts (included with -P scripts).

# Runs a command; a failure stops the script with its output. The output is
# left in run_output.
function(run name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# Runs a command that must fail with output (stdout and stderr together)
# matching `pattern`; anything else stops the script, naming `name`.
function(run_expecting_error name pattern)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0 OR NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "${name}: expected an error saying '${pattern}', got (${rc}):\n${out}")
  endif()
endfunction()

# Runs a command whose stdout is its result: a failure stops the script with
# its output and errors; stdout alone goes to `outvar` (stderr, where the
# programs log, kept apart).
function(run_for_stdout name outvar)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}${err}")
  endif()
  set(${outvar} "${out}" PARENT_SCOPE)
endfunction()

# A new run started from a checkpoint (init.from CHECKPOINT) trains as one
# started from the final model it checkpointed (init.from MODEL): the same
# losses, to the last digit. The run's command is ARGN; its output
# directories are WORK_DIR/init_ck and WORK_DIR/init_model.
function(expect_init_from_checkpoint label checkpoint model work_dir)
  run("${label}: init.from the checkpoint" ${ARGN} --set init.from=${checkpoint}
      --set output.dir=${work_dir}/init_ck)
  run("${label}: init.from the model" ${ARGN} --set init.from=${model}
      --set output.dir=${work_dir}/init_model)
  field(${work_dir}/init_ck loss from_checkpoint)
  field(${work_dir}/init_model loss from_model)
  if(NOT from_checkpoint STREQUAL from_model)
    message(FATAL_ERROR "${label}: init.from the checkpoint gives ${from_checkpoint}, from the "
                        "model ${from_model}")
  endif()
endfunction()

# train.cuda_graph's runs: `output` (the captured run's log) says it
# captured its passes of several micro-batches, and the runs in `eager` and
# `graph` report the same `steps` losses, gradient norms, output z-losses
# and multi-token prediction losses (where they have them), to the last
# digit. The losses go to `outvar`. The last step's peak memory (a replay's,
# its graph's temporaries counted) is within a quarter of the uncaptured
# step's either way: the graph holds what the step uses, no more, and the
# peak does not leave it out.
function(expect_captured_as_uncaptured label output eager graph steps outvar)
  field(${eager} peak_memory_bytes eager_peaks)
  field(${graph} peak_memory_bytes graph_peaks)
  list(GET eager_peaks -1 eager_peak)
  list(GET graph_peaks -1 graph_peak)
  math(EXPR low "${eager_peak} * 4 / 5")
  math(EXPR high "${eager_peak} * 5 / 4")
  if(graph_peak LESS low OR graph_peak GREATER high)
    message(FATAL_ERROR "${label}: the captured step's peak is ${graph_peak} bytes, the "
                        "uncaptured one's ${eager_peak} (expected within a quarter)")
  endif()
  if(NOT output MATCHES "captured the step's forward and backward passes \\([2-9] micro-batches")
    message(FATAL_ERROR "${label}: no capture in the log:\n${output}")
  endif()
  foreach(key loss grad_norm z_loss mtp_losses moe_balance moe_max_load moe_dropped moe_z_loss)
    field(${eager} ${key} want)
    field(${graph} ${key} got)
    list(LENGTH want count)
    if(NOT "${want}" STREQUAL "${got}" OR (key STREQUAL "loss" AND NOT count EQUAL steps))
      message(FATAL_ERROR "${label}: ${key} uncaptured ${want}, captured ${got}")
    endif()
    if(key STREQUAL "loss")
      set(${outvar} "${want}" PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

# One field of every metrics.jsonl line that has it.
function(field dir key outvar)
  file(STRINGS ${dir}/metrics.jsonl lines)
  set(values)
  foreach(line IN LISTS lines)
    string(JSON v ERROR_VARIABLE missing GET "${line}" ${key})
    if(NOT missing)
      list(APPEND values ${v})
    endif()
  endforeach()
  set(${outvar} ${values} PARENT_SCOPE)
endfunction()

# A non-negative decimal as an integer scaled by 1e9 (CMake math is integer),
# also in JSON's exponent form (1.5e-05; digits past 1e-9 dropped).
function(scaled value outvar)
  if(value MATCHES "^([0-9]+)(\\.([0-9]+))?[eE]([-+]?)0*([0-9]+)$")
    set(digits "${CMAKE_MATCH_1}${CMAKE_MATCH_3}")
    string(LENGTH "${CMAKE_MATCH_3}" places)
    set(power ${CMAKE_MATCH_5})
    if(CMAKE_MATCH_4 STREQUAL "-")
      set(power -${power})
    endif()
    math(EXPR shift "9 + ${power} - ${places}")  # value * 1e9 = digits * 10^shift
    if(shift GREATER_EQUAL 0)
      string(REPEAT "0" ${shift} zeros)
      string(APPEND digits "${zeros}")
    else()
      math(EXPR drop "-${shift}")
      string(LENGTH "${digits}" n)
      if(drop GREATER_EQUAL n)
        set(digits 0)
      else()
        math(EXPR keep "${n} - ${drop}")
        string(SUBSTRING "${digits}" 0 ${keep} digits)
      endif()
    endif()
    # (Leading zeros off, from the first other digit on.)
    string(REGEX MATCH "[1-9].*" digits "${digits}")
    if(digits STREQUAL "")
      set(digits 0)
    endif()
    set(${outvar} ${digits} PARENT_SCOPE)
    return()
  endif()
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" num "${value}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\1" ip "${num}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\2" fp "${num}")
  string(SUBSTRING "${fp}000000000" 0 9 fp)
  # (A leading 1 keeps the fraction's zeros: REGEX REPLACE re-anchors ^ after
  # each match, so stripping them took zeros from the middle too.)
  math(EXPR v "${ip} * 1000000000 + 1${fp} - 1000000000")
  set(${outvar} ${v} PARENT_SCOPE)
endfunction()

# Fails unless `got` has as many values as `want`, each within want/divisor.
function(expect_close label want got divisor)
  list(LENGTH want n)
  list(LENGTH got m)
  if(NOT n EQUAL m OR n EQUAL 0)
    message(FATAL_ERROR "${label}: ${m} values where one process has ${n}")
  endif()
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    list(GET want ${i} a)
    list(GET got ${i} b)
    scaled(${a} as)
    scaled(${b} bs)
    math(EXPR d "${as} - ${bs}")
    if(d LESS 0)
      math(EXPR d "-${d}")
    endif()
    math(EXPR tol "${as} / ${divisor}")
    if(d GREATER tol)
      message(FATAL_ERROR "${label}: value ${i}: ${b} differs from one process (${a}) by more than 1/${divisor}")
    endif()
  endforeach()
endfunction()

# Tolerances from field `at` of an entry's fields, "loss divisor,norm
# divisor" (values within want/divisor), when present; fp32's defaults
# otherwise (100000 and 10000: 1e-5 and 1e-4 relative).
function(tolerances fields at loss_out norm_out)
  set(loss 100000)
  set(norm 10000)
  list(LENGTH fields n)
  if(n GREATER at)
    list(GET fields ${at} pair)
    string(REPLACE "," ";" pair "${pair}")
    list(GET pair 0 loss)
    list(GET pair 1 norm)
  endif()
  set(${loss_out} ${loss} PARENT_SCOPE)
  set(${norm_out} ${norm} PARENT_SCOPE)
endfunction()
