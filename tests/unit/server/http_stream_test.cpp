// The transport's streamed responses (chunked SSE): a fake streaming HttpHandler, raw client
// sockets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/http_server.h"

namespace lily {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What the fake handler was given: the test answers it (streams) from its own thread.
struct Pending {
  HttpRequest request;
  Responder respond;
  std::thread::id thread;  // the thread handle() ran on
};

class FakeHandler : public HttpHandler {
 public:
  std::optional<HttpResponse> screen(const HttpRequestHead&) override { return std::nullopt; }
  void handle(HttpRequest request, Responder respond) override {
    std::lock_guard lock(mutex_);
    pending_.push_back({std::move(request), std::move(respond), std::this_thread::get_id()});
    cv_.notify_all();
  }
  HttpResponse transport_error(int status, std::string message) override {
    HttpResponse response;
    response.status = status;
    response.body = "{\"error\":\"" + message + "\"}";
    return response;
  }
  std::optional<Pending> next(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !pending_.empty(); })) return std::nullopt;
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    return p;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    pending_.clear();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
};

class LogSink {
 public:
  RequestLogger logger() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex_);
      lines_.push_back(line);
      cv_.notify_all();
    };
  }
  // The first line containing `text`, waiting up to `timeout` for it.
  std::optional<std::string> wait_for(const std::string& text,
                                      std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex_);
    std::optional<std::string> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const std::string& line : lines_) {
        if (line.find(text) != std::string::npos) {
          found = line;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  size_t count() {
    std::lock_guard lock(mutex_);
    return lines_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// A server on 127.0.0.1:<free port> with the fake handler. Pending requests (which hold their
// connections) are dropped before the server goes.
struct TestServer {
  explicit TestServer(HttpLimits limits = {}, int threads = 1) {
    server = std::make_unique<HttpServer>(handler, limits, log.logger());
    server->bind("127.0.0.1:0");
    server->start(threads);
  }
  ~TestServer() {
    server->stop(0ms);
    server->join();
    handler.clear();
    server.reset();
  }
  uint16_t port() const { return server->local_endpoint().port(); }

  FakeHandler handler;
  LogSink log;
  std::unique_ptr<HttpServer> server;
};

// A blocking client socket with a 10 s receive timeout (a missing byte fails the test instead
// of hanging it) and a read buffer.
class Client {
 public:
  explicit Client(uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    if (receive_buffer > 0) {
      // Before connect, so that the window offered to the server is small too.
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    timeval timeout{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("connect failed");
    }
  }
  ~Client() { close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }
  uint16_t local_port() const {
    sockaddr_in address{};
    socklen_t length = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    return ntohs(address.sin_port);
  }

  void send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Everything up to and including `needle`; nullopt on EOF or timeout.
  std::optional<std::string> read_until(std::string_view needle) {
    for (;;) {
      const size_t at = buffer_.find(needle);
      if (at != std::string::npos) return take(at + needle.size());
      if (!fill()) return std::nullopt;
    }
  }
  std::optional<std::string> read_exactly(size_t n) {
    while (buffer_.size() < n) {
      if (!fill()) return std::nullopt;
    }
    return take(n);
  }
  // Whatever arrives until the server closes (nullopt on timeout).
  std::optional<std::string> read_to_eof() {
    for (;;) {
      char data[16384];
      const ssize_t n = ::recv(fd_, data, sizeof data, 0);
      if (n == 0) return take(buffer_.size());
      if (n < 0) {
        if (errno == ECONNRESET) return take(buffer_.size());
        return std::nullopt;
      }
      buffer_.append(data, static_cast<size_t>(n));
    }
  }
  // One chunk of a chunked body, strictly framed: "<hex size>\r\n<data>\r\n". The last chunk
  // ("0\r\n\r\n") reads as "".
  std::optional<std::string> read_chunk() {
    const std::optional<std::string> size_line = read_until("\r\n");
    if (!size_line) return std::nullopt;
    size_t size = 0;
    try {
      size = std::stoul(*size_line, nullptr, 16);
    } catch (const std::exception&) {
      ADD_FAILURE() << "bad chunk size line: " << *size_line;
      return std::nullopt;
    }
    std::optional<std::string> data = read_exactly(size + 2);
    if (!data || data->substr(size) != "\r\n") {
      ADD_FAILURE() << "chunk not followed by CRLF";
      return std::nullopt;
    }
    data->resize(size);
    return data;
  }

 private:
  bool fill() {
    char data[16384];
    const ssize_t n = ::recv(fd_, data, sizeof data, 0);
    if (n <= 0) return false;
    buffer_.append(data, static_cast<size_t>(n));
    return true;
  }
  std::string take(size_t n) {
    std::string out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  std::string buffer_;
};

std::string post_request(std::string_view version = "HTTP/1.1") {
  return "POST /v1/stream " + std::string(version) +
         "\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
}

std::string frame(int i) {
  return "data: {\"i\":" + std::to_string(i) + "}\n\n";
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

bool gone(const Pending& p) {
  return p.request.client_gone->load(std::memory_order_acquire);
}

// Whether `line` is "<start><digits>ms<rest>" exactly (the log line's duration varies).
bool log_line_is(const std::string& line, std::string_view start, std::string_view rest) {
  if (line.rfind(start, 0) != 0) return false;
  size_t i = start.size();
  const size_t digits = i;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
  return i > digits && line.substr(i) == "ms" + std::string(rest);
}

TEST(HttpStream, HeadThenEveryWriteAsItsOwnChunkFlushedBeforeTheNext) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->request.start_stream);
  std::shared_ptr<ResponseStream> stream =
      p->request.start_stream({200, {{"X-Request-Id", "r1"}, {"Bad", "a\r\nInjected: 1"}}});

  const std::optional<std::string> head = client.read_until("\r\n\r\n");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << *head;
  EXPECT_NE(head->find("\r\nContent-Type: text/event-stream\r\n"), std::string::npos) << *head;
  EXPECT_NE(head->find("\r\nCache-Control: no-cache\r\n"), std::string::npos) << *head;
  EXPECT_NE(head->find("\r\nTransfer-Encoding: chunked\r\n"), std::string::npos) << *head;
  EXPECT_NE(head->find("\r\nX-Request-Id: r1\r\n"), std::string::npos) << *head;
  EXPECT_EQ(head->find("Content-Length"), std::string::npos) << *head;
  EXPECT_EQ(head->find("Connection: close"), std::string::npos) << *head;
  EXPECT_EQ(head->find("Injected"), std::string::npos) << *head;

  // Frame i + 1 is written only once the client holds frame i: without a flush per write the
  // client would wait for a frame that is never sent (and time out).
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(stream->write(frame(i)));
    const std::optional<std::string> chunk = client.read_chunk();
    ASSERT_TRUE(chunk) << "frame " << i << " did not arrive";
    EXPECT_EQ(*chunk, frame(i));
  }
  // Writes queued back to back still go out as one chunk each, in order.
  EXPECT_TRUE(stream->write(""));  // no-op: an empty chunk would end the body
  for (int i = 5; i < 8; ++i) ASSERT_TRUE(stream->write(frame(i)));
  ASSERT_TRUE(stream->write("data: [DONE]\n\n"));
  stream->finish(200, " prompt=3 cached=0 completion=8 tok/s=1.0");
  EXPECT_FALSE(stream->write("late"));  // after finish
  for (int i = 5; i < 8; ++i) EXPECT_EQ(client.read_chunk(), frame(i));
  EXPECT_EQ(client.read_chunk(), "data: [DONE]\n\n");
  EXPECT_EQ(client.read_chunk(), "");  // the last chunk
  EXPECT_FALSE(stream->failed());
  EXPECT_FALSE(gone(*p));
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  EXPECT_TRUE(
      log_line_is(*line, "POST /v1/stream 200 ", " prompt=3 cached=0 completion=8 tok/s=1.0"))
      << *line;
}

// The server's end of the client's connection, found among this process's descriptors.
int server_side_fd(uint16_t server_port, uint16_t client_port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_in local{};
    sockaddr_in peer{};
    socklen_t local_length = sizeof local;
    socklen_t peer_length = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0 ||
        local.sin_family != AF_INET) {
      continue;
    }
    if (ntohs(local.sin_port) == server_port && ntohs(peer.sin_port) == client_port) return fd;
  }
  return -1;
}

int no_delay(int fd) {
  int value = -1;
  socklen_t length = sizeof value;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &value, &length) != 0) return -1;
  return value;
}

