// HTTP/1.1 transport on Boost.Beast: listener, connections, limits, timeouts, disconnect detection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace lily {

// Per-connection limits. A request over a limit is answered (413, 431, 408, 400) and the
// connection closed; nothing over a limit is ever buffered.
struct HttpLimits {
  uint64_t max_body_bytes = 1048576;  // Content-Length or the sum of chunks: 413 above it
  uint32_t max_header_bytes = 16384;  // request line + all header fields: 431 above it
  uint32_t max_header_fields = 100;   // 431 above it
  // Deadline for reading one whole request (headers and body) from its first byte, and for an
  // idle keep-alive connection to start the next one. A slow client gets 408 and is closed.
  std::chrono::milliseconds read_timeout{30000};
  // For each write operation on the socket (a whole response, or one batch of a stream's
  // chunks): a client that takes nothing for this long is closed. A stream as a whole may last
  // much longer.
  std::chrono::milliseconds write_timeout{30000};
  size_t max_connections = 512;  // beyond this, new connections get 503 and are closed
  // A stream's bytes queued behind the socket write in flight (a client that stops reading):
  // past this the stream fails (client_gone set, connection closed at once, logged 499). A
  // write with nothing queued behind the one in flight always goes out, however large.
  size_t max_stream_buffer_bytes = 1048576;
};

// What the handler sees of a request before its body is read.
struct HttpRequestHead {
  std::string method;        // as sent, e.g. "POST"
  std::string target;        // as sent, e.g. "/v1/models?x=1"
  std::string path;          // target with any "?query" removed
  std::string content_type;  // "" when absent
  std::optional<std::string> authorization;
  // X-Prompt-Cache-Key: the session-cache key for clients (and load balancers routing on it,
  // docs/deploy.md) that cannot put prompt_cache_key in the body; the body's field wins.
  std::optional<std::string> prompt_cache_key;
  bool has_body = false;  // Content-Length > 0 or chunked
};

inline constexpr const char* kPromptCacheKeyHeader = "X-Prompt-Cache-Key";

// A response written in pieces (text/event-stream). Thread-safe. Every write goes out as its
// own HTTP chunk as soon as the socket takes it (TCP_NODELAY on every connection).
//
// Lifetime: the transport keeps the connection object alive while the stream is not finished;
// the stream object may outlive the connection (and the socket may be closed under it). Do not
// use it after the HttpServer is destroyed. Dropping it without finish() ends the response
// as broken (connection closed without the last chunk, client_gone set) and logs 500.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Queues bytes for the client, written in order, each write flushed as soon as the socket takes
  // it (no Nagle: TCP_NODELAY). Returns false, dropping them, once the stream has failed: the
  // client is gone (closed, reset, write error, write_timeout) or more than
  // HttpLimits::max_stream_buffer_bytes would be queued behind the socket write in flight (a
  // slow reader; a write with nothing queued before it always goes out).
  // On failure the request's client_gone flag is set (so the engine cancels the request), the
  // connection is closed and the failure reason is kept for the log line. Never blocks. An
  // empty write is a no-op (returns !failed()); a write after finish() returns false.
  virtual bool write(std::string bytes) = 0;
  // Ends the response once the queued bytes are written (a chunked response's last chunk), then
  // the connection goes on (keep-alive) or closes as for normal responses; writes the request's
  // log line with `log_status` and `log_detail` (same format as HttpResponse::log_detail). If
  // the stream failed, the log line says 499 and `log_detail` followed by the failure reason,
  // e.g. ` error="client disconnected"` or ` error="client too slow: 1048576 bytes unsent"`
  // (so do not put an error of your own into `log_detail` for a failed stream). Call exactly
  // once, from any thread; later calls are ignored.
  virtual void finish(int log_status, std::string log_detail) = 0;
  // Whether the stream has failed (see write).
  virtual bool failed() const = 0;
};

