// HTTP/1.1 transport on Boost.Beast: accept loop, a strand per connection, limits, deadlines, SSE.
#include "server/http_server.h"

#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/error.h"
#include "server/request_log.h"

namespace lily {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

// How long a refused request's unread body is drained before closing, so that the client
// sees our response instead of a reset (closing a socket with unread input sends RST).
constexpr auto kDrainTimeout = std::chrono::milliseconds(2000);
constexpr size_t kDrainMaxBytes = 8u << 20;

// The log status of a request whose client left or could not keep up (nginx's "client closed
// request"); nobody receives it.
constexpr int kClientGoneStatus = 499;

bool has_line_break(std::string_view text) {
  return text.find_first_of("\r\n") != std::string_view::npos;
}

// The state a stream shares between its handle (any thread) and its connection (the strand).
// Everything behind `mutex`.
struct StreamChannel {
  StreamChannel(size_t limit_bytes, std::shared_ptr<std::atomic<bool>> gone)
      : limit(limit_bytes), client_gone(std::move(gone)) {}

  // Marks the stream failed (the first reason wins) and the client gone. Caller holds `mutex`.
  void fail_locked(std::string why, int status = kClientGoneStatus) {
    if (failed) return;
    failed = true;
    reason = std::move(why);
    fail_status = status;
    pending.clear();
    if (client_gone) client_gone->store(true, std::memory_order_release);
  }
  void fail(std::string why) {
    std::lock_guard lock(mutex);
    fail_locked(std::move(why));
  }

  const size_t limit;  // HttpLimits::max_stream_buffer_bytes

  // Null for a refused second answer (it must not cancel the request).
  const std::shared_ptr<std::atomic<bool>> client_gone;
  mutable std::mutex mutex;
  std::deque<std::string> pending;  // writes not yet handed to the socket, in order
  size_t unsent = 0;                // payload bytes pending or in the socket write in flight
  size_t queued = 0;                // payload bytes pending (not yet in a socket write)
  bool advance_posted = false;      // an advance task is queued on the strand
  bool failed = false;
  std::string reason;  // why it failed, for the log line
  int fail_status = kClientGoneStatus;
  bool finish_called = false;
  int log_status = 200;
  std::string log_detail;
};

}  // namespace

