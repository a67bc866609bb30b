// The trainer's evaluations: validation loss, multiple-choice and LAMBADA
// scores (with the weights' moving average too), and samples of text.

#include "triad/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "triad/autograd/grad_mode.h"
#include "triad/nn/documents.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad::train {

double Trainer::evaluate(size_t set) {
  if (set >= val_.size()) {
    throw ValueError("evaluate: the config has " + std::to_string(val_.size()) +
                     " validation set(s) (data.val), not a set " + std::to_string(set));
  }
  const ValidationData& val = val_[set];
  if (reducer_) reducer_->wait_gathers();  // (the forward's fences would too, part by part)
  autograd::InferenceGuard inference;
  const auto& t = config_.train;
  const int64_t per_rank = t.global_batch_size / dp_;
  const int64_t micro = per_rank / t.micro_batch_size;
  const int64_t first = dp_rank_ * per_rank;
  std::vector<data::Batch> batches;
  for (int64_t k = 0; k < val.batches; ++k) {
    for (int64_t i = 0; i < micro; ++i) {
      batches.push_back(with_loss_mask(val.data->batch(
          k, t.global_batch_size, first + i * t.micro_batch_size, t.micro_batch_size)));
    }
  }
  // The mean of the micro-batches' mean losses, or (train.loss_average:
  // tokens) the mean over every unmasked target of the evaluation.
  weigh_by_tokens(batches);
  double mean = 0;
  if (pp_model_) {
    mean = executor_->evaluate(batches);
  } else {
    const nn::ForwardContext ctx{false, t.seed, 0};  // no dropout
    Tensor loss_sum;                                 // on the loss's device, read once
    for (const data::Batch& b : batches) {
      Tensor loss = tp_model_ ? tp_model_->loss(b.inputs, b.targets, ctx)
                              : model_->loss(b.inputs, b.targets, ctx);
      Tensor part = cast(loss, DType::F64);
      if (b.loss_weight >= 0)
        part = scale(part, b.loss_weight * static_cast<double>(batches.size()));
      loss_sum = loss_sum.defined() ? add(loss_sum, part) : part;
    }
    mean = item(loss_sum) / static_cast<double>(batches.size());
  }
  if (mesh_ && data_parallel_ranks() > 1) {
    Tensor l = from_vector(std::vector<double>{mean}, {1}, DType::F64);
    mesh_->dp()->all_reduce(l, dist::ReduceOp::Avg)->wait();
    mean = item(l);
  }
  return mean;
}

void Trainer::evaluate_into(StepMetrics& m) {
  for (size_t i = 0; i < val_.size(); ++i) {
    const double loss = evaluate(i);
    if (i == 0) m.val_loss = loss;
    if (!val_[i].name.empty()) m.val_losses.emplace_back(val_[i].name, loss);
  }
  fold_ema();
  if (!ema_folded_) return;  // (the averages are still the weights)
  with_ema_weights([&] {
    for (size_t i = 0; i < val_.size(); ++i) {
      const double loss = evaluate(i);
      if (i == 0) m.val_ema_loss = loss;
      if (!val_[i].name.empty()) m.val_ema_losses.emplace_back(val_[i].name, loss);
    }
  });
}