TEST(HttpStream, AcceptedSocketsHaveTcpNoDelay) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();  // accepted and served by now
  ASSERT_TRUE(p);
  const int fd = server_side_fd(t.port(), client.local_port());
  ASSERT_GE(fd, 0) << "the accepted socket was not found in /proc/self/fd";
  EXPECT_EQ(no_delay(fd), 1);
  EXPECT_EQ(no_delay(client.fd()), 0);  // the check tells the two apart: the default is off
  p->respond(HttpResponse{});
  EXPECT_TRUE(client.read_until("\r\n\r\n"));
}

TEST(HttpStream, KeepAliveAfterAFinishedStream) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  ASSERT_TRUE(stream->write(frame(1)));
  stream->finish(200, "");
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  EXPECT_EQ(client.read_chunk(), frame(1));
  EXPECT_EQ(client.read_chunk(), "");

  // The same connection serves the next request: a second stream, then a plain response.
  client.send_all(post_request());
  std::optional<Pending> second = t.handler.next();
  ASSERT_TRUE(second);
  auto stream2 = second->request.start_stream({});
  ASSERT_TRUE(stream2->write(frame(2)));
  stream2->finish(200, " second");
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  EXPECT_EQ(client.read_chunk(), frame(2));
  EXPECT_EQ(client.read_chunk(), "");

  client.send_all("GET /plain HTTP/1.1\r\nHost: test\r\n\r\n");
  std::optional<Pending> third = t.handler.next();
  ASSERT_TRUE(third);
  HttpResponse response;
  response.body = R"({"ok":true})";
  third->respond(response);
  const std::optional<std::string> head = client.read_until("\r\n\r\n");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << *head;
  EXPECT_NE(head->find("Content-Length: 11\r\n"), std::string::npos) << *head;
  EXPECT_EQ(client.read_exactly(11), R"({"ok":true})");
  EXPECT_TRUE(t.log.wait_for("POST /v1/stream 200 "));
  EXPECT_TRUE(t.log.wait_for(" second"));
  EXPECT_TRUE(t.log.wait_for("GET /plain 200 "));
}

