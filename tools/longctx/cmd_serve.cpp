// `longctx serve`: the OpenAI-compatible HTTP server (src/server). Prints
// "listening on http://HOST:PORT" on stdout once it takes connections; SIGINT or SIGTERM stop
// it (requests in progress end with an error).
#include <fmt/format.h>

#include <csignal>
#include <memory>
#include <thread>

#include <unistd.h>

#include <cerrno>

#include "command.h"
#include "core/log.h"
#include "embedded_model.h"
#include "options.h"
#include "runtime/qttt.h"
#include "server/engine.h"
#include "server/http.h"

namespace {

int g_stop_pipe[2] = {-1, -1};

struct ServeArgs {
  CommonOpts co;
  SamplingOpts so;
  std::string host = "127.0.0.1", api_key, slot_save_path, schedule = "fcfs", chat_template, alias, qttt;
  int port = 8080, n_slots = 4, http_threads = 32;
  bool no_merge_prefill = false;
  bool no_reader_batch = false;
  double prefill_share = 0.5;
  int64_t max_body = int64_t{16} << 20, max_prompt = 0, max_tokens = 4096, n_predict = 256, max_queue = 64;
  double timeout = 600;
};

int cmd_serve(const ServeArgs& a) {
  // Without -m: the reader model, so that reader requests work out of the box.
  auto model = load_model_or_reader(a.co);
  if (!model) return fail(model.error().message);
  auto sp = a.so.params();
  if (!sp) return fail(sp.error().message);
  if (lc::Status s = lc::check_logit_bias_vocab(*sp, (*model)->hparams().n_vocab); !s) return fail(s.message());
  auto cp = a.co.ctx_params();
  if (!cp) return fail(cp.error().message);
  lc::server::EngineParams ep;
  ep.defaults.ctx = *cp;
  if (!a.qttt.empty()) {
    auto q = lc::parse_qttt(a.qttt);
    if (!q) return fail(q.error().message);
    ep.defaults.qttt = *q;
  }
  ep.n_slots = a.n_slots;
  ep.merge_prefill = !a.no_merge_prefill;
  ep.reader_batch = !a.no_reader_batch;
  ep.prefill_share = a.prefill_share;
  ep.kv_budget = cp->kv_budget;
  ep.defaults.ctx.kv_budget = 0;
  ep.max_queue = static_cast<size_t>(a.max_queue);
  // -c bounds a request's prompt, unless --max-prompt says otherwise.
  ep.max_prompt = a.max_prompt > 0 ? a.max_prompt : a.co.n_ctx;
  ep.schedule = a.schedule;
  ep.slot_save_path = a.slot_save_path;
  auto ct = chat_template_for(**model, a.chat_template);
  if (!ct) return fail(ct.error().message);
  const lc::ChatTemplate tmpl = *ct;
  ep.chat_template = tmpl;
  if (a.n_predict > a.max_tokens)
    return fail(fmt::format("-n/--n-predict {} is above --max-tokens {}", a.n_predict, a.max_tokens));

  // SIGINT and SIGTERM write a byte to a pipe (whichever thread they land on: the BLAS library
  // has threads of its own); a thread waiting on the pipe stops the server.
  if (pipe(g_stop_pipe) != 0) return fail("cannot create a pipe");
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    const char b = 1;
    (void)!write(g_stop_pipe[1], &b, 1);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto engine = lc::server::Engine::create(**model, ep);
  if (!engine) return fail(engine.error().message);
  lc::server::ServerParams hp;
  hp.host = a.host;
  hp.port = a.port;
  hp.api_key = a.api_key.empty() && std::getenv("LONGCTX_API_KEY") ? std::getenv("LONGCTX_API_KEY") : a.api_key;
  hp.max_body = static_cast<size_t>(a.max_body);
  hp.timeout_s = a.timeout;
  hp.http_threads = a.http_threads;
  hp.model_name = !a.alias.empty() ? a.alias : a.co.model.empty() ? std::string(kEmbeddedReaderModelName) : a.co.model;
  hp.limits.max_tokens_cap = a.max_tokens;
  hp.limits.default_max_tokens = a.n_predict;
  hp.limits.defaults = *sp;
  hp.limits.chat_template = tmpl;
  lc::server::HttpServer server(**engine, hp);
  auto port = server.bind();
  if (!port) return fail(port.error().message);
  std::thread sig([&server] {
    char b = 0;
    while (read(g_stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    server.stop();
  });
  fmt::print("listening on http://{}:{}\n", a.host, *port);
  std::fflush(stdout);
  fmt::print(stderr, "longctx serve: {} slots, KV budget {:.1f} MiB, chat template {}, schedule {}{}\n", a.n_slots,
             static_cast<double>((*engine)->metrics().kv_budget_bytes) / (1024.0 * 1024.0),
             lc::chat_template_name(tmpl), a.schedule, hp.api_key.empty() ? "" : ", API key required");
  server.run();
  // However the server stopped, the signal thread is released before it is joined.
  const char b = 0;
  (void)!write(g_stop_pipe[1], &b, 1);
  sig.join();
  return 0;
}

}  // namespace

std::vector<RegisteredCommand> add_serve_commands(CLI::App* app) {
  auto a = std::make_shared<ServeArgs>();
  auto* serve = app->add_subcommand(
      "serve", "OpenAI-compatible HTTP server (chat completions, completions, streaming) with continuous batching; "
               "without -m, the project's reader model");
  a->co.add(serve);
  a->so.add(serve);
  serve->get_option("--model")->description("GGUF model (default: the embedded reader model, longctx-2l-reader)");
  serve->add_option("--host", a->host, "address to listen on")->capture_default_str();
  serve->add_option("--port", a->port, "port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  serve->add_option("--parallel", a->n_slots, "slots: requests served at once, batched (also -np)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  serve->add_flag("--no-merge-prefill", a->no_merge_prefill,
                  "run a prompt's prefill chunks as their own forward passes between decode steps, instead of "
                  "inside the decode batch's pass (for A/B measurements)");
  serve->add_flag("--no-reader-batch", a->no_reader_batch,
                  "run a reader's model calls on its own thread and thread pool, beside the loop, instead of as rows "
                  "and chunks of the decode batch (for A/B measurements)");
  serve->add_option("--prefill-share", a->prefill_share,
                  "while other requests generate, the fraction of their decode step's time a prompt's prefill chunk may add")
      ->check(CLI::Range(0.01, 100.0))->capture_default_str();
  serve->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' (or set LONGCTX_API_KEY)");
  serve->add_option("--max-body", a->max_body, "largest request body, bytes (16M, ...)")
      ->transform(byte_size_value())->capture_default_str();
  serve->add_option("--max-prompt", a->max_prompt, "longest prompt in tokens (0: -c, or only the KV budget)")
      ->transform(token_length_value())->capture_default_str();
  serve->add_option("--max-tokens", a->max_tokens, "largest max_tokens a request may ask")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  serve->add_option("-n,--n-predict", a->n_predict, "max_tokens of a request that gives none")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  serve->add_option("--max-queue", a->max_queue, "requests waiting for a slot beyond which 429 is returned")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))->capture_default_str();
  serve->add_option("--timeout", a->timeout, "seconds a request may take from its arrival (504 beyond)")
      ->check(CLI::Range(0.1, 1e7))->capture_default_str();
  serve->add_option("--schedule", a->schedule, "which queued request goes next: fcfs, or sjf (shortest prompt "
                    "first, with aging)")->capture_default_str();
  serve->add_option("--slot-save-path", a->slot_save_path, "folder for POST /slots/ID?action=save|restore");
  serve->add_option("--chat-template", a->chat_template, "auto (the model's), or llama3, chatml, llama2, zephyr");
  serve->add_option("--alias", a->alias, "the model name /v1/models gives");
  serve->add_option("--qttt", a->qttt, "qTTT for every request without its own: steps=N,lr=X,span=S");
  serve->add_option("--http-threads", a->http_threads, "connections served at once")
      ->check(CLI::Range(2, 4096))->capture_default_str();
  return {{serve, [a] { return cmd_serve(*a); }}};
}
