// `longctx bench serve`: the server under load, measured from its clients. It starts the
// server in this process (the model and method flags of `serve`) on a loopback port, then:
//   * a concurrency sweep: C clients (-c 1,2,4,8) each send --requests streamed completions
//     of --n-predict tokens one after another; it reports the aggregate generation tokens/s,
//     the mean time to first token and the mean time per token a client sees;
//   * with --doc N: three short chats alone, then the same three while one request of an
//     N-token document runs beside them: their time per token in both cases; with
//     --doc-reader SPEC the document request runs that reader (a question about the document).
//     --no-reader-batch: the reader's calls on its own thread (serve's flag; A/B).
// Prints a Markdown table and the peak RSS. Every request goes over real HTTP.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "command.h"
#include "core/sys.h"
#include "options.h"
#include "server/engine.h"
#include "server/http.h"

namespace {

using nlohmann::json;

struct BenchServeArgs {
  CommonOpts co;
  std::vector<int> clients{1, 2, 4, 8};
  int requests = 4;
  int64_t n_predict = 64, prompt_words = 40, doc = 0;
  std::string doc_attn;
  double doc_lead = 0.5;  // seconds the document prefills alone before the chats start
  int slots = 8;
  bool no_merge_prefill = false;
  bool no_reader_batch = false;
  std::string doc_reader;
  double prefill_share = 0.5;
};

struct ClientStats {
  int64_t tokens = 0;
  double ttft_sum = 0, tpot_sum = 0;  // seconds: time to first token, mean gap after it
  int requests = 0, errors = 0;
};

std::string words(int64_t n, int salt) {
  static const char* w[] = {"river", "stone", "lamp", "garden", "winter", "market", "violin", "harbor", "cloud"};
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[(i * 7 + salt) % 9];
  return s;
}

// One streamed completion; the time of each content chunk's arrival.
void one_request(int port, const std::string& prompt, int64_t n_predict, ClientStats& cs,
                 const json& longctx = nullptr, const std::atomic<bool>* stop = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(3600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  json body = {{"prompt", prompt}, {"max_tokens", n_predict}, {"temperature", 0}, {"stream", true},
               {"ignore_eos", true}};
  if (!longctx.is_null()) body["longctx"] = longctx;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::vector<double> arrivals;
  std::string buf;
  const double t0 = lc::now_seconds();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    if (stop && stop->load()) return false;  // the client goes away (the server cancels)
    buf.append(d, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: {", 0) == 0) {
        json j = json::parse(ev.substr(6), nullptr, false);
        if (j.is_object() && j.contains("choices") && !j["choices"].empty() &&
            !j["choices"][0].value("text", "").empty())
          arrivals.push_back(lc::now_seconds());
      }
    }
    return true;
  };
  auto r = c.send(req);
  cs.requests += 1;
  if (!r || r->status != 200 || arrivals.empty()) {
    cs.errors += 1;
    return;
  }
  cs.tokens += n_predict;
  cs.ttft_sum += arrivals.front() - t0;
  if (arrivals.size() > 1)
    cs.tpot_sum += (arrivals.back() - arrivals.front()) / static_cast<double>(arrivals.size() - 1);
}

int cmd_bench_serve(const BenchServeArgs& a) {
  auto model = load_model(a.co);
  if (!model) return fail(model.error().message);
  auto cp = a.co.ctx_params();
  if (!cp) return fail(cp.error().message);
  lc::server::EngineParams ep;
  ep.defaults.ctx = *cp;
  ep.kv_budget = cp->kv_budget;
  ep.defaults.ctx.kv_budget = 0;
  ep.n_slots = std::max(a.slots, *std::max_element(a.clients.begin(), a.clients.end()));
  ep.merge_prefill = !a.no_merge_prefill;
  ep.reader_batch = !a.no_reader_batch;
  ep.prefill_share = a.prefill_share;
  auto engine = lc::server::Engine::create(**model, ep);
  if (!engine) return fail(engine.error().message);
  lc::server::ServerParams hp;
  hp.port = 0;
  hp.limits.max_tokens_cap = std::max<int64_t>(a.n_predict, 4096);
  lc::server::HttpServer server(**engine, hp);
  auto port = server.bind();
  if (!port) return fail(port.error().message);
  std::thread th([&] { server.run(); });
  // Warm-up: one request, not counted.
  {
    ClientStats w;
    one_request(*port, words(a.prompt_words, 99), 8, w);
  }
  fmt::print("| clients | requests | gen tokens | aggregate gen tok/s | mean TTFT ms | mean ms/token per client | "
             "batched tokens/step |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  double single = 0;
  for (int nc : a.clients) {
    std::vector<ClientStats> cs(static_cast<size_t>(nc));
    const auto m0 = (*engine)->metrics();
    const double t0 = lc::now_seconds();
    std::vector<std::thread> ts;
    for (int i = 0; i < nc; ++i)
      ts.emplace_back([&, i] {
        for (int k = 0; k < a.requests; ++k)
          one_request(*port, words(a.prompt_words, i * 31 + k), a.n_predict, cs[static_cast<size_t>(i)]);
      });
    for (auto& t : ts) t.join();
    const double wall = lc::now_seconds() - t0;
    const auto m1 = (*engine)->metrics();
    int64_t tok = 0;
    int nreq = 0, errs = 0;
    double ttft = 0, tpot = 0;
    for (const auto& c : cs) {
      tok += c.tokens;
      nreq += c.requests;
      errs += c.errors;
      ttft += c.ttft_sum;
      tpot += c.tpot_sum;
    }
    const int ok = nreq - errs;
    const double agg = static_cast<double>(tok) / wall;
    if (nc == 1) single = agg;
    const double per_step = m1.batch_steps > m0.batch_steps
                                ? static_cast<double>(m1.batched_tokens - m0.batched_tokens) /
                                      static_cast<double>(m1.batch_steps - m0.batch_steps)
                                : 0.0;
    fmt::print("| {} | {}{} | {} | {:.1f}{} | {:.1f} | {:.2f} | {:.2f} |\n", nc, nreq,
               errs ? fmt::format(" ({} failed)", errs) : "", tok, agg,
               single > 0 && nc > 1 ? fmt::format(" ({:.2f}x)", agg / single) : "", ok ? 1e3 * ttft / ok : 0.0,
               ok ? 1e3 * tpot / ok : 0.0, per_step);
    std::fflush(stdout);
  }
  if (a.doc > 0) {
    // Three chats alone, then beside one document request of a.doc tokens (about 1.3 tokens a word).
    auto chats = [&](std::vector<ClientStats>& cs) {
      std::vector<std::thread> ts;
      for (int i = 0; i < 3; ++i)
        ts.emplace_back([&, i] { one_request(*port, words(a.prompt_words, 500 + i), a.n_predict, cs[static_cast<size_t>(i)]); });
      for (auto& t : ts) t.join();
    };
    auto tpot_of = [](const std::vector<ClientStats>& cs) {
      double s = 0;
      int n = 0;
      for (const auto& c : cs)
        if (c.requests > c.errors) {
          s += c.tpot_sum;
          n += 1;
        }
      return n ? 1e3 * s / n : 0.0;
    };
    std::vector<ClientStats> alone(3), beside(3);
    chats(alone);
    std::atomic<bool> doc_done{false}, stop_doc{false};
    ClientStats doc_stats;
    const std::string doc_text = words(a.doc * 10 / 13, 7);
    json doc_methods = a.doc_attn.empty() ? json(nullptr) : json{{"attn", a.doc_attn}};
    if (!a.doc_reader.empty()) {
      if (doc_methods.is_null()) doc_methods = json::object();
      doc_methods["reader"] = a.doc_reader;
      doc_methods["question"] = "Which word comes most often?";
    }
    const auto m_doc0 = (*engine)->metrics();
    const double t_doc = lc::now_seconds();
    std::thread doc([&] {
      one_request(*port, doc_text, 16, doc_stats, doc_methods, &stop_doc);
      doc_done = true;
    });
    // Let the document's prefill start, then run the chats beside it; then the document's
    // client goes away (its prefill would take minutes more) and the server cancels it.
    for (int i = 0; i < 500 && (*engine)->metrics().busy_slots == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::duration<double>(a.doc_lead));
    chats(beside);
    const bool overlapped = !doc_done.load();
    int64_t doc_done_tokens = 0;
    for (const auto& sl : (*engine)->slots())
      if (sl.state == "prefill") doc_done_tokens = sl.n_past;
    const double t_beside = lc::now_seconds() - t_doc;
    const auto m_doc1 = (*engine)->metrics();
    stop_doc = true;
    doc.join();
    fmt::print("\n| chats' mean ms/token | alone | beside a {}-token document{} | ratio |\n|---|---:|---:|---:|\n"
               "| 3 chats, {} tokens each | {:.2f} | {:.2f}{} | {:.2f} |\n",
               a.doc, a.doc_reader.empty() ? (a.doc_attn.empty() ? "" : " (" + a.doc_attn + ")")
                                         : " read by " + a.doc_reader + (a.no_reader_batch ? " (own thread)" : ""),
               a.n_predict, tpot_of(alone), tpot_of(beside),
               overlapped ? "" : " (document ended first)", tpot_of(beside) / std::max(tpot_of(alone), 1e-9));
    if (a.doc_reader.empty()) {
      fmt::print("the document's prefill had reached {} tokens after {:.1f} s, when the chats were done\n",
                 doc_done_tokens, t_beside);
    } else {
      fmt::print("while the chats ran ({:.1f} s from the reader's start), the reader's calls evaluated {} generated "
                 "tokens as batch rows and {} prompt chunks on the loop\n",
                 t_beside, m_doc1.reader_rows - m_doc0.reader_rows, m_doc1.reader_chunks - m_doc0.reader_chunks);
    }
  }
  fmt::print("\npeak RSS {:.1f} MiB\n", static_cast<double>(lc::peak_rss_bytes()) / (1024.0 * 1024.0));
  server.stop();
  th.join();
  return 0;
}

}  // namespace

std::vector<RegisteredCommand> add_bench_serve_commands(CLI::App* bench) {
  auto a = std::make_shared<BenchServeArgs>();
  auto* cmd = bench->add_subcommand("serve", "the HTTP server under load from concurrent streaming clients: "
                                             "aggregate tokens/s, time to first token, a long document beside chats");
  a->co.add(cmd);
  cmd->add_option("--clients", a->clients, "client counts, comma-separated")->delimiter(',')
      ->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--requests", a->requests, "requests per client")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens generated per request")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--prompt-words", a->prompt_words, "words per prompt")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
  cmd->add_option("--doc", a->doc, "tokens of a document request run beside three chats (0: skip)")
      ->transform(token_length_value())->capture_default_str();
  cmd->add_option("--doc-attn", a->doc_attn, "attention backend of the document request (default: the server's)");
  cmd->add_option("--doc-lead", a->doc_lead, "seconds the document prefills alone before the chats start")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str();
  cmd->add_flag("--no-merge-prefill", a->no_merge_prefill,
                "prefill chunks as their own forward passes, not inside the decode batch's (serve's flag; A/B)");
  cmd->add_option("--doc-reader", a->doc_reader, "the document request runs this reader (e.g. memagent), asked a "
                                                  "question about the document");
  cmd->add_flag("--no-reader-batch", a->no_reader_batch,
                "a reader's calls on its own thread and thread pool, not in the decode batch (serve's flag; A/B)");
  cmd->add_option("--prefill-share", a->prefill_share,
                  "while other requests generate, the fraction of their decode step's time a prompt's prefill chunk may add")
      ->check(CLI::Range(0.01, 100.0))->capture_default_str();
  cmd->add_option("--slots", a->slots, "server slots (at least the largest client count)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  return {{cmd, [a] { return cmd_bench_serve(*a); }}};
}