TEST(HttpStream, ClientClosingMidStreamSetsClientGoneAndLogs499) {
  TestServer t;
  std::optional<Pending> p;
  std::shared_ptr<ResponseStream> stream;
  {
    Client client(t.port());
    client.send_all(post_request());
    p = t.handler.next();
    ASSERT_TRUE(p);
    stream = p->request.start_stream({});
    ASSERT_TRUE(stream->write(frame(1)));
    ASSERT_TRUE(client.read_until("\r\n\r\n"));
    ASSERT_EQ(client.read_chunk(), frame(1));
    EXPECT_FALSE(gone(*p));
  }  // the client closes
  // The watch notices the close at once (nothing is being written): bounded here by 5 s.
  ASSERT_TRUE(wait_until([&] { return gone(*p); }, 5s)) << "client_gone not set";
  EXPECT_TRUE(stream->failed());
  EXPECT_FALSE(stream->write(frame(2)));
  stream->finish(200, " prompt=4 cached=0 completion=1 tok/s=0.5");
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  EXPECT_TRUE(
      log_line_is(*line, "POST /v1/stream 499 ",
                  R"( prompt=4 cached=0 completion=1 tok/s=0.5 error="client disconnected")"))
      << *line;
  // Nothing holds the connection any more: it is gone.
  stream.reset();
  p.reset();
  EXPECT_TRUE(wait_until([&] { return t.server->open_connections() == 0; }));
}

