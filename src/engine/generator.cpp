// Generation over a model and a session state (argmax or sampled), with Lily's fed-token accounting.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
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

  std::vector<int32_t> take_forced() const {
    return options.take_forced ? options.take_forced() : std::vector<int32_t>();
  }
  bool full() const { return static_cast<int64_t>(result.tokens.size()) >= options.max_tokens; }

  // Forced tokens (GenerationOptions::take_forced), batch after batch: each is pushed and acted
  // on like a model token, then `unfed` (the state holds every token in result.tokens but
  // these) and the accepted forced tokens are fed in one prefill whose token, read from slot 0,
  // continues the decode. An ending among them (a stop token or string, a cancel, max_tokens)
  // feeds what was accepted and ends: forced endings leave every token fed. Returns the result
  // when generation ended, else nullopt (the next token is in result.tokens, its record in
  // `record`).
  std::optional<GenerationResult> inject(std::vector<int32_t> forced, std::vector<int32_t> unfed,
                                         const int32_t*& record) {
    std::vector<int32_t>& feed = unfed;
    auto end = [&](const char* reason) {
      if (!feed.empty()) model.forward(state, feed);
      return finish(reason, static_cast<int64_t>(result.tokens.size()));
    };
    while (!forced.empty()) {
      for (const int32_t token : forced) {
        result.tokens.push_back(token);
        feed.push_back(token);
        const bool stop = is_stop(token);
        const TokenAction action = act(token, nullptr);
        if (stop) return end("stop");
        if (action != TokenAction::proceed) return end(ended(action));
        if (full()) return end("length");
      }
      forced = take_forced();
    }
    model.submit_prefill(state, feed, 0, options.choice);
    result.tokens.push_back(model.wait_token(0));
    record = model.wait_record(0);
    return std::nullopt;
  }

  // Depth-2 pipelining, as Lily's (docs/session-cache.md): the step that feeds token i is
  // submitted before token i is read (the device feeds it from its own memory), so the host
  // reads each token while the next step runs. Token 0 came from submit_prefill into slot 0;
  // so does the first token after forced tokens, and both are acted on before the next step is
  // submitted (a stop there leaves it unfed, as Lily's stop on token 0).
  GenerationResult pipelined(const int32_t* record) {
    const TokenChoice& choice = options.choice;
    if (std::vector<int32_t> forced = take_forced(); !forced.empty()) {
      result.tokens.pop_back();  // the model's own first token is replaced, never shown
      if (auto ended_early = inject(std::move(forced), {}, record)) return std::move(*ended_early);
    }
    for (;;) {  // from a prefill's token (in slot 0, not acted on yet) to the end or an injection
      const int32_t first_token = result.tokens.back();
      const auto before = static_cast<int64_t>(result.tokens.size()) - 1;  // fed so far
      const bool stop0 = is_stop(first_token);
      const TokenAction action0 = act(first_token, record);
      if (stop0) return finish("stop", before);
      if (action0 != TokenAction::proceed) return finish(ended(action0), before);
      if (full()) return finish("length", before);
      if (std::vector<int32_t> forced = take_forced(); !forced.empty()) {
        if (auto ended_late = inject(std::move(forced), {first_token}, record)) {
          return std::move(*ended_late);
        }
        continue;
      }
      model.submit_decode(state, 0, 1, choice);  // feeds the first token
      int pending = 1;  // the slot of the step whose token is read next
      bool injected = false;
      while (!injected) {
        const auto produced = static_cast<int64_t>(result.tokens.size()) + 1;
        const bool more = produced < options.max_tokens;
        // Feeds the token about to be read before the host has seen it (unless it will be the
        // last).
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
        if (std::vector<int32_t> forced = take_forced(); !forced.empty()) {
          model.wait_token(1 - pending);  // the step ahead fed this token; its own is dropped
          if (auto ended_late = inject(std::move(forced), {}, record)) {
            return std::move(*ended_late);
          }
          injected = true;
          continue;
        }
        pending = 1 - pending;
      }
    }
  }
};

}  // namespace

GenerationResult generate(Qwen36Model& model, DecodeState& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  if (options.max_tokens < 0) throw std::invalid_argument("generate: negative max_tokens");
  if (!std::is_sorted(options.snapshot_at.begin(), options.snapshot_at.end())) {
    throw std::invalid_argument("generate: snapshot_at must be ascending");
  }
  if (options.top_logits > 0 && (options.choice.sampler != nullptr || options.choice.logprobs)) {
    throw std::invalid_argument("generate: top_logits runs step by step with the argmax only");
  }
  if (options.top_logits > 0 && options.take_forced) {
    throw std::invalid_argument("generate: forced tokens need the pipelined decode (no top_logits)");
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
  // A snapshot point inside the prompt ends the chunk there and chunks go on from it (so the
  // state then equals one forward()'s within float rounding: chunk sizes change the sums).
  const int64_t base = state.position;
  const std::vector<int64_t>& points = options.snapshot_at;
  auto point = options.on_snapshot ? points.begin() : points.end();
  size_t count = 0;
  for (size_t begin = 0; begin < prompt.size(); begin += count) {
    if (options.cancel_prefill && options.cancel_prefill()) {
      result.finish_reason = "cancelled";
      result.prompt_unfed = static_cast<int64_t>(prompt.size() - begin);
      result.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      return result;
    }
    count = std::min(piece, prompt.size() - begin);
    const int64_t at = base + static_cast<int64_t>(begin);
    while (point != points.end() && *point <= at) ++point;
    const bool snapshot = point != points.end() &&
                          *point < base + static_cast<int64_t>(prompt.size()) &&
                          *point <= at + static_cast<int64_t>(count);
    if (snapshot) count = static_cast<size_t>(*point - at);
    const std::span<const int32_t> tokens = prompt.subspan(begin, count);
    if (begin + count < prompt.size()) {
      model.forward(state, tokens);
      if (snapshot) options.on_snapshot(state);
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