// One client connection. Every handler runs on the connection's strand (the socket's
// executor), so its members need no lock; the engine reaches it only through net::post.
class HttpServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), deadline_(socket_.get_executor()) {
    server_.connections_.fetch_add(1, std::memory_order_relaxed);
  }
  ~Connection() { server_.connections_.fetch_sub(1, std::memory_order_relaxed); }

  void start() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_head(); });
  }

 private:
  class Stream;

  // --- deadlines: one timer; a generation number ignores expiries of superseded deadlines.
  void arm(std::chrono::milliseconds timeout) {
    const uint64_t generation = ++deadline_generation_;
    timed_out_ = false;
    deadline_.expires_after(timeout);
    deadline_.async_wait([self = shared_from_this(), generation](error_code ec) {
      if (ec || generation != self->deadline_generation_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void disarm() {
    ++deadline_generation_;
    deadline_.cancel();
  }

  // --- reading a request
  void read_head() {
    parser_.emplace();
    parser_->header_limit(server_.limits_.max_header_bytes);
    parser_->body_limit(server_.limits_.max_body_bytes);
    method_.clear();
    path_.clear();
    arm(server_.limits_.read_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) {
                              self->on_head(ec);
                            });
  }

  void on_head(error_code ec) {
    if (ec) return on_read_error(ec);
    received_ = Clock::now();
    const auto& request = parser_->get();
    head_ = HttpRequestHead{};
    head_.method = std::string(request.method_string());
    head_.target = std::string(request.target());
    head_.path = head_.target.substr(0, head_.target.find('?'));
    method_ = head_.method;
    path_ = head_.path;
    keep_alive_ = request.keep_alive();
    if (auto it = request.find(http::field::content_type); it != request.end()) {
      head_.content_type = std::string(it->value());
    }
    if (auto it = request.find(kPromptCacheKeyHeader); it != request.end()) {
      head_.prompt_cache_key = std::string(it->value());
    }
    if (auto it = request.find(http::field::authorization); it != request.end()) {
      head_.authorization = std::string(it->value());
    }
    head_.has_body = request.chunked() || request.has_content_length();
    if (request.has_content_length() && parser_->content_length().value_or(0) == 0) {
      head_.has_body = false;
    }
    const size_t fields = static_cast<size_t>(std::distance(request.begin(), request.end()));
    if (fields > server_.limits_.max_header_fields) {
      return refuse(431, "request has " + std::to_string(fields) + " header fields, at most " +
                             std::to_string(server_.limits_.max_header_fields) + " allowed");
    }
    if (request.version() != 10 && request.version() != 11) {
      return refuse(400, "malformed HTTP request: only HTTP/1.0 and HTTP/1.1 are supported");
    }
    if (std::optional<HttpResponse> refused = server_.handler_.screen(head_)) {
      if (!parser_->is_done()) refused->close = true;  // the body stays unread
      return send(std::move(*refused));
    }
    if (parser_->is_done()) return on_body({});
    auto expect = request.find(http::field::expect);
    if (expect != request.end() && boost::beast::iequals(expect->value(), "100-continue")) {
      // curl sends bodies over 1 KiB only after this interim response (or a 1 s wait).
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(kContinue.data(), kContinue.size()),
                       [self = shared_from_this()](error_code write_ec, size_t) {
                         if (write_ec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    if (ec) return on_read_error(ec);
    disarm();
    HttpRequest request;
    request.head = head_;
    request.body = std::move(parser_->get().body());
    request.received = received_;
    request.client_gone = std::make_shared<std::atomic<bool>>(false);
    client_gone_ = request.client_gone;
    awaiting_response_ = true;
    server_.awaiting_response_.fetch_add(1, std::memory_order_acq_rel);
    auto self = shared_from_this();
    // The Responder and start_stream share one flag: the first answer wins, a second one is
    // refused (it would write a second response, or decrement awaiting_response_ twice).
    auto answered = std::make_shared<std::atomic<bool>>(false);
    Responder respond = [self, answered](HttpResponse response) {
      if (answered->exchange(true, std::memory_order_acq_rel)) {
        write_log_line("request failed: the handler answered a request twice; ignored");
        return;
      }
      net::post(self->socket_.get_executor(), [self, response = std::move(response)]() mutable {
        self->send(std::move(response));
      });
    };
    request.start_stream = [self, answered,
                            gone = request.client_gone](HttpStreamHead stream_head) {
      return self->start_stream(answered, gone, std::move(stream_head));
    };
    request.post = [executor = socket_.get_executor()](std::function<void()> task) {
      net::post(executor, [task = std::move(task)] {
        try {
          task();
        } catch (const std::exception& e) {
          write_log_line(std::string("request failed: a posted task threw: ") + e.what());
        }
      });
    };
    try {
      server_.handler_.handle(std::move(request), std::move(respond));
    } catch (const std::exception& e) {
      // The handler promises not to throw; if it does, the client still gets an answer (unless
      // the handler answered before it threw).
      std::fprintf(stderr, "request failed: handler threw: %s\n", e.what());
      if (!answered->exchange(true, std::memory_order_acq_rel)) {
        send(server_.handler_.transport_error(500, "internal server error"));
      }
      return;
    }
    if (awaiting_response_) watch_for_disconnect();
  }

  void on_read_error(error_code ec) {
    if (method_.empty() && parser_) {
      // A limit can trip while the head is still being parsed: name the request in the log
      // if its request line was read.
      const auto& partial = parser_->get();
      if (!partial.method_string().empty()) {
        method_ = std::string(partial.method_string());
        const std::string target(partial.target());
        path_ = target.substr(0, target.find('?'));
      }
    }
    const bool started = buffer_.size() > 0 || parser_->is_header_done() || !method_.empty();
    if (timed_out_) {
      if (!started) return close();  // an idle keep-alive connection: close quietly
      return refuse(408, "request not received within " +
                             std::to_string(server_.limits_.read_timeout.count()) + " ms");
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "request body exceeds " +
                             std::to_string(server_.limits_.max_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit) {
      return refuse(431, "request header fields exceed " +
                             std::to_string(server_.limits_.max_header_bytes) + " bytes");
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return refuse(400, "malformed HTTP request: " + ec.message());
    }
    close();  // end of stream, reset, or a client that left mid-request: nobody to answer
  }

  // A transport-level refusal: answer, then close (the rest of the request stays unread).
  void refuse(int status, std::string message) {
    HttpResponse response = server_.handler_.transport_error(status, std::move(message));
    response.close = true;
    if (method_.empty()) method_ = "-";
    if (path_.empty()) path_ = "-";
    send(std::move(response));
  }

  // --- while the handler works: notice a client that goes away.
  void watch_for_disconnect() {
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      self->on_readable(ec);
    });
  }

  void on_readable(error_code ec) {
    if (!awaiting_response_ || ec == net::error::operation_aborted) return;
    if (!ec) {
      // Never block here: readiness can be stale (the body read already took the bytes), and
      // a blocking peek would then hold this strand, and an I/O thread, until the client
      // sends again or closes, with the response waiting behind it.
      char byte = 0;
      const ssize_t n = ::recv(socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return watch_for_disconnect();  // nothing there after all: keep watching
      }
      // Bytes of a pipelined request: the client is still there (and cannot be watched
      // further without reading them).
      if (n > 0) return;
      // n == 0: orderly close; n < 0: reset or another error. Either way, gone.
    }
    // The last chunk already handed to the socket: a client that read it and closed is done,
    // not gone; the write's own completion decides (an error there still logs 499).
    if (stream_ && stream_last_queued_) return;
    if (client_gone_) client_gone_->store(true, std::memory_order_release);
    if (stream_) {
      // Mid-stream: later writes are refused; the connection closes (see advance_stream).
      stream_->fail("client disconnected");
      advance_stream(stream_);
    }
  }

  // --- a streamed response (ResponseStream). The handle (any thread) queues into the channel
  // and posts advance_stream; on the strand, advance_stream moves what is queued into one
  // socket write (each write its own chunk), and completes the stream once it is finished and
  // written, or failed.
  std::shared_ptr<ResponseStream> start_stream(const std::shared_ptr<std::atomic<bool>>& answered,
                                               const std::shared_ptr<std::atomic<bool>>& gone,
                                               HttpStreamHead stream_head);
  void begin_stream(std::shared_ptr<StreamChannel> channel, HttpStreamHead stream_head);
  void advance_stream(std::shared_ptr<StreamChannel> channel);
  void write_stream_bytes();
  void on_stream_written(error_code ec, size_t n);
  void complete_stream();

  // --- writing the response
  void send(HttpResponse response) {
    const bool was_awaiting = awaiting_response_;
    awaiting_response_ = false;
    disarm();
    error_code ignored;
    socket_.cancel(ignored);  // ends the disconnect watch, if any
    const unsigned version = parser_ && parser_->is_header_done() ? parser_->get().version() : 11;
    response_.emplace(static_cast<http::status>(response.status), version);
    response_->set(http::field::server, "lily");
    response_->set(http::field::content_type, "application/json");
    for (const auto& [name, value] : response.headers) response_->set(name, value);
    response_->body() = std::move(response.body);
    keep_alive_ = keep_alive_ && !response.close && !server_.stopping();
    response_->keep_alive(keep_alive_);
    response_->prepare_payload();
    if (method_ == "HEAD") response_->body().clear();  // RFC 9110 §9.3.2: headers only
    unread_body_ = response.close && parser_ && !parser_->is_done();

    log_request(response.status, response.log_detail);
    arm(server_.limits_.write_timeout);
    http::async_write(socket_, *response_,
                      [self = shared_from_this(), was_awaiting](error_code ec, size_t) {
                        self->on_written(ec, was_awaiting);
                      });
  }

  void log_request(int status, const std::string& detail) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        Clock::now() - (method_ == "-" ? Clock::now() : received_))
                        .count();
    if (server_.logger_) {
      server_.logger_(method_ + " " + path_ + " " + std::to_string(status) + " " +
                      std::to_string(ms) + "ms" + detail);
    }
    if (server_.observer_ && method_ != "-") {
      server_.observer_(path_, status,
                        std::chrono::duration<double>(Clock::now() - received_).count());
    }
  }

  void on_written(error_code ec, bool was_awaiting) {
    disarm();
    if (was_awaiting) server_.awaiting_response_.fetch_sub(1, std::memory_order_acq_rel);
    response_.reset();
    if (ec) return close();
    if (keep_alive_) return read_head();
    if (unread_body_) return drain();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    close();
  }

  // Reads and discards what the client still sends (bounded in time and bytes), then closes.
  void drain() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    drained_ = 0;
    arm(kDrainTimeout);
    drain_some();
  }
  void drain_some() {
    socket_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ >= kDrainMaxBytes) return self->close();
                              self->drain_some();
                            });
  }

  void close() {
    disarm();
    error_code ignored;
    socket_.close(ignored);
  }

  HttpServer& server_;
  tcp::socket socket_;
  net::steady_timer deadline_;
  uint64_t deadline_generation_ = 0;
  bool timed_out_ = false;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  HttpRequestHead head_;
  std::string method_;  // for the log line ("-" before a request line was parsed)
  std::string path_;
  Clock::time_point received_;
  std::shared_ptr<std::atomic<bool>> client_gone_;
  // The stream being written, from begin_stream until complete_stream. While it is set, the
  // request counts as awaiting its response.
  std::shared_ptr<StreamChannel> stream_;
  std::string stream_out_;           // the socket write in flight: head and/or framed chunks
  size_t stream_out_done_ = 0;       // bytes of stream_out_ the socket took
  size_t stream_out_payload_ = 0;    // payload bytes in stream_out_ (counted in `unsent`)
  bool stream_writing_ = false;      // a write of stream_out_ is in flight
  bool stream_head_sent_ = false;    // the head is in stream_out_ or written
  bool stream_last_queued_ = false;  // the end (last chunk) is in stream_out_ or written
  bool stream_chunked_ = false;      // HTTP/1.1: chunked; HTTP/1.0: close-delimited
  std::string stream_head_;          // the head, until it goes into stream_out_
  bool awaiting_response_ = false;
  bool keep_alive_ = false;
  bool unread_body_ = false;
  size_t drained_ = 0;
  std::array<char, 16384> drain_buffer_{};
};