TEST(HttpStream, ClientGoneBeforeTheStreamStartsFailsIt) {
  TestServer t;
  std::optional<Pending> p;
  {
    Client client(t.port());
    client.send_all(post_request());
    p = t.handler.next();
    ASSERT_TRUE(p);
  }
  ASSERT_TRUE(wait_until([&] { return gone(*p); }, 5s));
  auto stream = p->request.start_stream({});
  stream->finish(200, "");
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  EXPECT_TRUE(log_line_is(*line, "POST /v1/stream 499 ", R"( error="client disconnected")"))
      << *line;
  EXPECT_TRUE(stream->failed());
}

// The most the kernel can hold for one connection in its send buffer (autotuning's maximum).
size_t kernel_send_buffer_max() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_wmem");
  size_t low = 0, initial = 0, max = 0;
  if (in >> low >> initial >> max) return max;
  return 16u << 20;
}

TEST(HttpStream, ClientThatNeverReadsFailsTheStreamPastTheBound) {
  HttpLimits limits;
  limits.max_stream_buffer_bytes = 64 * 1024;
  TestServer t(limits);
  Client client(t.port(), /*receive_buffer=*/4096);  // and never reads
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  const std::string data = "data: " + std::string(1016, 'x') + "\n\n";  // 1 KiB
  size_t accepted = 0;
  const size_t attempts = (64u << 20) / data.size();  // 64 MiB if nothing stopped it
  for (size_t i = 0; i < attempts && stream->write(data); ++i) accepted += data.size();
  // What was accepted is at most the bound plus what the kernel took (its send buffer and the
  // client's small receive buffer): memory stays bounded although write() never blocked.
  const size_t kernel = kernel_send_buffer_max() + (1u << 20);
  EXPECT_LT(accepted, limits.max_stream_buffer_bytes + kernel) << "accepted " << accepted;
  EXPECT_GE(accepted, limits.max_stream_buffer_bytes - data.size());
  EXPECT_TRUE(stream->failed());
  EXPECT_TRUE(gone(*p));
  EXPECT_FALSE(stream->write(data));
  stream->finish(200, " prompt=1");
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  const std::string prefix = R"( prompt=1 error="client too slow: )";
  const size_t at = line->find(prefix);
  ASSERT_NE(at, std::string::npos) << *line;
  const size_t unsent = std::stoul(line->substr(at + prefix.size()));
  EXPECT_TRUE(log_line_is(*line, "POST /v1/stream 499 ",
                          prefix + std::to_string(unsent) + " bytes unsent\""))
      << *line;
  // Unsent = the backlog (at most the bound) + the failing frame + what the socket write in
  // flight still holds (the strand hands the whole backlog to one write, so up to the bound
  // again): "memory stays below twice the bound plus a frame" (http_server.cpp).
  EXPECT_GT(unsent, limits.max_stream_buffer_bytes);
  EXPECT_LE(unsent, 2 * limits.max_stream_buffer_bytes + data.size());
  // The connection was closed at the failure, not left to the write timeout (30 s).
  stream.reset();
  p.reset();
  EXPECT_TRUE(wait_until([&] { return t.server->open_connections() == 0; }, 5s));
}

