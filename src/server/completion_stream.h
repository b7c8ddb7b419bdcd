// One streamed chat completion: turns the engine's deltas into SSE chunks on the connection's strand.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/api_handler.h"
#include "server/openai_types.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace lily {

// The OpenAI logprobs entries of generated tokens (token text as raw bytes, special tokens
// written as their text).
std::vector<TokenLogprob> api_logprobs(const std::vector<TokenLogprobs>& entries,
                                       const Tokenizer& tokenizer);

// Shared by the engine's callbacks (inference thread) and the connection's strand. The engine
// only hands deltas over (post); every frame is built and written on the strand, in order:
// role chunk, the answer's chunks (reasoning, content and tool calls as the output parser
// releases them), finish chunk, usage chunk (include_usage), [DONE]. Frames produced before
// the stream is started are kept and written at start.
class CompletionStream : public std::enable_shared_from_this<CompletionStream> {
 public:
  // `post` runs a task on the connection's strand; `received` is when the request arrived (for
  // the log line's rate).
  CompletionStream(ChunkContext context, const Tokenizer& tokenizer, bool logprobs,
                   const AnswerShape& shape, std::function<void(std::function<void()>)> post,
                   std::chrono::steady_clock::time_point received);

  // Opens the response (status line, headers) and writes the role chunk. On the strand.
  void start(std::shared_ptr<ResponseStream> stream);
  // Engine callbacks (inference thread): hand the work to the strand.
  void on_delta(SequenceDelta delta);
  // `log_detail` is appended to the request's log line after the token counts.
  void on_complete(EngineResult result, std::string log_detail);
  // Ends the stream with an error frame and [DONE] (e.g. the engine refused the request after
  // the stream had started).
  void fail(const ApiError& error, std::string log_detail);

 private:
  void write(std::string frame);
  void write_delta(const SequenceDelta& delta);
  // One chunk per parsed piece; the pending logprobs ride on the first.
  void write_pieces(const std::vector<OutputDelta>& pieces);
  void complete(const EngineResult& result, const std::string& log_detail);

  ChunkContext context_;
  const Tokenizer& tokenizer_;
  bool logprobs_;
  bool thinking_;
  bool parallel_tool_calls_;
  OutputParser parser_;                 // on the strand only
  std::vector<TokenLogprob> logprobs_pending_;  // entries of text the parser still holds
  bool has_tool_calls_ = false;
  std::function<void(std::function<void()>)> post_;
  std::chrono::steady_clock::time_point received_;
  std::mutex mutex_;
  std::shared_ptr<ResponseStream> stream_;  // null until start()
  std::vector<std::string> early_;          // frames written before start()
};

}  // namespace lily
