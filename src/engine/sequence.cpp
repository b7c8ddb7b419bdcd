// One request's generation as a state machine: token choice, stop rules, text and logprob deltas.
#include "engine/sequence.h"

#include <algorithm>
#include <bit>
#include <stdexcept>

namespace lily {

TokenLogprobs token_logprobs_from_record(const int32_t* record) {
  using L = TokenRecordLayout;
  TokenLogprobs out;
  out.token = record[L::kToken];
  out.logprob = std::bit_cast<float>(record[L::kLogprob]);
  const int count = std::max(0, std::min(record[L::kTopCount], kMaxTopLogprobs));
  out.top.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    out.top.emplace_back(record[L::kTopIds + i], std::bit_cast<float>(record[L::kTopLogprobs + i]));
  }
  return out;
}

Sequence::Sequence(const Tokenizer* tokenizer, SequenceConfig config)
    : tokenizer_(tokenizer), config_(std::move(config)), stops_(config_.stop_strings) {
  if (config_.max_tokens < 1) throw std::invalid_argument("Sequence: max_tokens must be >= 1");
  if (config_.top_logprobs > kMaxTopLogprobs) {
    throw std::invalid_argument("Sequence: top_logprobs above " + std::to_string(kMaxTopLogprobs));
  }
  if (tokenizer_ == nullptr && !config_.stop_strings.empty()) {
    throw std::invalid_argument("Sequence: stop strings need a tokenizer");
  }
  if (config_.sampling) config_.sampling->top_logprobs = config_.top_logprobs;
  if (tokenizer_ != nullptr) {
    detokenizer_ = std::make_unique<IncrementalDetokenizer>(*tokenizer_, /*skip_special=*/true);
  }
  tokens_.reserve(static_cast<size_t>(std::min<int64_t>(config_.max_tokens, 1 << 16)));
  const ForcingPlan& plan = config_.forcing;
  if (plan.reasoning_budget >= 0 && plan.reasoning_end >= 0 &&
      std::find(plan.reasoning_close.begin(), plan.reasoning_close.end(), plan.reasoning_end) ==
          plan.reasoning_close.end()) {
    throw std::invalid_argument("Sequence: reasoning_close must contain the reasoning end token");
  }
  in_reasoning_ = plan.reasoning_end >= 0;
  forced_ = plan.prefix;
  if (!in_reasoning_) {
    forced_.insert(forced_.end(), plan.after_reasoning.begin(), plan.after_reasoning.end());
  } else if (plan.reasoning_budget == 0) {
    close_forced_ = true;
    forced_.insert(forced_.end(), plan.reasoning_close.begin(), plan.reasoning_close.end());
  }
}

std::vector<int32_t> Sequence::take_forced() {
  std::vector<int32_t> out;
  if (!finished()) std::swap(out, forced_);
  return out;
}

const char* Sequence::finish_reason() const {
  switch (end_) {
    case SequenceEnd::running: return "";
    case SequenceEnd::stop_token:
    case SequenceEnd::stop_string: return "stop";
    case SequenceEnd::length: return "length";
    case SequenceEnd::cancelled: return "cancelled";
  }
  return "";
}

void Sequence::release(std::string piece) {
  if (piece.empty()) return;
  text_ += piece;
  pending_.text += piece;
}

void Sequence::end_with(SequenceEnd end) {
  end_ = end;
  if (end == SequenceEnd::cancelled || end == SequenceEnd::stop_string) return;
  // A stop token or the length limit: what the detokenizer and the stop matcher still hold
  // is final text (an incomplete character becomes U+FFFD, as in a whole decode).
  if (detokenizer_) {
    StopStringMatcher::Release tail = stops_.push(detokenizer_->finish());
    release(std::move(tail.text));
    if (tail.stopped) {
      end_ = SequenceEnd::stop_string;
      return;
    }
    release(stops_.flush());
  }
}

bool Sequence::accept(int32_t token, const int32_t* record) {
  if (finished()) throw std::logic_error("Sequence::accept after the end");
  tokens_.push_back(token);
  const bool stop_token = config_.stop_tokens.count(token) != 0;
  if (in_reasoning_) {
    const ForcingPlan& plan = config_.forcing;
    ++reasoning_tokens_;
    if (token == plan.reasoning_end) {
      in_reasoning_ = false;
      forced_.insert(forced_.end(), plan.after_reasoning.begin(), plan.after_reasoning.end());
    } else if (plan.reasoning_budget >= 0 && reasoning_tokens_ >= plan.reasoning_budget &&
               !close_forced_) {
      close_forced_ = true;
      forced_.insert(forced_.end(), plan.reasoning_close.begin(), plan.reasoning_close.end());
    }
  }
  // A stop token is not content: it gets no logprobs entry (its text is skipped too).
  if (record != nullptr && wants_logprobs() && !stop_token) {
    pending_.logprobs.push_back(token_logprobs_from_record(record));
  }
  if (detokenizer_ && token >= 0) {
    StopStringMatcher::Release out = stops_.push(detokenizer_->push(static_cast<uint32_t>(token)));
    release(std::move(out.text));
    if (out.stopped) {
      end_with(SequenceEnd::stop_string);
      return false;
    }
  }
  if (stop_token) {
    end_with(SequenceEnd::stop_token);
    return false;
  }
  if (static_cast<int64_t>(tokens_.size()) >= config_.max_tokens) {
    end_with(SequenceEnd::length);
    return false;
  }
  return true;
}

void Sequence::cancel() {
  if (!finished()) end_with(SequenceEnd::cancelled);
}

SequenceDelta Sequence::take_delta() {
  SequenceDelta out;
  std::swap(out, pending_);
  return out;
}

}  // namespace lily
