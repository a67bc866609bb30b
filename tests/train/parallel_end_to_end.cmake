# triad-train on several (tp, pp, dp) layouts gives the same per-step losses
# as one process for STEPS steps (default 10; fp32, relative 1e-5), all starting from the
# same safetensors, with a vocabulary (300) that is not a multiple of 128*tp
# and 8 layers so pipelines of 4 stages x 2 chunks fit, 64 wide (the
# sharding of the config's 128, a quarter of the arithmetic), on sequences
# of 64 tokens (EXTRA may change any of these). Layouts may also
# switch on full recomputation, which must not change a single loss.
# Each step's gradient norm (before clipping), each layer's
# (log.grad_norms: layers) and the parameter norm (after the update,
# log.param_norm; each layer's, log.param_norms) must match one process's too.
# Every run reads its training sequences in the shuffled order (data.shuffle:
# a function of the seed and the pass, never of the layout), and also
# evaluates 2 global batches of validation data halfway and at the
# end (forward only, the pipelines' own forward-only order), and those
# losses must match one process's too; with train.ema_decay in EXTRA, so
# must the averaged weights' (val_ema_loss), and their eval.choices answer
# loss and eval.lambada loss (below) too.
# Mixed-precision layouts (bf16/fp16) are compared with the same fp32
# reference at the tolerance they deserve, given as a third field
# "loss divisor,norm divisor" (200,10: losses within 0.5%, norms within 10%).
# With QUESTIONS (multiple-choice JSON lines), every evaluation also scores
# them (eval.choices): the right answers' loss must match one process's at
# the same tolerance (and TruthfulQA's MC2, for its lines, at 50 times it:
# a ratio of exponentials of the scores), and in fp32 every accuracy must be
# one process's.
# With LAMBADA (LAMBADA's JSON lines), every evaluation also asks for the
# texts' last words (eval.lambada): the words' loss must match one
# process's at the same tolerance, and in fp32 the share greedy decoding
# gets right must be one process's.
# A mixture of experts' moe_balance, moe_dropped and moe_z_loss (and each
# layer's loads, log.moe_per_layer), multi-token prediction's mtp_losses and
# the output z_loss, when one process reports them, must match too.
# With SAMPLES (ON), every evaluation also continues two prompts greedily
# (eval.samples, the model gathered whole from the layout's ranks): in fp32
# the texts must be one process's.
# The steps skipped as spikes (train.spike_sigma) must be one process's,
# and with SPIKES (a list of step numbers) one process's must be those.
# With PASSED_OVER (a list of step numbers, which EXTRA's train.skip_steps
# names), every run must pass over exactly those, reporting no loss for them.
# Variables: TRAIN (triad-train), MPIRUN (list), CONFIG, DATA, WORK, LAYOUTS
# ("ranks|--set ... --set ...[|loss,norm]" entries joined by '@'), and
# optionally EXTRA (more --set flags for every run, the reference included),
# STEPS (an even number of steps, 10 unless given), QUESTIONS, LAMBADA,
# SAMPLES, SPIKES and PASSED_OVER.
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
if(NOT DEFINED STEPS)
  set(STEPS 10)
endif()
math(EXPR half "${STEPS} / 2")
math(EXPR whole "${half} * 2")
if(half LESS 1 OR NOT STEPS EQUAL whole)
  message(FATAL_ERROR "STEPS must be an even number of at least 2, got '${STEPS}'")
endif()
set(common --config ${CONFIG} --set data.train=${DATA} --set model.vocab_size=300 --set model.n_layer=8
    --set model.d_model=64 --set model.seq_len=64 --set train.micro_batch_size=2 --set log.interval=${half}
    --set data.val=${DATA} --set eval.interval=${half}
    --set eval.batches=2 --set data.shuffle=true --set log.param_norm=true
    --set log.grad_norms=layers --set log.param_norms=layers ${extra})
if(QUESTIONS)
  list(APPEND common --set eval.choices=${QUESTIONS})
endif()
if(LAMBADA)
  list(APPEND common --set eval.lambada=${LAMBADA})
endif()
if(SAMPLES)
  list(APPEND common --set "eval.samples=[Once, The cat]" --set eval.sample_tokens=6)