// The bound is on the backlog behind the socket write in flight, not on a frame: a frame larger
// than the bound (one with 20 top_logprobs is 1.6-2.5 KB; the flag's floor is 1 KiB) written
// with nothing queued behind goes out. Each frame is written only after the client holds the
// one before, so the strand has taken it from the queue: the backlog is empty at every write
// whatever the scheduling (an end-to-end version of this was timing-dependent under load).
TEST(HttpStream, FramesLargerThanTheBoundReachAReaderThatKeepsUp) {
  HttpLimits limits;
  limits.max_stream_buffer_bytes = 1024;
  TestServer t(limits);
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  for (int i = 0; i < 6; ++i) {
    const std::string data =
        "data: " + std::string(static_cast<size_t>(3000 + 100 * i), static_cast<char>('a' + i)) +
        "\n\n";
    ASSERT_TRUE(stream->write(data)) << "frame " << i << " of " << data.size() << " bytes refused";
    EXPECT_EQ(client.read_chunk(), data) << "frame " << i;
  }
  ASSERT_TRUE(stream->write("data: [DONE]\n\n"));
  stream->finish(200, " prompt=1");
  EXPECT_EQ(client.read_chunk(), "data: [DONE]\n\n");
  EXPECT_EQ(client.read_chunk(), "");
  EXPECT_FALSE(stream->failed());
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  EXPECT_TRUE(log_line_is(*line, "POST /v1/stream 200 ", " prompt=1")) << *line;
}

TEST(HttpStream, WriteTimeoutCountsPerWriteNotPerStream) {
  HttpLimits limits;
  limits.write_timeout = 400ms;
  limits.max_stream_buffer_bytes = 64u << 20;
  TestServer t(limits);
  {
    // A reading client: the stream lasts several write timeouts in total.
    Client client(t.port());
    client.send_all(post_request());
    std::optional<Pending> p = t.handler.next();
    ASSERT_TRUE(p);
    auto stream = p->request.start_stream({});
    ASSERT_TRUE(client.read_until("\r\n\r\n"));
    for (int i = 0; i < 8; ++i) {
      std::this_thread::sleep_for(150ms);
      ASSERT_TRUE(stream->write(frame(i)));
      ASSERT_EQ(client.read_chunk(), frame(i));
    }
    stream->finish(200, " long");
    EXPECT_EQ(client.read_chunk(), "");
    const std::optional<std::string> line = t.log.wait_for(" long");
    ASSERT_TRUE(line);
    EXPECT_NE(line->find(" 200 "), std::string::npos) << *line;
  }
  {
    // A client that stops reading: the write that the socket no longer takes times out.
    Client client(t.port(), 4096);
    client.send_all(post_request());
    std::optional<Pending> p = t.handler.next();
    ASSERT_TRUE(p);
    auto stream = p->request.start_stream({});
    const std::string data(64 * 1024, 'y');
    const size_t total = kernel_send_buffer_max() + (4u << 20);  // more than the kernel holds
    for (size_t sent = 0; sent < total && sent + data.size() < limits.max_stream_buffer_bytes;
         sent += data.size()) {
      if (!stream->write(data)) break;
    }
    ASSERT_TRUE(wait_until([&] { return gone(*p); }, 10s));
    EXPECT_TRUE(stream->failed());
    stream->finish(200, "");
    const std::optional<std::string> line = t.log.wait_for("client too slow");
    ASSERT_TRUE(line);
    EXPECT_TRUE(log_line_is(*line, "POST /v1/stream 499 ",
                            R"( error="client too slow: nothing written for 400 ms")"))
        << *line;
  }
}

TEST(HttpStream, StopWithGraceWaitsForAStreamInFlight) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  ASSERT_TRUE(stream->write(frame(1)));
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  ASSERT_EQ(client.read_chunk(), frame(1));

  t.server->stop(10s);
  std::atomic<bool> joined{false};
  std::thread joiner([&] {
    t.server->join();
    joined = true;
  });
  // Without the wait the I/O threads would stop within milliseconds of stop().
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(joined.load());
  EXPECT_TRUE(stream->write(frame(2)));
  stream->finish(200, " graceful");
  EXPECT_EQ(client.read_chunk(), frame(2));
  EXPECT_EQ(client.read_chunk(), "");
  EXPECT_EQ(client.read_to_eof(), "");  // stopping: closed after the stream, not kept alive
  joiner.join();
  EXPECT_TRUE(joined.load());
  const std::optional<std::string> line = t.log.wait_for(" graceful", 0ms);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find(" 200 "), std::string::npos) << *line;
}