// The handle the handler writes to. Holds the connection (never destroyed under it) until
// finish(); the connection holds only the channel.
class HttpServer::Connection::Stream final : public ResponseStream {
 public:
  Stream(std::shared_ptr<StreamChannel> channel, std::shared_ptr<Connection> connection)
      : channel_(std::move(channel)), connection_(std::move(connection)) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  ~Stream() override {
    std::lock_guard lock(channel_->mutex);
    if (channel_->finish_called || !connection_) return;
    // Dropped without finish(): a broken response (closed without its last chunk), logged 500.
    channel_->fail_locked("the handler dropped the stream without finishing it", 500);
    channel_->finish_called = true;
    post_advance_locked();
  }

  bool write(std::string bytes) override {
    std::lock_guard lock(channel_->mutex);
    StreamChannel& channel = *channel_;
    if (channel.failed || channel.finish_called) return false;
    if (bytes.empty()) return true;  // an empty chunk would end a chunked body
    // The bound is on the backlog behind the socket write in flight: a write with nothing
    // queued behind it always goes out (a single frame larger than the bound, e.g. one with 20
    // top_logprobs, is not a slow client); memory stays below twice the bound plus a frame.
    if (channel.queued > 0 && bytes.size() > channel.limit - std::min(channel.limit, channel.queued)) {
      channel.fail_locked("client too slow: " + std::to_string(channel.unsent + bytes.size()) +
                          " bytes unsent");
      post_advance_locked();  // closes the connection
      return false;
    }
    channel.unsent += bytes.size();
    channel.queued += bytes.size();
    channel.pending.push_back(std::move(bytes));
    post_advance_locked();
    return true;
  }