std::vector<double> Trainer::row_losses(const std::vector<data::Batch>& given,
                                        std::vector<bool>* greedy) {
  autograd::InferenceGuard inference;
  // Under expert parallelism the ranks of an expert-parallel group run their
  // MoE layers together: each runs as many batches as the group's busiest,
  // the ones added (a row of padding, scoring nothing) dropped after.
  std::vector<data::Batch> padded;
  const std::vector<data::Batch>& batches = [&]() -> const std::vector<data::Batch>& {
    if (!mesh_ || config_.parallel.ep == 1) return given;
    Tensor most =
        from_vector(std::vector<double>{static_cast<double>(given.size())}, {1}, DType::F64);
    mesh_->ep()->all_reduce(most, dist::ReduceOp::Max)->wait();
    padded = given;
    const int64_t T = config_.model.seq_len;
    while (static_cast<double>(padded.size()) < item(most)) {
      padded.push_back({zeros({1, T}, DType::I64), full({1, T}, -100, DType::I64)});
    }
    return padded;
  }();
  const auto scored = [&](std::vector<double> losses) {
    size_t rows = 0;
    for (const data::Batch& b : given) rows += static_cast<size_t>(b.inputs.size(0));
    losses.resize(rows);
    if (greedy) greedy->resize(rows);
    return losses;
  };
  if (pp_model_) return scored(executor_->row_losses(batches, greedy));
  if (greedy) greedy->clear();
  const nn::ForwardContext no_dropout{false, config_.train.seed, 0};
  std::vector<double> out;
  for (const data::Batch& b : batches) {
    // Each row one document, as nn::score_continuations reads a request.
    nn::ForwardContext ctx = nn::with_one_document(config_.model, b.inputs, no_dropout, device_);
    if (tp_model_) ctx = tp_model_->chunked(b.inputs, ctx);
    std::vector<Tensor> losses;
    auto row = [&](int64_t i, const Tensor& x) { return narrow(x, 0, i, 1); };
    if (tp_model_) {
      Tensor x = tp_model_->embed(b.inputs, ctx);
      x = tp_model_->blocks(tp_model_->plan().layers, x, ctx);
      for (int64_t i = 0; i < b.inputs.size(0); ++i) {
        losses.push_back(tp_model_->head_loss(row(i, x), row(i, b.targets)));
      }
      if (greedy) {
        for (const bool g : nn::rows_argmax_match(b.targets, [&](int64_t i, int64_t at, int64_t n) {
               return tp_model_->head_logits(row(i, x), at, n);
             })) {
          greedy->push_back(g);
        }
      }
    } else {
      Tensor x = model_->embed(b.inputs, ctx);
      for (int64_t i = 0; i < config_.model.n_layer; ++i) x = model_->block(i).forward(x, ctx);
      for (int64_t i = 0; i < b.inputs.size(0); ++i) {
        losses.push_back(cross_entropy(model_->head(row(i, x)), row(i, b.targets)));
      }
      if (greedy) {
        for (const bool g : nn::rows_argmax_match(b.targets, [&](int64_t i, int64_t at, int64_t n) {
               return model_->head(narrow(row(i, x), 1, at, n));
             })) {
          greedy->push_back(g);
        }
      }
    }
    for (Tensor& l : losses) l = reshape(cast(l, DType::F64), {1});
    Tensor all = contiguous(concat(losses, 0));
    if (cp_ > 1) {
      // Each context-parallel rank's row loss is its chunk's share times
      // cp: their mean is the row's.
      mesh_->cp()->all_reduce(all, dist::ReduceOp::Sum)->wait();
      all = scale(all, 1.0 / cp_);
    }
    for (const double v : to_double_vector(all)) out.push_back(v);  // one read
  }
  return scored(std::move(out));
}

