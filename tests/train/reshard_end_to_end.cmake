# A checkpoint written under one (tp, pp, dp, vpp, ZeRO-1) layout resumes
# under another: each pair trains steps 1-5 with layout A, checkpoints, and
# trains steps 6-10 with layout B from that checkpoint; those five losses,
# gradient norms and parameter norms (log.param_norm) must match one process
# training all ten steps (fp32: relative 1e-5 for losses and parameter
# norms, 1e-4 for gradient norms), all starting from the same safetensors,
# on 8 layers 64 wide (the sharding of the configs' 128, a
# quarter of the arithmetic) and sequences of 64 tokens (EXTRA may change
# any of these). The learning-rate schedule spans 10 steps in every run
# (train.lr_decay_steps), so the halves see the rates of the whole.
# Each second half's last checkpoint must also export (triad-export
# --checkpoint, when EXPORT is given) to the bytes of its final model, and
# (first pair) start a new run as the model does (init.from).
# With train.ema_decay in EXTRA every run also evaluates 2 batches after its
# last step, and the second half's averaged weights (carried through the
# checkpoint, resharded) must score one process's val_ema_loss.
# With FRESH_OPTIMIZER (ON) every second half resumes with
# checkpoint.load_optimizer false (unless its flags say otherwise, for a
# checkpoint written without the optimizer), and so does the reference, which
# then trains steps 1-5, checkpoints and resumes for steps 6-10 in one
# process.
# Variables: TRAIN (triad-train), [EXPORT], MPIRUN (list), CONFIG, DATA, WORK, PAIRS
# ("ranksA|flags A|ranksB|flags B[|loss,norm divisors]" entries joined by '@'),
# and optionally EXTRA (more --set flags for every run, the reference included).
cmake_policy(SET CMP0007 NEW)  # keep empty fields (a layout with no flags)
include(${CMAKE_CURRENT_LIST_DIR}/e2e_common.cmake)
file(REMOVE_RECURSE ${WORK})
separate_arguments(extra UNIX_COMMAND "${EXTRA}")
set(common --config ${CONFIG} --set data.train=${DATA} --set model.vocab_size=300 --set model.n_layer=8
    --set model.d_model=64 --set model.seq_len=64 --set train.micro_batch_size=2 --set log.interval=5 --set train.lr_decay_steps=10
    --set log.param_norm=true ${extra})
if("${EXTRA}" MATCHES "train.ema_decay")
  list(APPEND common --set data.val=${DATA} --set eval.batches=2)
endif()
run(init ${TRAIN} ${common} --set train.steps=1 --set output.dir=${WORK}/init)
set(from --set init.from=${WORK}/init/model.safetensors)
set(second_half)
if(FRESH_OPTIMIZER)
  set(second_half --set checkpoint.load_optimizer=false)
  run("reference, first half" ${TRAIN} ${common} ${from} --set train.steps=5
      --set checkpoint.dir=${WORK}/reference_ck --set output.dir=${WORK}/reference)
  run("reference, second half" ${TRAIN} ${common} ${from} ${second_half} --set train.steps=10
      --set checkpoint.dir=${WORK}/reference_ck --set checkpoint.resume=auto
      --set output.dir=${WORK}/reference)
  if(NOT run_output MATCHES "the optimizer starts afresh")
    message(FATAL_ERROR "the reference did not resume without its optimizer:\n${run_output}")
  endif()
else()
  run(reference ${TRAIN} ${common} ${from} --set train.steps=10 --set output.dir=${WORK}/reference)
endif()

field(${WORK}/reference loss reference)
field(${WORK}/reference grad_norm reference_norms)
field(${WORK}/reference param_norm reference_param_norms)
field(${WORK}/reference val_ema_loss reference_val_ema)
if("${EXTRA}" MATCHES "train.ema_decay" AND NOT reference_val_ema)
  message(FATAL_ERROR "one process reported no val_ema_loss with train.ema_decay")