  void finish(int log_status, std::string log_detail) override {
    std::lock_guard lock(channel_->mutex);
    if (channel_->finish_called) {
      write_log_line("request failed: ResponseStream::finish called twice; ignored");
      return;
    }
    channel_->finish_called = true;
    channel_->log_status = log_status;
    channel_->log_detail = std::move(log_detail);
    post_advance_locked();
    connection_.reset();  // the posted task holds it now; the connection may go when done
  }

  bool failed() const override {
    std::lock_guard lock(channel_->mutex);
    return channel_->failed;
  }

 private:
  // Asks the strand to write what is queued (or to close, or complete). Caller holds the
  // channel's mutex; one task queued at a time is enough, it takes everything there is then.
  void post_advance_locked() {
    if (!connection_ || channel_->advance_posted) return;
    channel_->advance_posted = true;
    net::post(connection_->socket_.get_executor(), [connection = connection_, channel = channel_] {
      connection->advance_stream(channel);
    });
  }

  const std::shared_ptr<StreamChannel> channel_;
  std::shared_ptr<Connection> connection_;  // null after finish(), or for a refused stream
};

std::shared_ptr<ResponseStream> HttpServer::Connection::start_stream(
    const std::shared_ptr<std::atomic<bool>>& answered,
    const std::shared_ptr<std::atomic<bool>>& gone, HttpStreamHead stream_head) {
  if (answered->exchange(true, std::memory_order_acq_rel)) {
    write_log_line("request failed: the handler answered a request twice; stream refused");
    auto refused = std::make_shared<StreamChannel>(0, nullptr);  // does not cancel the request
    refused->fail("the request was already answered");
    return std::make_shared<Stream>(std::move(refused), nullptr);
  }
  auto channel = std::make_shared<StreamChannel>(server_.limits_.max_stream_buffer_bytes, gone);
  auto self = shared_from_this();
  // Posted before any write can post its advance: the strand runs them in order.
  net::post(socket_.get_executor(),
            [self, channel, stream_head = std::move(stream_head)]() mutable {
              self->begin_stream(std::move(channel), std::move(stream_head));
            });
  return std::make_shared<Stream>(std::move(channel), std::move(self));
}