TEST(HttpStream, Http10ClientGetsACloseDelimitedStream) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request("HTTP/1.0"));
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  ASSERT_TRUE(stream->write(frame(1)));
  ASSERT_TRUE(stream->write("data: [DONE]\n\n"));
  stream->finish(200, " old");
  const std::optional<std::string> all = client.read_to_eof();
  ASSERT_TRUE(all);
  const size_t end = all->find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << *all;
  const std::string head = all->substr(0, end + 4);
  EXPECT_EQ(head.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("\r\nContent-Type: text/event-stream\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_EQ(head.find("Content-Length"), std::string::npos) << head;
  EXPECT_EQ(all->substr(end + 4), frame(1) + "data: [DONE]\n\n");  // raw bytes, no chunk framing
  EXPECT_TRUE(t.log.wait_for("POST /v1/stream 200 "));
}

TEST(HttpStream, PostRunsTasksOnTheConnectionsIoThreadInOrder) {
  TestServer t;  // one I/O thread: the one handle() ran on
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->request.post);
  EXPECT_NE(p->thread, std::this_thread::get_id());

  std::mutex mutex;
  std::vector<std::pair<int, std::thread::id>> ran;
  for (int i = 0; i < 3; ++i) {
    p->request.post([&, i] {
      std::lock_guard lock(mutex);
      ran.emplace_back(i, std::this_thread::get_id());
    });
  }
  p->request.post([] { throw std::runtime_error("boom"); });  // logged, the thread survives
  std::atomic<bool> after_throw{false};
  p->request.post([&] { after_throw = true; });
  ASSERT_TRUE(wait_until([&] { return after_throw.load(); }));
  {
    std::lock_guard lock(mutex);
    ASSERT_EQ(ran.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(ran[static_cast<size_t>(i)].first, i);
      EXPECT_EQ(ran[static_cast<size_t>(i)].second, p->thread);
    }
  }

  // A task posted after the connection closed and its object was destroyed still runs.
  p->respond(HttpResponse{});
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  client.close();
  const auto post = p->request.post;
  p.reset();
  ASSERT_TRUE(wait_until([&] { return t.server->open_connections() == 0; }));
  std::atomic<bool> late{false};
  post([&] { late = true; });
  EXPECT_TRUE(wait_until([&] { return late.load(); }));
}

TEST(HttpStream, ASecondAnswerIsRefused) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  p->respond(HttpResponse{});
  auto stream = p->request.start_stream({});
  EXPECT_TRUE(stream->failed());
  EXPECT_FALSE(stream->write(frame(1)));
  stream->finish(200, " refused");
  EXPECT_FALSE(gone(*p));  // the refused stream does not cancel the request
  const std::optional<std::string> head = client.read_until("\r\n\r\n");
  ASSERT_TRUE(head);
  EXPECT_NE(head->find("application/json"), std::string::npos) << *head;
  ASSERT_TRUE(t.log.wait_for("POST /v1/stream 200 "));
  EXPECT_FALSE(t.log.wait_for(" refused", 200ms));
  EXPECT_EQ(t.log.count(), 1u);
}

TEST(HttpStream, ADroppedStreamEndsBrokenAndIsLogged) {
  TestServer t;
  Client client(t.port());
  client.send_all(post_request());
  std::optional<Pending> p = t.handler.next();
  ASSERT_TRUE(p);
  auto stream = p->request.start_stream({});
  ASSERT_TRUE(stream->write(frame(1)));
  ASSERT_TRUE(client.read_until("\r\n\r\n"));
  ASSERT_EQ(client.read_chunk(), frame(1));
  stream.reset();                       // without finish()
  EXPECT_EQ(client.read_to_eof(), "");  // closed without the last chunk: the client sees it broke
  const std::optional<std::string> line = t.log.wait_for("POST /v1/stream ");
  ASSERT_TRUE(line);
  EXPECT_TRUE(log_line_is(*line, "POST /v1/stream 500 ",
                          R"( error="the handler dropped the stream without finishing it")"))
      << *line;
  EXPECT_TRUE(gone(*p));
}

}  // namespace
}  // namespace lily
