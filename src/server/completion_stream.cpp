// One streamed chat completion: turns the engine's deltas into SSE chunks on the connection's strand.
#include "server/completion_stream.h"

#include <utility>

#include "server/request_log.h"

namespace lily {

std::vector<TokenLogprob> api_logprobs(const std::vector<TokenLogprobs>& entries,
                                       const Tokenizer& tokenizer) {
  auto text = [&tokenizer](int32_t id) {
    return id < 0 ? std::string() : std::string(tokenizer.token_bytes(static_cast<uint32_t>(id), false));
  };
  std::vector<TokenLogprob> out;
  out.reserve(entries.size());
  for (const TokenLogprobs& e : entries) {
    TokenLogprob entry;
    entry.token = text(e.token);
    entry.logprob = e.logprob;
    for (const auto& [id, logprob] : e.top) entry.top.emplace_back(text(id), logprob);
    out.push_back(std::move(entry));
  }
  return out;
}

CompletionStream::CompletionStream(ChunkContext context, const Tokenizer& tokenizer,
                                   bool logprobs, const AnswerShape& shape,
                                   std::function<void(std::function<void()>)> post,
                                   std::chrono::steady_clock::time_point received)
    : context_(std::move(context)), tokenizer_(tokenizer), logprobs_(logprobs),
      thinking_(shape.thinking), parallel_tool_calls_(shape.parallel_tool_calls),
      parser_(shape.parser, random_call_id), post_(std::move(post)), received_(received) {}

void CompletionStream::start(std::shared_ptr<ResponseStream> stream) {
  std::vector<std::string> early;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_ = std::move(stream);
    early.swap(early_);
  }
  // The role chunk goes out at once: clients see the answer begin instead of waiting for the
  // prefill (keep-alive comments break some clients, docs/clients.md).
  stream_->write(sse_frame(chunk_role_json(context_)));
  for (std::string& frame : early) stream_->write(std::move(frame));
}

void CompletionStream::write(std::string frame) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stream_) {
    early_.push_back(std::move(frame));
    return;
  }
  // A failed write means the client is gone or too slow: the transport has set the request's
  // cancellation flag, so the engine stops within one step; nothing else to do here.
  stream_->write(std::move(frame));
}

void CompletionStream::on_delta(SequenceDelta delta) {
  post_([self = shared_from_this(), delta = std::move(delta)] { self->write_delta(delta); });
}

void CompletionStream::write_delta(const SequenceDelta& delta) {
  if (logprobs_) {
    const std::vector<TokenLogprob> entries = api_logprobs(delta.logprobs, tokenizer_);
    logprobs_pending_.insert(logprobs_pending_.end(), entries.begin(), entries.end());
  }
  write_pieces(parser_.feed(delta.text));
}

void CompletionStream::write_pieces(const std::vector<OutputDelta>& pieces) {
  for (const OutputDelta& piece : pieces) {
    if (piece.kind == OutputDelta::Kind::tool_call && !parallel_tool_calls_ &&
        piece.call_index > 0) {
      continue;  // parallel_tool_calls false: the first call only
    }
    const std::vector<TokenLogprob>* entries = logprobs_ ? &logprobs_pending_ : nullptr;
    switch (piece.kind) {
      case OutputDelta::Kind::content:
        write(sse_frame(chunk_content_json(context_, piece.text, entries)));
        break;
      case OutputDelta::Kind::reasoning:
        write(sse_frame(chunk_reasoning_json(context_, piece.text, entries)));
        break;
      case OutputDelta::Kind::tool_call:
        has_tool_calls_ = true;
        write(sse_frame(chunk_tool_call_json(context_, piece.call_index, piece.call_id,
                                             piece.call_name, piece.text, entries)));
        break;
    }
    logprobs_pending_.clear();
  }
}

void CompletionStream::on_complete(EngineResult result, std::string log_detail) {
  post_([self = shared_from_this(), result = std::move(result),
         detail = std::move(log_detail)] { self->complete(result, detail); });
}

void CompletionStream::complete(const EngineResult& result, const std::string& log_detail) {
  if (!result.ok()) {
    if (result.error == kShuttingDownError) return fail(shutting_down_error(), log_detail);
    write_log_line("request failed: " + result.error);
    return fail(internal_error(), log_detail);
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - received_).count();
  const std::string counts =
      completion_log_detail(static_cast<uint64_t>(result.prompt_tokens),
                            static_cast<uint64_t>(result.cached_tokens),
                            static_cast<uint64_t>(result.completion_tokens), wall) +
      log_detail;
  std::shared_ptr<ResponseStream> stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stream = stream_;
  }
  if (result.finish_reason != "cancelled") {
    write_pieces(parser_.finish(result.finish_reason == "length"));
    if (!logprobs_pending_.empty()) {  // entries of text the parser dropped (whitespace)
      write(sse_frame(chunk_content_json(context_, "", &logprobs_pending_)));
      logprobs_pending_.clear();
    }
    const FinishReason reason = answer_finish_reason(result.finish_reason, has_tool_calls_);
    write(sse_frame(chunk_finish_json(context_, reason)));
    if (context_.include_usage) {
      std::optional<uint64_t> reasoning;
      if (thinking_) reasoning = static_cast<uint64_t>(result.reasoning_tokens);
      write(sse_frame(chunk_usage_json(context_, static_cast<uint64_t>(result.prompt_tokens),
                                       static_cast<uint64_t>(result.completion_tokens),
                                       static_cast<uint64_t>(result.cached_tokens), reasoning)));
    }
    write(sse_done());
  }
  // A cancelled request's client is gone (or too slow): the transport logs 499 with the reason.
  if (stream) stream->finish(200, counts);
}

void CompletionStream::fail(const ApiError& error, std::string log_detail) {
  write(sse_error_frame(error));
  write(sse_done());
  std::shared_ptr<ResponseStream> stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stream = stream_;
  }
  if (stream) stream->finish(error.status, log_detail + error_log_detail(error.message));
}

}  // namespace lily
