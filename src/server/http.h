// `longctx serve`'s HTTP front: OpenAI's endpoints (chat completions, completions, models),
// llama-server's (tokenize, detokenize, health, metrics, slots), the web page, and the limits
// every request meets before it reaches the engine: API key (compared in constant time), body
// size, prompt length, max_tokens, a deadline, a bounded queue. A client that goes away
// cancels its request: a stream notices at its next write, a plain request through the
// whitespace it is sent while it waits (JSON allows leading whitespace).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "server/engine.h"
#include "server/openai.h"

namespace httplib {
class Server;
}

namespace lc::server {

struct ServerParams {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port
  std::string api_key;                // empty: no key asked
  size_t max_body = size_t{16} << 20; // bytes (--max-body)
  double timeout_s = 600;             // a request's deadline, from its arrival (--timeout)
  int http_threads = 32;              // connections served at once
  std::string model_name = "longctx";
  RequestLimits limits;
};

// The web page (data/server/index.html, compiled in).
const std::string& index_html();

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerParams p);
  ~HttpServer();
  // Binds the socket; returns the port (the one chosen when p.port is 0).
  Expected<int> bind();
  // Serves until stop() (from another thread or a signal handler's thread).
  void run();
  void stop();

 private:
  void routes();
  Engine& engine_;
  ServerParams p_;
  std::unique_ptr<httplib::Server> svr_;
};

// Compares two strings in time that depends only on their lengths (API keys).
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace lc::server