void HttpServer::Connection::begin_stream(std::shared_ptr<StreamChannel> channel,
                                          HttpStreamHead stream_head) {
  const unsigned version = parser_ && parser_->is_header_done() ? parser_->get().version() : 11;
  stream_ = std::move(channel);
  stream_chunked_ = version == 11;
  keep_alive_ = keep_alive_ && stream_chunked_ && !server_.stopping();  // 1.0: ends by closing
  stream_head_sent_ = false;
  stream_last_queued_ = false;
  stream_writing_ = false;

  int status = stream_head.status;
  if (status < 200 || status > 599) {
    write_log_line("request failed: stream status " + std::to_string(status) + " sent as 500");
    status = 500;
  }
  http::fields fields;
  fields.set(http::field::server, "lily");
  fields.set(http::field::content_type, "text/event-stream");
  fields.set(http::field::cache_control, "no-cache");
  for (const auto& [name, value] : stream_head.headers) {
    if (name.empty() || has_line_break(name) || has_line_break(value) ||
        boost::beast::iequals(name, "Transfer-Encoding") ||
        boost::beast::iequals(name, "Content-Length") ||
        boost::beast::iequals(name, "Connection")) {
      continue;
    }
    fields.set(name, value);
  }
  std::string head = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  head += std::to_string(status);
  head += ' ';
  head += std::string(http::obsolete_reason(static_cast<http::status>(status)));
  head += "\r\n";
  for (const auto& field : fields) {
    head += std::string(field.name_string());
    head += ": ";
    head += std::string(field.value());
    head += "\r\n";
  }
  if (stream_chunked_) head += "Transfer-Encoding: chunked\r\n";
  if (stream_chunked_ && !keep_alive_) head += "Connection: close\r\n";
  head += "\r\n";
  stream_head_ = std::move(head);

  if (client_gone_ && client_gone_->load(std::memory_order_acquire)) {
    stream_->fail("client disconnected");  // went away while the request waited
  }
  advance_stream(stream_);
}