endif()
# eval.samples' continuations at every evaluation, one string.
function(samples_of dir outvar)
  file(STRINGS ${dir}/metrics.jsonl lines)
  set(all "")
  set(count 0)
  foreach(line IN LISTS lines)
    string(JSON s ERROR_VARIABLE missing GET "${line}" samples)
    if(NOT missing)
      string(APPEND all "${s}\n")
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
  set(${outvar} "${all}" PARENT_SCOPE)
  set(${outvar}_count ${count} PARENT_SCOPE)
endfunction()
# The steps whose metrics mark them with `key` (spike: skipped as spikes).
function(steps_marked dir key outvar)
  file(STRINGS ${dir}/metrics.jsonl lines)
  set(steps)
  foreach(line IN LISTS lines)
    string(JSON v ERROR_VARIABLE missing GET "${line}" ${key})
    if(NOT missing AND v)
      string(JSON s GET "${line}" step)
      list(APPEND steps ${s})
    endif()
  endforeach()
  set(${outvar} "${steps}" PARENT_SCOPE)
endfunction()
# An object of named values in the metrics (log.grad_norms' groups, or
# with `field` log.moe_per_layer's layers' field): its names (in outvar) and
# each one's values step by step (in outvar_0, outvar_1, ...).
function(named_values dir key field outvar)
  file(STRINGS ${dir}/metrics.jsonl lines)
  set(names)
  set(count 0)
  foreach(line IN LISTS lines)
    string(JSON n ERROR_VARIABLE missing LENGTH "${line}" ${key})
    if(missing)
      continue()
    endif()
    if(count EQUAL 0)
      set(count ${n})
      math(EXPR last "${n} - 1")
      foreach(i RANGE ${last})
        string(JSON name MEMBER "${line}" ${key} ${i})
        list(APPEND names ${name})
        set(values_${i})
      endforeach()
    endif()
    if(NOT n EQUAL count)
      message(FATAL_ERROR "${dir}: ${n} ${key} on a line, ${count} on the first")
    endif()
    set(i 0)
    foreach(name IN LISTS names)
      string(JSON v GET "${line}" ${key} ${name} ${field})
      list(APPEND values_${i} ${v})
      math(EXPR i "${i} + 1")
    endforeach()
  endforeach()
  set(${outvar} "${names}" PARENT_SCOPE)
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      set(${outvar}_${i} "${values_${i}}" PARENT_SCOPE)
    endforeach()
  endif()
endfunction()
# A common starting point, then the one-process reference.
run(init ${TRAIN} ${common} --set train.steps=1 --set output.dir=${WORK}/init)
set(from --set init.from=${WORK}/init/model.safetensors --set train.steps=${STEPS})
run(reference ${TRAIN} ${common} ${from} --set output.dir=${WORK}/reference)

field(${WORK}/reference loss reference)
field(${WORK}/reference grad_norm reference_norms)
field(${WORK}/reference param_norm reference_param_norms)
field(${WORK}/reference val_loss reference_val)
field(${WORK}/reference val_ema_loss reference_val_ema)
list(LENGTH reference_val_ema ema_count)
if("${EXTRA}" MATCHES "train.ema_decay" AND NOT ema_count EQUAL 2)
  message(FATAL_ERROR "one process reported ${ema_count} val_ema_loss values with train.ema_decay, not 2")
endif()
named_values(${WORK}/reference grad_norms "" reference_groups)
if(NOT reference_groups)
  message(FATAL_ERROR "one process reported no grad_norms with log.grad_norms=layers")
endif()
# A mixture of experts' routing statistics (its load-balancing loss, and
# under a capacity factor the share dropped, under a z-loss the z-loss),
# when the metrics carry them.
field(${WORK}/reference moe_balance reference_moe_balance)
field(${WORK}/reference moe_dropped reference_moe_dropped)
field(${WORK}/reference moe_z_loss reference_moe_z_loss)
# log.moe_per_layer: each MoE layer's busiest and idlest expert's load.
foreach(which max_load min_load)
  named_values(${WORK}/reference moe_layers ${which} reference_${which})
endforeach()
if("${EXTRA}" MATCHES "log.moe_per_layer" AND NOT reference_max_load)
  message(FATAL_ERROR "one process reported no moe_layers with log.moe_per_layer set")
endif()
# Multi-token prediction's losses at its first depths (model.mtp_layers),
# when the metrics carry them.
foreach(depth 0 1 2)
  field(${WORK}/reference "mtp_losses;${depth}" reference_mtp_${depth})
