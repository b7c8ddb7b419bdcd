// Generation over a model and a session state (argmax or sampled), with Lily's fed-token accounting.
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

namespace {

using Clock = std::chrono::steady_clock;

// The decode loops after the first token (already in result.tokens). Both end with `finish`.
struct DecodeLoop {
  Qwen36Model& model;
  DecodeState& state;
  const GenerationOptions& options;
  GenerationResult& result;
  Clock::time_point first;

  GenerationResult finish(const char* reason, int64_t fed) {
    result.finish_reason = reason;
    result.fed = fed;
    result.decode_seconds = std::chrono::duration<double>(Clock::now() - first).count();
    return std::move(result);
  }
  bool is_stop(int32_t token) const { return options.stop_tokens.count(token) != 0; }
  // on_token sees every token, the stop token included.
  TokenAction act(int32_t token, const int32_t* record) const {
    return options.on_token ? options.on_token(token, record) : TokenAction::proceed;
  }
  static const char* ended(TokenAction action) {
    return action == TokenAction::stop ? "stop" : "cancelled";
  }

  // One step at a time: feed the last token, read the next (and its logits, for top_logits).
  GenerationResult stepwise(const std::function<void(std::span<const int32_t>)>& step) {
    for (;;) {
      const int32_t last = result.tokens.back();
      const bool stop = is_stop(last);
      const TokenAction action = act(last, nullptr);
      const bool cancelled = action != TokenAction::proceed;
      const auto produced = static_cast<int64_t>(result.tokens.size());
      if (stop) {
        // Lily's pipelined decode has already fed the stop token when it sees it (except on
        // token 0); feeding it here keeps the state identical to the pipelined loop's.
        if (produced < 2) return finish("stop", 0);
        model.forward(state, std::span<const int32_t>(&result.tokens.back(), 1));
        return finish("stop", produced);
      }
      if (cancelled) return finish(ended(action), produced - 1);
      if (produced >= options.max_tokens) return finish("length", produced - 1);
      step(std::span<const int32_t>(&result.tokens.back(), 1));
    }
  }

  // Depth-2 pipelining (lily-reference §8.3): the step that feeds token i is submitted before
  // token i is read (the device feeds it from its own memory), so the host reads each token
  // while the next step runs. Token 0 came from submit_prefill into slot 0.
  GenerationResult pipelined(const int32_t* first_record) {
    const TokenChoice& choice = options.choice;
    const int32_t first_token = result.tokens.back();
    const bool stop0 = is_stop(first_token);
    const TokenAction action0 = act(first_token, first_record);
    if (stop0) return finish("stop", 0);
    if (action0 != TokenAction::proceed) return finish(ended(action0), 0);
    if (options.max_tokens <= 1) return finish("length", 0);
    model.submit_decode(state, 0, 1, choice);  // feeds token 0
    int pending = 1;                           // the slot of the step whose token is read next
    for (int64_t index = 1;; ++index) {
      const auto produced = index + 1;
      const bool more = produced < options.max_tokens;
      // Feeds token `index` before the host has seen it (unless it will be the last).
      if (more) model.submit_decode(state, pending, 1 - pending, choice);
      const int32_t token = model.wait_token(pending);
      result.tokens.push_back(token);
      const bool stop = is_stop(token);
      const TokenAction action = act(token, model.wait_record(pending));
      if (stop) {
        // The overshoot step fed the stop token; on the last allowed token, feed it now, as
        // every stop at token i >= 1 leaves it fed.
        if (!more) model.submit_decode(state, pending, 1 - pending, choice);
        model.wait_token(1 - pending);
        return finish("stop", produced);
      }
      if (action != TokenAction::proceed) {
        // The step submitted ahead has fed this token already: it stays fed (the state
        // holds prompt + tokens[0, fed), which is all the session cache relies on).
        if (!more) return finish(ended(action), produced - 1);
        model.wait_token(1 - pending);
        return finish(ended(action), produced);
      }
      if (!more) return finish("length", produced - 1);
      pending = 1 - pending;
    }
  }
};

}  // namespace

GenerationResult generate(Qwen36Model& model, DecodeState& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  if (options.max_tokens < 0) throw std::invalid_argument("generate: negative max_tokens");
  if (options.top_logits > 0 && (options.choice.sampler != nullptr || options.choice.logprobs)) {
    throw std::invalid_argument("generate: top_logits runs step by step with the argmax only");
  }
  GenerationResult result;
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  // Without per-step logits to return, decode is pipelined; top_logits needs every step's
  // logits on the host, so those requests run step by step.
  const bool pipelined = options.top_logits <= 0;
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
    const std::span<const int32_t> tokens = prompt.subspan(begin, count);
    if (begin + count < prompt.size()) {
      model.forward(state, tokens);
    } else if (pipelined) {
      model.submit_prefill(state, tokens, 0, options.choice);
      result.tokens.push_back(model.wait_token(0));
    } else {
      step(tokens);
    }
  }
  const Clock::time_point first = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(first - start).count();
  DecodeLoop loop{model, state, options, result, first};
  return pipelined ? loop.pipelined(model.wait_record(0)) : loop.stepwise(step);
}

}  // namespace lily
