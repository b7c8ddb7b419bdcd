// HTTP/1.1 transport on Boost.Beast: accept loop, one strand per connection, limits and deadlines.
#include "server/http_server.h"

#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/error.h"

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
    Responder respond = [self](HttpResponse response) {
      net::post(self->socket_.get_executor(), [self, response = std::move(response)]() mutable {
        self->send(std::move(response));
      });
    };
    try {
      server_.handler_.handle(std::move(request), std::move(respond));
    } catch (const std::exception& e) {
      // The handler promises not to throw; if it does, the client still gets an answer.
      std::fprintf(stderr, "request failed: handler threw: %s\n", e.what());
      send(server_.handler_.transport_error(500, "internal server error"));
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
    if (client_gone_) client_gone_->store(true, std::memory_order_release);
  }

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

    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        Clock::now() - (method_ == "-" ? Clock::now() : received_))
                        .count();
    if (server_.logger_) {
      server_.logger_(method_ + " " + path_ + " " + std::to_string(response.status) + " " +
                      std::to_string(ms) + "ms" + response.log_detail);
    }
    arm(server_.limits_.write_timeout);
    http::async_write(socket_, *response_,
                      [self = shared_from_this(), was_awaiting](error_code ec, size_t) {
                        self->on_written(ec, was_awaiting);
                      });
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
  bool awaiting_response_ = false;
  bool keep_alive_ = false;
  bool unread_body_ = false;
  size_t drained_ = 0;
  std::array<char, 16384> drain_buffer_{};
};

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
