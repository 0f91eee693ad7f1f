#include "server/http.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <ctime>
#include <thread>

#include "core/sys.h"
#include "attention/backend.h"
#include "kv/press.h"
#include "readers/reader.h"
#include "rope/rope_scaling.h"

namespace lc::server {

using nlohmann::json;

bool constant_time_equal(const std::string& a, const std::string& b) {
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_json(e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A method's registry as the page lists it.
template <class Info>
json method_list(const std::vector<Info>& infos) {
  json a = json::array();
  for (const Info& m : infos) a.push_back({{"name", m.name}, {"help", m.help}, {"paper", m.paper}});
  return a;
}

}  // namespace

HttpServer::HttpServer(Engine& engine, ServerParams p) : engine_(engine), p_(std::move(p)) {
  svr_ = std::make_unique<httplib::Server>();
  const int threads = std::max(p_.http_threads, 2);
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr_->set_payload_max_length(p_.max_body);
  svr_->set_read_timeout(30, 0);
  svr_->set_write_timeout(30, 0);
  svr_->set_keep_alive_timeout(5);
  svr_->set_tcp_nodelay(true);  // headers and body go in separate writes: no Nagle delay between them
  routes();
}

HttpServer::~HttpServer() = default;

Expected<int> HttpServer::bind() {
  int port = p_.port;
  if (port == 0) {
    port = svr_->bind_to_any_port(p_.host);
    if (port < 0) return make_error(ErrorCode::kIo, fmt::format("cannot bind {} to a free port", p_.host));
  } else if (!svr_->bind_to_port(p_.host, port)) {
    return make_error(ErrorCode::kIo, fmt::format("cannot bind {}:{} (in use, or not an address of this host)",
                                                  p_.host, port));
  }
  return port;
}

void HttpServer::run() { svr_->listen_after_bind(); }
void HttpServer::stop() { svr_->stop(); }

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  // The key guards every endpoint but the page and /health.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (p_.api_key.empty() || req.path == "/" || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    const std::string given = auth.rfind(bearer, 0) == 0 ? auth.substr(bearer.size()) : std::string();
    if (!constant_time_equal(given, p_.api_key)) {
      send_error(res, {401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, {404, fmt::format("no endpoint {} {}", req.method, req.path), "not_found_error"});
    else if (res.status == 413)
      send_error(res, {413, "the request body is larger than this server takes (--max-body)", "invalid_request_error"});
    else
      send_error(res, {res.status, fmt::format("HTTP {}", res.status), "invalid_request_error"});
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, what, "server_error"});
  });

  s.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(index_html(), "text/html; charset=utf-8"); });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const EngineMetrics m = engine_.metrics();
    res.set_content(dump({{"status", "ok"},
                          {"slots_idle", engine_.params().n_slots - m.busy_slots},
                          {"slots_processing", m.busy_slots},
                          {"queued", m.queued}}),
                    "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const HParams& hp = engine_.model().hparams();
    json meta = {{"n_ctx_train", hp.n_ctx_train}, {"n_embd", hp.n_embd}, {"n_layer", hp.n_layer},
                 {"n_vocab", hp.n_vocab}};
    res.set_content(dump({{"object", "list"},
                          {"data", json::array({{{"id", p_.model_name},
                                                 {"object", "model"},
                                                 {"created", static_cast<int64_t>(std::time(nullptr))},
                                                 {"owned_by", "longctx"},
                                                 {"meta", meta}}})}}),
                    "application/json");
  });
  s.Get("/v1/longctx/methods", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"attention", method_list(attention_method_info())},
                          {"rope", method_list(rope_method_info())},
                          {"press", method_list(kv_press_method_info())},
                          {"reader", method_list(readers::reader_method_info())}}),
                    "application/json");
  });
  auto parse_body = [](const httplib::Request& req, httplib::Response& res, json& body) {
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      send_error(res, {400, "the request body is not valid JSON"});
      return false;
    }
    if (!body.is_object()) {
      send_error(res, {400, "the request body must be a JSON object"});
      return false;
    }
    return true;
  };
  s.Post("/tokenize", [this, parse_body](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    if (!body.contains("content") || !body["content"].is_string())
      return send_error(res, {400, "'content' must be a string"});
    auto flag = [&](const char* k, bool def) -> std::optional<bool> {
      if (!body.contains(k)) return def;
      if (!body[k].is_boolean()) return std::nullopt;
      return body[k].get<bool>();
    };
    const auto add_special = flag("add_special", false), parse_special = flag("parse_special", true),
               with_pieces = flag("with_pieces", false);
    if (!add_special || !parse_special || !with_pieces)
      return send_error(res, {400, "'add_special', 'parse_special' and 'with_pieces' must be true or false"});
    const Tokenizer& tok = engine_.model().tokenizer();
    const auto ids = tok.encode(body["content"].get<std::string>(), *add_special, *parse_special);
    json out = json::array();
    for (int32_t id : ids) {
      if (*with_pieces) {
        const std::string piece = tok.token_to_piece(id);
        out.push_back({{"id", id}, {"piece", json::parse(dump(json(piece)))}});
      } else {
        out.push_back(id);
      }
    }
    res.set_content(dump({{"tokens", out}}), "application/json");
  });
  s.Post("/detokenize", [this, parse_body](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    if (!body.contains("tokens") || !body["tokens"].is_array())
      return send_error(res, {400, "'tokens' must be an array of token ids"});
    const Tokenizer& tok = engine_.model().tokenizer();
    std::vector<int32_t> ids;
    for (const json& x : body["tokens"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.n_vocab())
        return send_error(res, {400, fmt::format("'tokens' holds {}, not a token id in [0, {})", x.dump(), tok.n_vocab())});
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    res.set_content(dump({{"content", tok.decode(ids)}}), "application/json");
  });
  s.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
    json a = json::array();
    for (const SlotInfo& si : engine_.slots())
      a.push_back({{"id", si.id},
                   {"state", si.state},
                   {"n_past", si.n_past},
                   {"kv_resident_bytes", si.kv_resident_bytes},
                   {"kv_spilled_bytes", si.kv_spilled_bytes},
                   {"kv_cap_bytes", si.kv_cap_bytes},
                   {"attn", si.attn},
                   {"rope", si.rope},
                   {"kv_press", si.kv_press},
                   {"request", si.job}});
    res.set_content(dump(a), "application/json");
  });
  s.Post(R"(/slots/(\d+))", [this, parse_body](const httplib::Request& req, httplib::Response& res) {
    const std::string action = req.get_param_value("action");
    int id = -1;
    try {
      id = std::stoi(req.matches[1].str());
    } catch (...) {
    }
    std::string filename;
    if (action == "save" || action == "restore") {
      json body;
      if (!parse_body(req, res, body)) return;
      if (!body.contains("filename") || !body["filename"].is_string())
        return send_error(res, {400, "'filename' must be a string"});
      filename = body["filename"].get<std::string>();
    }
    std::string detail;
    if (auto e = engine_.slot_action(id, action, filename, detail)) return send_error(res, *e);
    res.set_content(detail, "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineMetrics m = engine_.metrics();
    std::string t;
    auto metric = [&t](const char* name, const char* type, const char* help, double v) {
      t += fmt::format("# HELP longctx_{0} {1}\n# TYPE longctx_{0} {2}\nlongctx_{0} {3}\n", name, help, type, v);
    };
    metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", static_cast<double>(m.prompt_tokens));
    metric("prompt_seconds_total", "counter", "Seconds of prompt evaluation.", m.prompt_seconds);
    metric("cached_tokens_total", "counter", "Prompt tokens found in a slot's cache.", static_cast<double>(m.cached_tokens));
    metric("tokens_predicted_total", "counter", "Tokens generated.", static_cast<double>(m.predicted_tokens));
    metric("tokens_predicted_seconds_total", "counter", "Seconds of generation (per request, summed).", m.predicted_seconds);
    metric("predicted_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s, all slots.",
           m.predicted_per_second_recent);
    metric("batch_steps_total", "counter", "Batched decode steps.", static_cast<double>(m.batch_steps));
    metric("batched_tokens_total", "counter", "Tokens evaluated in batched decode steps.", static_cast<double>(m.batched_tokens));
    metric("prefill_chunks_merged_total", "counter", "Prefill chunks evaluated in the same forward pass as a decode step.",
           static_cast<double>(m.merged_prefill_chunks));
    metric("reader_rows_total", "counter", "Readers' generated tokens evaluated as rows of a decode step.",
           static_cast<double>(m.reader_rows));
    metric("reader_chunks_total", "counter", "Readers' prompt chunks evaluated by the engine's loop.",
           static_cast<double>(m.reader_chunks));
    metric("slots_busy", "gauge", "Slots serving a request.", static_cast<double>(m.busy_slots));
    metric("slots_total", "gauge", "Slots.", static_cast<double>(engine_.params().n_slots));
    metric("queue_length", "gauge", "Requests waiting for a slot.", static_cast<double>(m.queued));
    metric("kv_resident_bytes", "gauge", "KV cache bytes in RAM, all slots.", static_cast<double>(m.kv_resident_bytes));
    metric("kv_spilled_bytes", "gauge", "KV cache bytes in spill files.", static_cast<double>(m.kv_spilled_bytes));
    metric("kv_reserved_bytes", "gauge", "KV bytes reserved by the slots.", static_cast<double>(m.kv_reserved_bytes));
    metric("kv_in_use_bytes", "gauge", "KV bytes in blocks that hold tokens (a shared block once).",
           static_cast<double>(m.kv_in_use_bytes));
    metric("kv_shared_blocks", "gauge", "KV blocks held by more than one slot (a common prefix).",
           static_cast<double>(m.kv_shared_blocks));
    metric("prefix_shared_tokens_total", "counter", "Prompt tokens a slot took from another slot's cache.",
           static_cast<double>(m.prefix_shared_tokens));
    metric("kv_budget_bytes", "gauge", "The server's KV budget.", static_cast<double>(m.kv_budget_bytes));
    t += "# HELP longctx_requests_total Requests by outcome.\n# TYPE longctx_requests_total counter\n";
    t += fmt::format("longctx_requests_total{{status=\"ok\"}} {}\n", m.requests_finished);
    t += fmt::format("longctx_requests_total{{status=\"error\"}} {}\n", m.requests_failed);
    t += fmt::format("longctx_requests_total{{status=\"cancelled\"}} {}\n", m.requests_cancelled);
    t += fmt::format("longctx_requests_total{{status=\"refused\"}} {}\n", m.requests_refused);
    res.set_content(t, "text/plain; version=0.0.4");
  });

  auto completion = [this, parse_body](Endpoint ep, const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!parse_body(req, res, body)) return;
    const Tokenizer& tok = engine_.model().tokenizer();
    auto pr = std::make_shared<ParsedRequest>();
    ApiError err;
    if (!parse_request(ep, body, tok, p_.limits, *pr, err)) {
      engine_.count_refused();
      return send_error(res, err);
    }
    const double deadline = now_seconds() + p_.timeout_s;
    std::shared_ptr<Job> job = engine_.submit(pr->spec, deadline, err);
    if (!job) {
      engine_.count_refused();
      return send_error(res, err);
    }
    const std::string id = new_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    const std::string model = pr->model.empty() ? p_.model_name : pr->model;
    if (!pr->stream) {
      // Wait; after 2 s send whitespace every second, so that a client that has gone away is
      // noticed (its request is cancelled) and proxies do not time the connection out.
      std::vector<JobEvent> ev;
      const double t0 = now_seconds();
      bool done = false;
      while (!done && now_seconds() - t0 < 2.0) done = job->wait(ev, 0.25);
      auto final_body = [job, pr, ep, id, created, model, &tok]() -> std::pair<int, std::string> {
        if (job->error()) return {job->error()->status, dump(error_json(*job->error()))};
        return {200, dump(response_json(ep, id, created, model, *pr, job->stats(), tok, job->read_map()))};
      };
      if (done) {
        auto [status, text] = final_body();
        res.status = status;
        res.set_content(text, "application/json");
        return;
      }
      res.set_chunked_content_provider("application/json", [job, final_body](size_t, httplib::DataSink& sink) {
        std::vector<JobEvent> ev;
        for (;;) {
          ev.clear();
          if (job->wait(ev, 1.0)) break;
          if (!sink.write(" ", 1)) {
            job->cancel();
            return false;
          }
        }
        const std::string text = final_body().second;
        if (!sink.write(text.data(), text.size())) return false;
        sink.done();
        return true;
      }, [job](bool) { job->cancel(); });
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, pr, ep, id, created, model, &tok](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          size_t text_base = 0;
          std::vector<JobEvent> ev;
          for (;;) {
            ev.clear();
            const bool done = job->wait(ev, 0.5);
            for (JobEvent& e : ev) {
              if (e.text.empty() && e.logprobs.empty()) continue;
              json lp = pr->logprobs && !e.logprobs.empty() ? logprobs_json(ep, tok, e.logprobs, text_base) : json(nullptr);
              text_base += e.text.size();
              if (!send(chunk_json(ep, id, created, model, e.text, lp, nullptr, first))) {
                job->cancel();
                return false;
              }
              first = false;
            }
            if (done) break;
            if (ev.empty() && !sink.write(": keep-alive\n\n", 14)) {  // an SSE comment: notices a client gone
              job->cancel();
              return false;
            }
          }
          if (job->error()) {
            send(error_json(*job->error()));
          } else {
            const RequestStats& st = job->stats();
            json last = chunk_json(ep, id, created, model, "", nullptr, finish_reason(st.stop), first);
            last["timings"] = timings_json(st);
            const int64_t n_prompt = pr->spec.methods.reader.empty() ? static_cast<int64_t>(pr->spec.prompt.size())
                                                                     : st.n_prompt;
            last["usage"] = usage_json(n_prompt, st.n_gen);
            const auto map = job->read_map();
            if (!map.empty()) last["longctx"] = {{"read_map", map}};
            send(last);
            if (pr->include_usage) {
              json u = {{"id", id},
                        {"object", ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", model},
                        {"choices", json::array()},
                        {"usage", usage_json(n_prompt, st.n_gen)}};
              send(u);
            }
          }
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          sink.done();
          return true;
        },
        [job](bool) { job->cancel(); });
  };
  s.Post("/v1/chat/completions", [completion](const httplib::Request& q, httplib::Response& r) { completion(Endpoint::kChat, q, r); });
  s.Post("/chat/completions", [completion](const httplib::Request& q, httplib::Response& r) { completion(Endpoint::kChat, q, r); });
  s.Post("/v1/completions", [completion](const httplib::Request& q, httplib::Response& r) { completion(Endpoint::kCompletion, q, r); });
  s.Post("/completions", [completion](const httplib::Request& q, httplib::Response& r) { completion(Endpoint::kCompletion, q, r); });
}

}  // namespace lc::server
