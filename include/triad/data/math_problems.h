#pragma once

// Math word problems answered by generation: GSM8K (Cobbe et al., 2021),
// scored as lm-evaluation-harness's `gsm8k` task scores it. The model
// continues a few-shot prompt greedily; a number is taken out of what it
// wrote (strictly after "#### ", as the worked solutions end, or flexibly,
// the last number it wrote) and must equal the solution's final answer
// once both are normalised (commas, dollar signs, a final full stop and
// case set aside). triad-eval --gsm8k runs it (docs/evaluation.md).

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "triad/data/chat_template.h"

namespace triad::data {

struct MathProblem {
  std::string question;
  // The worked solution, ending in "#### " and the final answer (GSM8K's
  // "answer" field as it comes).
  std::string answer;
};

// JSON lines with strings "question" and "answer" each (GSM8K's test.jsonl
// and train.jsonl as OpenAI and Hugging Face publish them; other fields
// ignored). The first `limit` problems (0: all). Errors name `where` and
// the line: one that does not parse, lacks either string, or whose answer
// has no "#### " final answer.
std::vector<MathProblem> read_math_problems(std::istream& in, const std::string& where,
                                            int64_t limit = 0);
// From a file (gzip and Zstandard too, data/text_input.h).
std::vector<MathProblem> read_math_problems(const std::string& path, int64_t limit = 0);

// The prompt for `problem` after `shots` solved examples, as
// lm-evaluation-harness's gsm8k builds it: each example "Question: "
// question "\nAnswer: " answer, the examples and the problem joined by a
// blank line, the problem ending "\nAnswer:" (the model writes the rest).
std::string math_prompt(const MathProblem& problem, const std::vector<MathProblem>& shots);

// The conversation lm-evaluation-harness's gsm8k asks a chat model
// (--apply_chat_template), for a chat template to write out with the
// opening of the assistant's turn: a system message when `system` is not
// empty (--system_instruction), then either one user message holding
// math_prompt's text, examples and problem alike, or with `multiturn`
// (--fewshot_as_multiturn) a user message per example ("Question: "
// question "\nAnswer:") answered by an assistant message (its solution),
// then the problem's user message.
std::vector<ChatMessage> math_chat(const MathProblem& problem,
                                   const std::vector<MathProblem>& shots, bool multiturn,
                                   const std::string& system);

// The first n problems of `pool` other than its problem `skip` (-1: none
// skipped): few-shot examples from the evaluated file itself (skipping the
// problem asked) or from another (a train split, where
// lm-evaluation-harness draws its examples at random). Fewer than n there
// is a ValueError naming `what`.
std::vector<MathProblem> first_shots(const std::vector<MathProblem>& pool, int64_t n, int64_t skip,
                                     const std::string& what);

// Each of `problems`' examples drawn from `pool` as lm-evaluation-harness's
// gsm8k draws them (fewshot_sampler.h): random.Random(seed), n sampled per
// problem in turn — n + 1 when `pool` is the problems' own file
// (`same_file`: pool[k] is problem k), a drawn problem equal to the one
// asked dropped — and the first n kept. A pool too small for the draw is a
// ValueError naming `what`.
std::vector<std::vector<MathProblem>> drawn_shots(const std::vector<MathProblem>& problems,
                                                  const std::vector<MathProblem>& pool, int64_t n,
                                                  bool same_file, uint64_t seed,
                                                  const std::string& what);

// What generation wrote, cut before the first of `stops` it holds (each
// non-empty stop; lm-evaluation-harness's `until`).
std::string cut_at_stops(const std::string& text, const std::vector<std::string>& stops);

// What does not count as an answer: the extraction found no number.
inline const std::string kInvalidAnswer = "[invalid]";

// The strict extraction ("strict-match"): the first number written after
// "#### " (regular expression `#### (-?[0-9.,]+)`), or kInvalidAnswer.
std::string strict_answer(const std::string& generated);
// The flexible extraction ("flexible-extract"): the last match of
// `(-?[$0-9.,]{2,})|(-?[0-9]+)` in what was written, or kInvalidAnswer.
std::string flexible_answer(const std::string& generated);
// An answer (extracted, or a solution) as exact match compares it: commas
// and dollar signs removed, everything through the last "#### " removed, a
// final full stop removed (also one just before a final newline, as
// Python's `\.$` finds it), then ASCII letters lower-cased.
std::string normalize_answer(const std::string& text);
// Whether `extracted` is the final answer of `problem`'s solution.
bool answer_matches(const std::string& extracted, const MathProblem& problem);

}  // namespace triad::data