endforeach()
# The output z-loss (model.z_loss_coef), which one process must report when
# the run has one.
field(${WORK}/reference z_loss reference_z_loss)
if("${EXTRA}" MATCHES "model.z_loss_coef" AND NOT reference_z_loss)
  message(FATAL_ERROR "one process reported no z_loss with model.z_loss_coef set")
endif()
steps_marked(${WORK}/reference spike reference_spikes)
if(DEFINED SPIKES AND NOT "${reference_spikes}" STREQUAL "${SPIKES}")
  message(FATAL_ERROR "one process skipped steps [${reference_spikes}] as spikes, expected [${SPIKES}]")
endif()
steps_marked(${WORK}/reference passed_over reference_passed_over)
if(NOT "${reference_passed_over}" STREQUAL "${PASSED_OVER}")
  message(FATAL_ERROR "one process passed over steps [${reference_passed_over}], expected [${PASSED_OVER}]")
endif()
list(LENGTH reference_passed_over passed)
math(EXPR trained "${STEPS} - ${passed}")
list(LENGTH reference n)
list(LENGTH reference_val nv)
list(LENGTH reference_param_norms np)
if(NOT n EQUAL trained OR NOT nv EQUAL 2 OR NOT np EQUAL trained)
  message(FATAL_ERROR "expected ${trained} trained steps, 2 validation losses and ${trained} "
                      "parameter norms from the reference, got ${n}, ${nv} and ${np}")
endif()
if(QUESTIONS)
  field(${WORK}/reference "choices;answer_loss" reference_answers)
  list(LENGTH reference_answers na)
  if(NOT na EQUAL 2)
    message(FATAL_ERROR "expected 2 evaluations of eval.choices from the reference, got ${na}")
  endif()
  foreach(name acc acc_norm acc_per_token)
    field(${WORK}/reference "choices;${name}" reference_${name})
  endforeach()
  # (TruthfulQA's MC2, where the file has its lines.)
  field(${WORK}/reference "choices;mc2" reference_mc2)
  field(${WORK}/reference "choices_ema;answer_loss" reference_ema_answers)
  if(reference_val_ema AND NOT reference_ema_answers)
    message(FATAL_ERROR "one process scored eval.choices without the averaged weights")
  endif()
endif()
if(LAMBADA)
  field(${WORK}/reference "lambada;loss" reference_lambada_loss)
  field(${WORK}/reference "lambada;acc" reference_lambada_acc)
  field(${WORK}/reference "lambada_ema;loss" reference_ema_lambada_loss)
  list(LENGTH reference_lambada_loss nl)
  if(NOT nl EQUAL 2)
    message(FATAL_ERROR "expected 2 evaluations of eval.lambada from the reference, got ${nl}")
  endif()
endif()
if(SAMPLES)
  samples_of(${WORK}/reference reference_samples)
  if(NOT reference_samples_count EQUAL 2)
    message(FATAL_ERROR "expected 2 evaluations of eval.samples from the reference, got ${reference_samples_count}")
  endif()
endif()
set(index 0)
string(REPLACE "@" ";" layouts "${LAYOUTS}")
list(LENGTH layouts count)
if(count LESS 1)
  message(FATAL_ERROR "no layouts given")
