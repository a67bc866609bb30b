#pragma once

// Multiple-choice questions for evaluating a language model (HellaSwag's
// and the like): a context, the texts that may follow it, and the one that
// does. The model answers by which choice it finds most likely after the
// context (nn/evaluate.h).

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "triad/data/chat_template.h"
#include "triad/data/tokenizer.h"

namespace triad::data {

// Choice i is scored as the continuation choices[i] of context_of(i): the
// question's one context, or (WinoGrande's partial scoring, where each
// option fills a blank in the context and the rest of the sentence is what
// is scored) a context of each choice's own.
struct ChoiceQuestion {
  std::string context;
  std::vector<std::string> choices;   // at least two
  int64_t answer = 0;                 // the right choice's index
  std::vector<std::string> contexts;  // empty, or one per choice
  // Put once before all the rest, few-shot examples included: a task's
  // description (MMLU's "The following are multiple choice questions ...").
  std::string heading;
  // Which few-shot examples may show how to answer it (MMLU's subject);
  // empty: any.
  std::string group;
  // For few-shot examples drawn as lm-evaluation-harness draws them
  // (fewshot_sampler.h): whether its task draws one example more than it
  // shows (HellaSwag, PIQA, WinoGrande, BoolQ and Social IQa name no test
  // split, which the harness takes for drawing from the questions' own),
  // and its line's JSON object, hashed, which tells a drawn example that
  // is the question itself (the harness drops it).
  bool draws_one_more = false;
  uint64_t line_digest = 0;
  // Its task's examples are the first of its file even when drawing (the
  // harness's first_n sampler: MMLU's, MMLU-Pro's).
  bool first_examples = false;
  // Its task's own separator between the context and a choice, used for it
  // instead of the one given (MMLU-Pro's target_delimiter is "").
  std::optional<std::string> separator;
  // The few-shot examples add_examples put before the context (and each of
  // contexts): their text, and each example's context and right choice (a
  // chat model's turns, choice_chat).
  std::string examples_text;
  std::vector<std::pair<std::string, std::string>> example_turns;
  // TruthfulQA's second set of answers (mc2_targets), scored after the same
  // context: its first mc2_true are true, and the question's MC2 score is
  // the share of the set's probability they hold
  // (nn::true_probability_share). Empty for other questions.
  std::vector<std::string> mc2_choices;
  int64_t mc2_true = 0;
  std::string context_of(size_t choice) const {
    return heading + (contexts.empty() ? context : contexts.at(choice));
  }
};

// Questions from JSON lines, one object per non-blank line, in one of
// these forms (other fields are ignored):
//  - a context and its choices: the context under "ctx" (HellaSwag's) or
//    "context", the choices under "endings" (HellaSwag's) or "choices" (a
//    list of strings), the right one's index under "label" (HellaSwag's) or
//    "answer" (a number, or a string of digits as Hugging Face's copy of
//    HellaSwag writes it); a line with these is read so, whatever else it
//    holds;
//  - WinoGrande's lines as they come: "sentence" with a blank "_",
//    "option1", "option2" and "answer" ("1" or "2"). As
//    lm-evaluation-harness scores it, option k's context is the sentence up
//    to the blank with the option in it, and the choice scored after it is
//    the rest of the sentence (stripped of surrounding whitespace), the
//    same text for both options;
//  - a context of each choice's own: "contexts" (a list of strings) and
//    one "continuation" scored after each, with "answer" as above;
//  - the lines of ARC ("question", "choices": {"text", "label"},
//    "answerKey"), OpenBookQA ("question_stem", the same choices), PIQA
//    ("goal", "sol1", "sol2", "label"), BoolQ ("passage", "question", and
//    "label" or a true/false "answer"), Social IQa ("context", "question",
//    "answerA" to "answerC", "label" from 1) and MMLU ("question",
//    "subject", "choices": a list, "answer") as Hugging Face's copies hold
//    them, each made the context and choices of lm-evaluation-harness's
//    default prompt for the task (BoolQ's choices are no and yes, MMLU's
//    the letters A, B, ...);
//  - MMLU-Pro's (TIGER-Lab/MMLU-Pro: "question", "options", "answer" a
//    letter, or "answer_index"), as the harness's leaderboard_mmlu_pro asks
//    them: the question, each option after its letter on a line of its
//    own, "Answer:", the letters scored right after it (no separator);
//  - TruthfulQA's multiple-choice lines ("question", "mc1_targets" and
//    "mc2_targets", each {"choices", "labels"}), asked after the paper's
//    six-question QA prompt as lm-evaluation-harness's truthfulqa_mc1 and
//    truthfulqa_mc2 ask them: mc1's choices, the one labelled 1 right, and
//    mc2's as mc2_choices, those labelled 1 before the first 0 true.
// The first `limit` questions (0: all). Errors name `where`, the line and
// what it lacks (an unlabelled test split, HellaSwag's or WinoGrande's,
// says so).
//
// HellaSwag's lines are asked one of two ways. Raw (llm.c's, the default):
// "ctx" and "endings" as they stand. Harness (lm-evaluation-harness's):
// "<activity_label>: <ctx_a> <ctx_b, capitalised>" and each ending, both
// cleaned of WikiHow's bracketed markers (" [title]" becomes ". ", other
// "[...]" go, a double space becomes one) and stripped.
enum class HellaSwagPrompt { Raw, Harness };
HellaSwagPrompt hellaswag_prompt_from_string(const std::string& name);  // "llmc", "harness"
std::vector<ChoiceQuestion> read_choice_questions(std::istream& in, const std::string& where,
                                                  int64_t limit = 0,
                                                  HellaSwagPrompt hellaswag = HellaSwagPrompt::Raw);
// A file compressed with gzip or Zstandard is read through it
// (data/text_input.h).
std::vector<ChoiceQuestion> read_choice_questions(const std::string& path, int64_t limit = 0,
                                                  HellaSwagPrompt hellaswag = HellaSwagPrompt::Raw);

// Few-shot prompting, as lm-evaluation-harness writes it: `shots` solved
// examples go before each question's context (after its heading), each
// written as its context (the right choice's, where each has its own),
// `separator`, its right choice and a blank line. The examples are the
// first `shots` questions of `examples`, in file order, of the question's
// group (any when it has none), the question itself left out when
// `examples` come from the questions' own file (`same_file`: examples[k] is
// question k). Fewer than `shots` such examples is a ValueError naming
// `where`, the question and its group.
//
// With `draw_seed`, the examples of a question without a group are drawn at
// random as lm-evaluation-harness draws them (FewshotDraw seeded so, one
// draw per question in order; one example more drawn from the questions'
// own file or for a task that draws one more, and a drawn example equal to
// the question dropped). Grouped questions and those whose task takes the
// first examples (MMLU's, MMLU-Pro's: first_examples) still take the first
// (of their group), as the harness's first_n sampler does for them. An
// example's own separator, where its task has one, goes in its place.
void add_examples(std::vector<ChoiceQuestion>& questions,
                  const std::vector<ChoiceQuestion>& examples, int64_t shots,
                  const std::string& separator, bool same_file, const std::string& where,
                  std::optional<uint64_t> draw_seed = std::nullopt);

// A context's and a continuation's tokens, each encoded alone, the
// context's trailing whitespace moved to the front of the continuation
// first (lm-evaluation-harness's rule: "Answer: " + "Paris" is scored as
// "Answer:" + " Paris", the split a BPE tokenizer makes of the whole).
std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_context_and_continuation(
    const Tokenizer& tok, const std::string& context, const std::string& continuation);

// The conversation lm-evaluation-harness asks a chat model for question
// `q` (fewshot_context under --apply_chat_template; each choice is then
// scored as what the assistant answers, no separator before it): a system
// message of `system` and q's heading (the task's description, MMLU's),
// joined by a blank line, when either is given; then q's context, its
// few-shot examples with it, as one user message, or with `multiturn`
// (--fewshot_as_multiturn) each example's context as a user message
// answered by its right choice, then q's own context. A question with a
// context per choice (WinoGrande's, which the harness asks otherwise) is a
// ValueError naming `where`.
std::vector<ChatMessage> choice_chat(const ChoiceQuestion& q, bool multiturn,
                                     const std::string& system, const std::string& where);

// encode_context_and_continuation for a context a chat template wrote out
// (its markers as special pieces): the context's trailing whitespace moved
// to the front of the continuation, as the harness moves it, then the
// context tokenized piece by piece (markers by id) and the continuation
// encoded alone.
std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_chat_context_and_continuation(
    const Tokenizer& tok, SegmentedDocument context, const std::string& continuation);

// Unicode characters (code points) in UTF-8 text, as Python's len counts
// them: the bytes that do not continue a character.
int64_t utf8_characters(const std::string& text);

// Words in text as lm-evaluation-harness counts them for a word-level
// perplexity (WikiText's): len(re.split(r"\s+", text)), one more than the
// runs of white space (so white space at either end counts a word).
int64_t count_words(const std::string& text);

}  // namespace triad::data
