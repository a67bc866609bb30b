# A LLaMA-2-style workflow end to end with a SentencePiece tokenizer.model:
# tokenize text with it, train a LLaMA-style model on its 700 ids, sample
# from the run with <s> before the prompt, export the run to Hugging Face's
# layout with the tokenizer beside the weights, and sample again from the
# exported directory alone (its tokenizer.model read by --tokenizer DIR):
# the texts must be the same and continue the prompt.
#   -DTOKENIZE= -DTRAIN= -DEXPORT= -DGENERATE= -DCONFIG= -DTEXT= -DMODEL= -DWORK=
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
run("triad-tokenize" ${TOKENIZE} --input ${TEXT} --output ${WORK}/sp.bin --tokenizer ${MODEL})
if(NOT out MATCHES "vocab 700")
  message(FATAL_ERROR "triad-tokenize did not read the 700-piece model:\n${out}")
endif()
run("triad-train" ${TRAIN} --config ${CONFIG} --set data.train=${WORK}/sp.bin
    --set model.vocab_size=700 --set train.steps=10 --set train.warmup_steps=2
    --set output.dir=${WORK}/run)
run("triad-export" ${EXPORT} --run ${WORK}/run --output ${WORK}/hf --tokenizer ${MODEL})
if(NOT out MATCHES "tokenizer.model")
  message(FATAL_ERROR "triad-export did not name the tokenizer it copied:\n${out}")
endif()
file(SHA256 ${MODEL} want)
file(SHA256 ${WORK}/hf/tokenizer.model got)
if(NOT want STREQUAL got)
  message(FATAL_ERROR "the exported tokenizer.model differs from ${MODEL}")
endif()
set(sample --prompt "The model" --tokens 30 --temperature 1 --top-k 0 --seed 3 --stop-token -1
           --bos-token <s>)
run("triad-generate (run)" ${GENERATE} --run ${WORK}/run --tokenizer ${MODEL} ${sample})
set(from_run "${out}")
run("triad-generate (export)" ${GENERATE} --config ${WORK}/run/config.yaml --weights ${WORK}/hf
    --tokenizer ${WORK}/hf ${sample})
if(NOT from_run STREQUAL out OR NOT from_run MATCHES "^The model")
  message(FATAL_ERROR "samples differ:\nrun: ${from_run}\nexported: ${out}")
endif()
message(STATUS "same sample from the run and its export: ${from_run}")