StepMetrics::ChoiceScores Trainer::evaluate_choices(size_t set) {
  if (set >= choices_.size()) {
    throw ValueError("evaluate_choices: the config has " + std::to_string(choices_.size()) +
                     " set(s) of questions (eval.choices), not a set " + std::to_string(set));
  }
  if (reducer_) reducer_->wait_gathers();  // (the forward's fences would too, part by part)
  const std::vector<TokenizedQuestion>& questions = choices_[set].questions;
  ChoiceTally t;
  // (A longrope model's requests take the factors each would read alone
  // either way: the scorer reads them as rows when a pass of its own could
  // reach past the original context, and scoring_rows batches the rows
  // within it apart.)
  if (model_) {
    // One process: triad-eval's own scorer, which reads a question's
    // context once for all its choices, and a few-shot beginning once for
    // every question that starts with it; triad-eval's chunks of questions
    // bound the caches it holds.
    constexpr size_t kChunk = 64;
    std::vector<double> means;
    for (size_t first = 0; first < questions.size(); first += kChunk) {
      const std::vector<nn::ContinuationRequest> requests =
          question_requests({questions.begin() + static_cast<std::ptrdiff_t>(first),
                             questions.begin() + static_cast<std::ptrdiff_t>(
                                                     std::min(questions.size(), first + kChunk))});
      for (const auto& s :
           nn::score_continuations(*model_, requests, config_.train.micro_batch_size)) {
        means.push_back(s.nll / static_cast<double>(s.tokens));
      }
    }
    t = tally_choices(questions, means);
  } else if (!questions.empty() || config_.parallel.ep > 1) {
    // (More data-parallel ranks than questions leave some none; under expert
    // parallelism those run padding with their group.)
    const std::vector<nn::ContinuationRequest> all = question_requests(questions);
    const RequestRows rows = scoring_rows(all);
    const std::vector<double> losses = row_losses(rows.batches);
    std::vector<double> in_order(all.size());
    for (size_t k = 0; k < rows.order.size(); ++k) {
      if (rows.order[k] != RequestRows::kFiller) in_order[rows.order[k]] = losses[k];
    }
    t = tally_choices(questions, in_order);
  }
  if (mesh_ && data_parallel_ranks() > 1) {
    // (A replica's context-parallel ranks tally its questions alike.)
    const std::vector<double> tally = t.to_vector();
    Tensor sums =
        scale(from_vector(tally, {static_cast<int64_t>(tally.size())}, DType::F64), 1.0 / cp_);
    mesh_->dp()->all_reduce(sums, dist::ReduceOp::Sum)->wait();
    t = ChoiceTally::from_vector(to_double_vector(sums));
  }
  StepMetrics::ChoiceScores scores;
  scores.questions = static_cast<int64_t>(t.questions);
  scores.acc = t.right / t.questions;
  scores.acc_norm = t.right_norm / t.questions;
  scores.acc_per_token = t.right_per_token / t.questions;
  scores.answer_loss = t.answer_nll / t.answer_tokens;
  if (t.mc2_questions > 0) scores.mc2 = t.mc2 / t.mc2_questions;
  return scores;
}

RequestRows Trainer::scoring_rows(const std::vector<nn::ContinuationRequest>& requests) const {
  const int64_t pad = std::max<int64_t>(0, config_.model.eod_token);
  // Rows as wide as their batch's longest (not seq_len: HellaSwag's are
  // about a tenth of GPT-2's 1024), in multiples of 64 (few shapes for the
  // kernels' choices) that sequence parallelism can split over tp.
  // A longrope model's rows within its original context take the short
  // factors, as each would read alone (request_batches' short_rows).
  const int64_t tp = mesh_ ? mesh_->tp()->size() : 1;
  const bool sp = config_.parallel.sequence_parallel;
  // (Context parallelism's chunks, each split again under sequence
  // parallelism; the balanced layout's two half-chunks a rank.)
  const int64_t chunks =
      cp::row_multiple(config_.model, tp, cp_, sp, cp_exchange_.exchange, cp_exchange_.a2a);
  const int64_t multiple = std::lcm<int64_t>(64, chunks);
  const RopeScaling& rope = config_.model.rope_scaling;
  const int64_t short_rows =
      rope.kind == RopeScaling::Kind::LongRope ? static_cast<int64_t>(rope.original_seq_len) : 0;
  // (Under context parallelism those rows are a multiple of cp too: within
  // the original context whenever cp divides it.)
  return request_batches(requests, config_.model.seq_len, config_.train.micro_batch_size, pad,
                         multiple, short_rows, chunks);
}

StepMetrics::LambadaScores Trainer::evaluate_lambada(size_t set) {
  if (set >= lambada_.size()) {
    throw ValueError("evaluate_lambada: the config has " + std::to_string(lambada_.size()) +
                     " set(s) of texts (eval.lambada), not a set " + std::to_string(set));
  }
  if (reducer_) reducer_->wait_gathers();
  const std::vector<nn::ContinuationRequest>& texts = lambada_[set].texts;
  LambadaTally t;
  if (!texts.empty() || config_.parallel.ep > 1) {  // (as evaluate_choices)
    const RequestRows rows = scoring_rows(texts);
    std::vector<bool> greedy;
    const std::vector<double> losses = row_losses(rows.batches, &greedy);
    std::vector<double> mean_of(texts.size());
    std::vector<bool> greedy_of(texts.size());
    for (size_t k = 0; k < rows.order.size(); ++k) {
      if (rows.order[k] == RequestRows::kFiller) continue;
      mean_of[rows.order[k]] = losses[k];
      greedy_of[rows.order[k]] = greedy[k];
    }
    t = tally_lambada(texts, mean_of, greedy_of);
  }
  if (mesh_ && data_parallel_ranks() > 1) {
    Tensor sums = scale(from_vector(t.to_vector(), {3}, DType::F64), 1.0 / cp_);  // (as above)
    mesh_->dp()->all_reduce(sums, dist::ReduceOp::Sum)->wait();
    t = LambadaTally::from_vector(to_double_vector(sums));
  }
  return {static_cast<int64_t>(t.texts), t.accuracy(), t.mean_nll(), t.perplexity()};
}