endif()
foreach(layout IN LISTS layouts)
  string(REPLACE "|" ";" parts "${layout}")
  list(GET parts 0 ranks)
  list(GET parts 1 flags)
  tolerances("${parts}" 2 loss_div norm_div)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  math(EXPR index "${index} + 1")
  set(dir ${WORK}/layout${index})
  run("${ranks} ranks: ${flags}" ${MPIRUN} -np ${ranks} ${TRAIN} ${common} ${from} ${flags} --set output.dir=${dir})
  foreach(searched zb-auto zb-v)
    if("${flags}" MATCHES "${searched}" AND NOT run_output MATCHES "${searched}: measured ms per stage")
      message(FATAL_ERROR "${ranks} ranks ${flags}: no ${searched} re-planning in the log:\n${run_output}")
    endif()
  endforeach()
  field(${dir} loss got)
  field(${dir} grad_norm got_norms)
  steps_marked(${dir} passed_over got_passed_over)
  if(NOT "${got_passed_over}" STREQUAL "${reference_passed_over}")
    message(FATAL_ERROR "${ranks} ranks ${flags}: steps [${got_passed_over}] passed over, one "
                        "process [${reference_passed_over}]")
  endif()
  steps_marked(${dir} spike got_spikes)
  if(NOT "${got_spikes}" STREQUAL "${reference_spikes}")
    message(FATAL_ERROR "${ranks} ranks ${flags}: steps [${got_spikes}] skipped as spikes, one "
                        "process [${reference_spikes}]")
  endif()
  expect_close("${ranks} ranks ${flags} loss" "${reference}" "${got}" ${loss_div})
  # The clipping norm (global over the whole mesh) equals one process's.
  expect_close("${ranks} ranks ${flags} gradient norm" "${reference_norms}" "${got_norms}" ${norm_div})
  # So does each layer's (log.grad_norms): at the first step, from the same
  # weights, as closely; later, as roundings part the runs, within 10 times
  # that (a layer's norm moves more than the sum over all of them).
  named_values(${dir} grad_norms "" got_groups)
  if(NOT "${got_groups}" STREQUAL "${reference_groups}")
    message(FATAL_ERROR "${ranks} ranks ${flags}: gradient norm groups [${got_groups}], one "
                        "process [${reference_groups}]")
  endif()
  math(EXPR later_div "${norm_div} / 10")
  if(later_div LESS 1)
    set(later_div 1)
  endif()
  set(i 0)
  foreach(group IN LISTS reference_groups)
    set(want "${reference_groups_${i}}")
    set(got "${got_groups_${i}}")
    list(GET want 0 want_first)
    list(GET got 0 got_first)
    expect_close("${ranks} ranks ${flags} gradient norm of ${group} at step 1" "${want_first}"
                 "${got_first}" ${norm_div})
    list(SUBLIST want 1 -1 want)
    list(SUBLIST got 1 -1 got)
    expect_close("${ranks} ranks ${flags} gradient norm of ${group}" "${want}" "${got}" ${later_div})
    math(EXPR i "${i} + 1")
  endforeach()
  # So does each layer's parameter norm (log.param_norms).
  named_values(${WORK}/reference param_norms "" reference_layer_params)
  named_values(${dir} param_norms "" got_layer_params)
  if(NOT reference_layer_params OR NOT "${got_layer_params}" STREQUAL "${reference_layer_params}")
    message(FATAL_ERROR "${ranks} ranks ${flags}: parameter norm groups [${got_layer_params}], one "
                        "process [${reference_layer_params}]")
  endif()
  set(i 0)
  foreach(group IN LISTS reference_layer_params)
    expect_close("${ranks} ranks ${flags} parameter norm of ${group}"
                 "${reference_layer_params_${i}}" "${got_layer_params_${i}}" ${loss_div})
    math(EXPR i "${i} + 1")
  endforeach()
  # So does the parameters' (log.param_norm), each tensor counted once.
  field(${dir} param_norm got_param_norms)
  expect_close("${ranks} ranks ${flags} parameter norm" "${reference_param_norms}"
               "${got_param_norms}" ${loss_div})
  field(${dir} val_loss got_val)
  expect_close("${ranks} ranks ${flags} validation loss" "${reference_val}" "${got_val}" ${loss_div})
  if(reference_val_ema)
    field(${dir} val_ema_loss got_val_ema)
    expect_close("${ranks} ranks ${flags} averaged weights' validation loss" "${reference_val_ema}"
                 "${got_val_ema}" ${loss_div})
  endif()
  foreach(name moe_balance moe_dropped moe_z_loss z_loss)
    if(reference_${name})
      field(${dir} ${name} got_${name})
      expect_close("${ranks} ranks ${flags} ${name}" "${reference_${name}}" "${got_${name}}" ${loss_div})
    endif()
  endforeach()
  foreach(which max_load min_load)
    named_values(${dir} moe_layers ${which} got_${which})
    if(NOT "${got_${which}}" STREQUAL "${reference_${which}}")
      message(FATAL_ERROR "${ranks} ranks ${flags}: MoE layers [${got_${which}}], one process "
                          "[${reference_${which}}]")
    endif()
    set(i 0)
    foreach(layer IN LISTS reference_${which})
      expect_close("${ranks} ranks ${flags} ${which} of ${layer}" "${reference_${which}_${i}}"
                   "${got_${which}_${i}}" ${loss_div})
      math(EXPR i "${i} + 1")
    endforeach()
  endforeach()
  foreach(depth 0 1 2)
    if(reference_mtp_${depth})
      field(${dir} "mtp_losses;${depth}" got_mtp)
      expect_close("${ranks} ranks ${flags} mtp_losses[${depth}]" "${reference_mtp_${depth}}"
                   "${got_mtp}" ${loss_div})
    endif()
  endforeach()
  if(QUESTIONS)
    field(${dir} "choices;answer_loss" got_answers)
    expect_close("${ranks} ranks ${flags} eval.choices answer loss" "${reference_answers}"
                 "${got_answers}" ${loss_div})
    if(reference_mc2)
      # MC2 is a ratio of exp(-total score): a score off by a share e of
      # itself moves it by about e times the score, relatively (the
      # fixture's answers score up to about 50 nats), so its tolerance is
      # the losses' times 50.
      math(EXPR mc2_div "${loss_div} / 50")
      if(mc2_div LESS 1)
        set(mc2_div 1)
      endif()
      field(${dir} "choices;mc2" got_mc2)
      expect_close("${ranks} ranks ${flags} eval.choices mc2" "${reference_mc2}" "${got_mc2}"
                   ${mc2_div})
    endif()
    if(reference_ema_answers)
      field(${dir} "choices_ema;answer_loss" got_ema_answers)
      expect_close("${ranks} ranks ${flags} eval.choices answer loss of the averaged weights"
                   "${reference_ema_answers}" "${got_ema_answers}" ${loss_div})
    endif()
    if(NOT "${flags}" MATCHES "precision")
      foreach(name acc acc_norm acc_per_token)
        field(${dir} "choices;${name}" got_acc)
        if(NOT got_acc STREQUAL "${reference_${name}}")
          message(FATAL_ERROR "${ranks} ranks ${flags}: eval.choices ${name} ${got_acc}, one process ${reference_${name}}")
        endif()
      endforeach()
    endif()
  endif()
  if(LAMBADA)
    field(${dir} "lambada;loss" got_lambada_loss)
    expect_close("${ranks} ranks ${flags} eval.lambada loss" "${reference_lambada_loss}"
                 "${got_lambada_loss}" ${loss_div})
    if(reference_ema_lambada_loss)
      field(${dir} "lambada_ema;loss" got_ema_lambada_loss)
      expect_close("${ranks} ranks ${flags} eval.lambada loss of the averaged weights"
                   "${reference_ema_lambada_loss}" "${got_ema_lambada_loss}" ${loss_div})
    endif()
    field(${dir} "lambada;acc" got_lambada_acc)
    if(NOT "${flags}" MATCHES "precision" AND NOT got_lambada_acc STREQUAL "${reference_lambada_acc}")
      message(FATAL_ERROR "${ranks} ranks ${flags}: eval.lambada acc ${got_lambada_acc}, one process ${reference_lambada_acc}")
    endif()
  endif()
  if(SAMPLES)
    samples_of(${dir} got_samples)
    if(NOT got_samples_count EQUAL 2)
      message(FATAL_ERROR "${ranks} ranks ${flags}: ${got_samples_count} evaluations of eval.samples, not 2")
    endif()
    if(NOT "${flags}" MATCHES "precision" AND NOT got_samples STREQUAL reference_samples)
      message(FATAL_ERROR "${ranks} ranks ${flags}: eval.samples\n${got_samples}one process\n${reference_samples}")
    endif()
  endif()
  # Pipelines: the merged trace has every rank's row and the p2p waits, and
  # metrics carry the measured bubble.
  if("${flags}" MATCHES "parallel.pp")
    file(READ ${dir}/trace.json trace)
    math(EXPR last "${ranks} - 1")
    if(NOT trace MATCHES "\"cat\":\"p2p\"" OR NOT trace MATCHES "\"pid\":${last}")
      message(FATAL_ERROR "${ranks} ranks ${flags}: trace.json lacks p2p events or rank ${last}")
    endif()
    file(READ ${dir}/metrics.jsonl metrics)
    if(NOT metrics MATCHES "bubble_fraction")
      message(FATAL_ERROR "${ranks} ranks ${flags}: metrics.jsonl lacks bubble_fraction")
    endif()
  endif()
  message(STATUS "${ranks} ranks ${flags}: ${STEPS} losses and 2 validation losses match one process (within 1/${loss_div})")
endforeach()
message(STATUS "${count} layouts checked")