void HttpServer::Connection::advance_stream(std::shared_ptr<StreamChannel> channel) {
  if (!channel || channel != stream_) return;  // stale
  if (stream_writing_) {
    // A write in flight: its completion advances. But a failed stream (a slow reader past the
    // bound, a disconnect) closes now, not when that write times out: closing aborts the
    // write, whose completion then completes the stream.
    bool failed = false;
    {
      std::lock_guard lock(channel->mutex);
      channel->advance_posted = false;
      failed = channel->failed;
    }
    if (failed) close();
    return;
  }
  bool failed = false;
  bool finished = false;
  std::deque<std::string> chunks;
  {
    std::lock_guard lock(channel->mutex);
    channel->advance_posted = false;
    failed = channel->failed;
    finished = channel->finish_called;
    if (!failed) {
      chunks.swap(channel->pending);
      channel->queued = 0;
    }
  }
  if (failed) {
    close();  // cancels the disconnect watch too; what was queued is dropped
    if (finished) complete_stream();
    return;
  }
  stream_out_.clear();
  stream_out_done_ = 0;
  stream_out_payload_ = 0;
  if (!stream_head_sent_) {
    stream_out_ = std::move(stream_head_);
    stream_head_.clear();
    stream_head_sent_ = true;
  }
  for (const std::string& chunk : chunks) {
    if (stream_chunked_) {
      char size_line[24];
      std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk.size());
      stream_out_ += size_line;
      stream_out_ += chunk;
      stream_out_ += "\r\n";
    } else {
      stream_out_ += chunk;
    }
    stream_out_payload_ += chunk.size();
  }
  if (finished && !stream_last_queued_) {
    stream_last_queued_ = true;
    if (stream_chunked_) stream_out_ += "0\r\n\r\n";
  }
  if (stream_out_.empty()) {
    if (stream_last_queued_) complete_stream();  // HTTP/1.0: nothing marks the end
    return;
  }
  stream_writing_ = true;
  write_stream_bytes();
}

void HttpServer::Connection::write_stream_bytes() {
  // The write timeout counts per write operation, so a long generation never trips it; a
  // client that takes nothing for that long does.
  arm(server_.limits_.write_timeout);
  socket_.async_write_some(
      net::buffer(stream_out_.data() + stream_out_done_, stream_out_.size() - stream_out_done_),
      [self = shared_from_this()](error_code ec, size_t n) { self->on_stream_written(ec, n); });
}

void HttpServer::Connection::on_stream_written(error_code ec, size_t n) {
  disarm();
  stream_out_done_ += n;
  if (!ec && stream_out_done_ < stream_out_.size()) return write_stream_bytes();
  stream_writing_ = false;
  const std::shared_ptr<StreamChannel> channel = stream_;  // set: only complete_stream clears it
  if (ec) {
    if (timed_out_) {
      channel->fail("client too slow: nothing written for " +
                    std::to_string(server_.limits_.write_timeout.count()) + " ms");
    } else {
      channel->fail("client disconnected");  // reset, broken pipe; or our close after a failure
    }
  } else {
    {
      std::lock_guard lock(channel->mutex);
      channel->unsent -= stream_out_payload_;
    }
    stream_out_payload_ = 0;
    if (stream_last_queued_) return complete_stream();
  }
  advance_stream(channel);
}