double Trainer::evaluate_lambada_into(StepMetrics& m, size_t set) {
  const auto t0 = std::chrono::steady_clock::now();
  const StepMetrics::LambadaScores scores = evaluate_lambada(set);
  if (set == 0) m.lambada = scores;
  if (!lambada_[set].name.empty()) m.lambada_sets.emplace_back(lambada_[set].name, scores);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double Trainer::evaluate_ema_scores_into(StepMetrics& m) {
  if (choices_.empty() && lambada_.empty()) return 0;
  fold_ema();
  if (!ema_folded_) return 0;  // (the averages are still the weights)
  const auto t0 = std::chrono::steady_clock::now();
  with_ema_weights([&] {
    for (size_t i = 0; i < choices_.size(); ++i) {
      const StepMetrics::ChoiceScores scores = evaluate_choices(i);
      if (i == 0) m.choices_ema = scores;
      if (!choices_[i].name.empty()) m.choice_ema_sets.emplace_back(choices_[i].name, scores);
    }
    for (size_t i = 0; i < lambada_.size(); ++i) {
      const StepMetrics::LambadaScores scores = evaluate_lambada(i);
      if (i == 0) m.lambada_ema = scores;
      if (!lambada_[i].name.empty()) m.lambada_ema_sets.emplace_back(lambada_[i].name, scores);
    }
  });
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double Trainer::evaluate_choices_into(StepMetrics& m, size_t set) {
  const auto t0 = std::chrono::steady_clock::now();
  const StepMetrics::ChoiceScores scores = evaluate_choices(set);
  if (set == 0) m.choices = scores;
  if (!choices_[set].name.empty()) m.choice_sets.emplace_back(choices_[set].name, scores);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t Trainer::val_tokens() const {
  int64_t batches = 0;
  for (const auto& v : val_) batches += v.batches;
  return batches * config_.train.global_batch_size * config_.model.seq_len;
}

double Trainer::sample_into(StepMetrics& m) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> texts;
  if (model_) {  // (one process: no reducer, nothing to wait for)
    texts = continue_samples(*model_, *samples_, config_);
  } else {
    // A parallel model is whole on no rank: it is gathered, a tensor at a
    // time as for model.safetensors, into a copy on the logging rank alone,
    // which continues the prompts with it.
    std::unique_ptr<nn::Gpt> whole;
    std::map<std::string, Tensor> into;
    if (is_logging_rank()) {
      // (Not initialised: every parameter is gathered into it, or an error.)
      whole = std::make_unique<nn::Gpt>(config_.model, config_.train.seed, DType::F32,
                                        nn::Gpt::Init::None);
      whole->to(device_);
      for (auto& [name, p] : whole->named_parameters()) into[name] = p;
    }
    autograd::NoGradGuard no_grad;
    // (A name the whole model lacks is raised after the gather: the other
    // ranks are still giving their tensors.)
    std::string unknown;
    gather_model_each([&](const std::string& name, const Tensor& t) {
      if (!whole) return;
      const auto it = into.find(name);
      if (it == into.end()) {
        if (unknown.empty()) unknown = name;
        return;
      }
      copy_(it->second, t);
      into.erase(it);
    });
    if (whole) {
      if (!unknown.empty()) {
        throw Error("eval.samples: the gathered model has a tensor '" + unknown +
                    "' the whole model does not");
      }
      if (!into.empty()) {
        throw Error("eval.samples: the gathered model lacks '" + into.begin()->first + "' (and " +
                    std::to_string(into.size() - 1) + " more)");
      }
      texts = continue_samples(*whole, *samples_, config_);
    }
  }
  for (size_t i = 0; i < texts.size(); ++i) m.samples.emplace_back(samples_->texts[i], texts[i]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace triad::train