// The start of a streamed response.
struct HttpStreamHead {
  int status = 200;
  // Extra fields; one named like a default (Content-Type, Cache-Control) replaces it.
  // Transfer-Encoding, Content-Length and Connection belong to the transport and are ignored,
  // as is any field whose name or value contains CR or LF.
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpRequest {
  HttpRequestHead head;
  std::string body;  // at most HttpLimits::max_body_bytes
  std::chrono::steady_clock::time_point received;  // when the head was complete
  // Set by the transport when the client goes away (closed or reset) while the request waits
  // for its response. The handler hands it to the engine as the cancellation flag.
  // Also set when a stream fails (see ResponseStream::write).
  std::shared_ptr<std::atomic<bool>> client_gone;
  // Sends the status line and headers at once (Content-Type: text/event-stream, Cache-Control:
  // no-cache; HTTP/1.1: Transfer-Encoding: chunked, keep-alive as for normal responses;
  // HTTP/1.0: no length, the connection closes at the end) and returns the stream. Callable
  // from any thread. The handler calls EITHER the Responder OR start_stream, exactly once: a
  // second answer is refused (a second start_stream returns a stream that has failed, without
  // touching client_gone) and logged.
  std::function<std::shared_ptr<ResponseStream>(HttpStreamHead)> start_stream;
  // Runs a task on the connection's strand (an I/O thread), from any thread, in the order
  // posted, never inline. A task posted after the connection closed still runs (the strand
  // outlives the connection; the task must not assume the client is there: a stream then
  // refuses its writes). Tasks still queued when the server's I/O threads stop are destroyed
  // without running. A task that throws is logged and dropped. Do not call it after the
  // HttpServer is destroyed.
  std::function<void(std::function<void()>)> post;
};

struct HttpResponse {
  int status = 200;
  std::string body;  // JSON, sent with Content-Type: application/json
  std::vector<std::pair<std::string, std::string>> headers;  // extra fields, e.g. Allow
  std::string log_detail;  // appended to the request's log line (starts with a space)
  bool close = false;      // close the connection after this response
};

// Sends the response for one request. Call exactly once, from any thread (or call the request's
// start_stream instead); a second answer is ignored and logged.
using Responder = std::function<void(HttpResponse)>;

// The application side: routing and the API. Called on the transport's threads.
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Called once the headers are in, before the body is read. Returns a response to refuse the
  // request right away (unknown path, wrong method, content type, auth, not ready), or nullopt
  // to read the body and call handle().
  virtual std::optional<HttpResponse> screen(const HttpRequestHead& head) = 0;
  // Must make `respond` be called exactly once, now or later, from any thread.
  virtual void handle(HttpRequest request, Responder respond) = 0;
  // The response for a transport-level failure (408, 413, 431, 400 malformed, 503 overload).
  virtual HttpResponse transport_error(int status, std::string message) = 0;
};

// Writes one log line ("METHOD PATH STATUS <ms>ms<detail>") per answered request.
using RequestLogger = std::function<void(const std::string& line)>;
// Told of every answered request as it is logged: its path, status and seconds from its first
// byte to its last response byte (e.g. for metrics). Must be thread-safe and cheap.
using RequestObserver = std::function<void(std::string_view path, int status, double seconds)>;

// The listener and its I/O threads. Connections are keep-alive HTTP/1.1 (and 1.0), with
// TCP_NODELAY; each is served on its own strand. While a request waits for its response, and
// while its response streams, the connection watches the socket: a client that closes or
// resets it has `client_gone` set (and its stream fails).
class HttpServer {
 public:
  HttpServer(HttpHandler& handler, HttpLimits limits, RequestLogger logger);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();  // stop() without grace, then joins the threads

  // Resolves "host:port" ("127.0.0.1:8000", "[::1]:0", "localhost:8000"; port 0 picks a free
  // one), binds the first address and listens. Throws InputError naming the address.
  void bind(const std::string& address);
  boost::asio::ip::tcp::endpoint local_endpoint() const;

  // Starts accepting on `threads` I/O threads (>= 1). Returns at once.
  void start(int threads);

  // The I/O context, e.g. for a signal_set. Valid for the server's lifetime.
  boost::asio::io_context& io() { return io_; }

  // From any thread: stop accepting, answer later requests with Connection: close, wait until
  // every request already handed to the handler has had its response written, streams
  // finished included (at most `grace`), then stop the I/O threads. join() waits for that.
  void stop(std::chrono::milliseconds grace);
  // From any thread: responses from now on carry Connection: close (stop() implies it).
  void mark_stopping();
  void join();

  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // Before start(): also report every answered request to `observer`.
  void set_observer(RequestObserver observer) { observer_ = std::move(observer); }
  // Requests handed to the handler whose response (or stream) is not completely written.
  size_t in_flight() const { return awaiting_response_.load(std::memory_order_acquire); }
  size_t open_connections() const { return connections_.load(std::memory_order_relaxed); }

 private:
  class Connection;
  friend class Connection;

  void accept();
  void wait_for_drain(std::chrono::steady_clock::time_point deadline);

  HttpHandler& handler_;
  HttpLimits limits_;
  RequestLogger logger_;
  RequestObserver observer_;
  // Declared before io_: connections still queued in io_ when it is destroyed update them.
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> connections_{0};
  // Handed to the handler, response (or stream) not yet completely written.
  std::atomic<size_t> awaiting_response_{0};
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
};

}  // namespace lily