void HttpServer::Connection::complete_stream() {
  const std::shared_ptr<StreamChannel> channel = std::move(stream_);
  stream_.reset();
  bool failed = false;
  int status = 0;
  std::string detail;
  {
    std::lock_guard lock(channel->mutex);
    failed = channel->failed;
    status = failed ? channel->fail_status : channel->log_status;
    detail = channel->log_detail;
    if (failed) detail += error_log_detail(channel->reason);
  }
  log_request(status, detail);
  std::string().swap(stream_out_);  // up to max_stream_buffer_bytes: not kept for later
  stream_head_.clear();
  awaiting_response_ = false;
  server_.awaiting_response_.fetch_sub(1, std::memory_order_acq_rel);
  if (failed) return close();
  if (keep_alive_ && !server_.stopping()) {
    error_code ignored;
    socket_.cancel(ignored);  // ends the disconnect watch
    return read_head();
  }
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  close();
}

HttpServer::HttpServer(HttpHandler& handler, HttpLimits limits, RequestLogger logger)
    : handler_(handler),
      limits_(limits),
      logger_(std::move(logger)),
      acceptor_(net::make_strand(io_)) {}

HttpServer::~HttpServer() {
  if (!io_.stopped()) io_.stop();
  join();
}

void HttpServer::bind(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    throw InputError("--bind is \"" + address + "\", expected HOST:PORT (e.g. 127.0.0.1:8000)");
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoul(port) > 65535) {
    throw InputError("--bind is \"" + address + "\": port \"" + port +
                     "\" is not a number in 0..65535");
  }
  error_code ec;
  tcp::resolver resolver(io_);
  const auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty()) {
    throw InputError("--bind is \"" + address + "\": cannot resolve \"" + host +
                     "\": " + ec.message());
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();  // Lily: the first address
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    throw InputError("cannot listen on " + address + ": " + ec.message());
  }
}

tcp::endpoint HttpServer::local_endpoint() const {
  error_code ec;
  return acceptor_.local_endpoint(ec);
}

void HttpServer::start(int threads) {
  accept();
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
}

void HttpServer::accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors or similar: back off briefly instead of spinning.
      std::fprintf(stderr, "accept failed: %s\n", ec.message().c_str());
      auto timer = std::make_shared<net::steady_timer>(acceptor_.get_executor(),
                                                       std::chrono::milliseconds(50));
      timer->async_wait([this, timer](error_code) { accept(); });
      return;
    }
    if (connections_.load(std::memory_order_relaxed) >= limits_.max_connections) {
      // Over the connection cap: a best-effort 503 without waiting on the client.
      const HttpResponse response = handler_.transport_error(503, "too many open connections");
      const std::string text = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                               "application/json\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(response.body.size()) + "\r\n\r\n" + response.body;
      error_code ignored;
      socket.non_blocking(true, ignored);
      ::send(socket.native_handle(), text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      socket.close(ignored);
    } else {
      // Stream chunks (and small responses) go out at once instead of waiting for the ACK of
      // the previous segment (Nagle, up to a delayed-ACK timeout of 40 ms).
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void HttpServer::mark_stopping() { stopping_.store(true, std::memory_order_release); }

void HttpServer::stop(std::chrono::milliseconds grace) {
  mark_stopping();
  // On the acceptor's strand: never concurrent with the accept handler.
  net::post(acceptor_.get_executor(), [this, deadline = Clock::now() + grace] {
    error_code ignored;
    acceptor_.close(ignored);
    wait_for_drain(deadline);
  });
}

void HttpServer::wait_for_drain(Clock::time_point deadline) {
  if (awaiting_response_.load(std::memory_order_acquire) == 0 || Clock::now() >= deadline) {
    io_.stop();
    return;
  }
  auto timer = std::make_shared<net::steady_timer>(io_, std::chrono::milliseconds(10));
  timer->async_wait([this, timer, deadline](error_code) { wait_for_drain(deadline); });
}

void HttpServer::join() {
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

}  // namespace lily
