// Greedy generation over a model and a session state, with Lily's fed-token accounting.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>

namespace lily {

std::vector<std::pair<int32_t, float>> top_logits(const std::vector<float>& logits, int k) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto count = std::min<size_t>(static_cast<size_t>(std::max(k, 0)), order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)];
                      const float lb = logits[static_cast<size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  std::vector<std::pair<int32_t, float>> out;
  for (size_t i = 0; i < count; ++i) out.emplace_back(order[i], logits[static_cast<size_t>(order[i])]);
  return out;
}

GenerationResult generate_greedy(Qwen36Model& model, DecodeState& state,
                                 std::span<const int32_t> prompt, const GenerationOptions& options) {
  if (prompt.empty()) throw std::invalid_argument("generate_greedy: empty prompt");
  if (options.max_tokens < 0) throw std::invalid_argument("generate_greedy: negative max_tokens");
  GenerationResult result;
  std::vector<float> logits;
  // Runs the model on `tokens`, appends the greedy token and records its top logits.
  auto step = [&](std::span<const int32_t> tokens) {
    model.forward(state, tokens);
    if (options.top_logits > 0) {
      model.logits_to_host(logits);
      result.steps.push_back(top_logits(logits, options.top_logits));
    }
    result.tokens.push_back(model.next_token_to_host());
  };
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  result.tokens.reserve(static_cast<size_t>(options.max_tokens));
  // Prefill in the model's chunks so that cancellation is seen between them; the result is the
  // same as one forward() over the whole prompt, which chunks identically.
  const auto piece = static_cast<size_t>(std::max<int64_t>(model.chunk(), 1));
  for (size_t begin = 0; begin < prompt.size(); begin += piece) {
    if (options.cancel_prefill && options.cancel_prefill()) {
      result.finish_reason = "cancelled";
      result.prompt_unfed = static_cast<int64_t>(prompt.size() - begin);
      result.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      return result;
    }
    const size_t count = std::min(piece, prompt.size() - begin);
    if (begin + count < prompt.size()) {
      model.forward(state, prompt.subspan(begin, count));
    } else {
      step(prompt.subspan(begin, count));
    }
  }
  const Clock::time_point first = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(first - start).count();
  auto finish = [&](const char* reason, int64_t fed) {
    result.finish_reason = reason;
    result.fed = fed;
    result.decode_seconds = std::chrono::duration<double>(Clock::now() - first).count();
    return result;
  };
  for (;;) {
    const int32_t last = result.tokens.back();
    const bool is_stop = options.stop_tokens.count(last) != 0;
    const bool cancelled = options.on_token && !options.on_token(last);
    const auto produced = static_cast<int64_t>(result.tokens.size());
    if (is_stop) {
      // Lily's pipelined decode has already fed the stop token when it sees it (except on
      // token 0); feeding it here keeps the state identical across backends.
      if (produced < 2) return finish("stop", 0);
      model.forward(state, std::span<const int32_t>(&result.tokens.back(), 1));
      return finish("stop", produced);
    }
    if (cancelled) return finish("cancelled", produced - 1);
    if (produced >= options.max_tokens) return finish("length", produced - 1);
    step(std::span<const int32_t>(&result.tokens.back(), 1));
  }
}

}  // namespace lily