endif()
list(LENGTH reference n)
if(NOT n EQUAL 10)
  message(FATAL_ERROR "expected 10 steps from the reference, got ${n}")
endif()
# The resumed runs log steps 6-10.
list(SUBLIST reference 5 5 reference)
list(SUBLIST reference_norms 5 5 reference_norms)
list(SUBLIST reference_param_norms 5 5 reference_param_norms)
string(REPLACE "@" ";" pairs "${PAIRS}")
set(index 0)
foreach(pair IN LISTS pairs)
  string(REPLACE "|" ";" parts "${pair}")
  list(GET parts 0 ranks_a)
  list(GET parts 1 flags_a)
  list(GET parts 2 ranks_b)
  list(GET parts 3 flags_b)
  tolerances("${parts}" 4 loss_div norm_div)
  separate_arguments(flags_a UNIX_COMMAND "${flags_a}")
  separate_arguments(flags_b UNIX_COMMAND "${flags_b}")
  math(EXPR index "${index} + 1")
  set(dir ${WORK}/pair${index})
  set(label "${ranks_a} ranks [${flags_a}] -> ${ranks_b} ranks [${flags_b}]")
  run("${label}: first half" ${MPIRUN} -np ${ranks_a} ${TRAIN} ${common} ${from} ${flags_a}
      --set train.steps=5 --set checkpoint.dir=${dir}/ck --set output.dir=${dir}/a)
  run("${label}: second half" ${MPIRUN} -np ${ranks_b} ${TRAIN} ${common} ${from} ${second_half}
      ${flags_b} --set train.steps=10 --set checkpoint.dir=${dir}/ck
      --set checkpoint.resume=auto --set output.dir=${dir}/b)
  if(NOT run_output MATCHES "written with another layout" AND NOT FRESH_OPTIMIZER)
    message(FATAL_ERROR "${label}: the second half did not resume across layouts:\n${run_output}")
  endif()
  if(FRESH_OPTIMIZER AND NOT run_output MATCHES "the optimizer starts afresh")
    message(FATAL_ERROR "${label}: the second half kept its optimizer:\n${run_output}")
  endif()
  field(${dir}/b loss got)
  field(${dir}/b grad_norm got_norms)
  expect_close("${label} loss" "${reference}" "${got}" ${loss_div})
  expect_close("${label} gradient norm" "${reference_norms}" "${got_norms}" ${norm_div})
  field(${dir}/b param_norm got_param_norms)
  expect_close("${label} parameter norm" "${reference_param_norms}" "${got_param_norms}" ${loss_div})
  if(reference_val_ema)
    field(${dir}/b val_ema_loss got_val_ema)
    expect_close("${label} averaged weights' validation loss" "${reference_val_ema}"
                 "${got_val_ema}" ${loss_div})
  endif()
  message(STATUS "${label}: steps 6-10 match one process (within 1/${loss_div})")
  # The second half's last checkpoint, sharded its way, exports to the same
  # bytes as its final model (triad-export --checkpoint joins the shards).
  if(DEFINED EXPORT)
    run("${label}: export of the run" ${EXPORT} --run ${dir}/b --output ${dir}/hf_run)
    run("${label}: export of the checkpoint" ${EXPORT} --checkpoint ${dir}/ck --output ${dir}/hf_ck)
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${dir}/hf_run/model.safetensors
                            ${dir}/hf_ck/model.safetensors RESULT_VARIABLE differ)
    if(differ)
      message(FATAL_ERROR "${label}: the checkpoint exports other weights than the run's model")
    endif()
  endif()
  # The first pair: a new run under layout B with init.from the checkpoint
  # (each pipeline rank reading its own blocks) trains as one from the model.
  if(index EQUAL 1)
    expect_init_from_checkpoint("${label}" ${dir}/ck ${dir}/b/model.safetensors ${dir}
                                ${MPIRUN} -np ${ranks_b} ${TRAIN} ${common} ${flags_b}
                                --set train.steps=2)
  endif()
endforeach()
message(STATUS "${index} layout changes checked")
