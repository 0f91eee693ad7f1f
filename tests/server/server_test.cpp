// `longctx serve` in process, over real HTTP on loopback (cpp-httplib's client): greedy answers
// against Session::run with the same settings (the request flow `longctx run` uses, itself
// checked against llama.cpp), 4 clients at once each getting what it gets alone, prefix reuse,
// slot save and restore into a new engine, and bad input of every kind answered with OpenAI's
// error shape and the right status, never a crash or a hang; memory stays flat over 1,000
// requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/sys.h"
#include "model/model.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "readers/templates.h"
#include "runtime/session.h"
#include "server/engine.h"
#include "server/http.h"

#if defined(__SANITIZE_ADDRESS__)
// From the sanitizer runtime (sanitizer/allocator_interface.h, which GCC does not install).
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace lc::server {
namespace {

using nlohmann::json;

const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

const Model& stories() {
  static std::unique_ptr<Model> m = [] {
    auto r = Model::load(kStories);
    EXPECT_TRUE(r.has_value());
    return std::move(*r);
  }();
  return *m;
}

struct TestServer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  explicit TestServer(EngineParams ep = {}, ServerParams hp = {}) {
    ep.defaults.ctx.n_threads = 2;
    ep.defaults.ctx.n_batch = 64;
    ep.defaults.ctx.kv_block = 16;
    if (ep.kv_budget == 0) ep.kv_budget = int64_t{256} << 20;
    auto e = Engine::create(stories(), ep);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    engine = std::move(*e);
    hp.port = 0;
    hp.limits.defaults.temp = 0;
    http = std::make_unique<HttpServer>(*engine, hp);
    auto p = http->bind();
    EXPECT_TRUE(p.has_value());
    port = *p;
    thread = std::thread([this] { http->run(); });
  }
  ~TestServer() {
    http->stop();
    thread.join();
  }
  httplib::Client client(int timeout_s = 60) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(timeout_s, 0);
    return c;
  }
};

std::string story(int copies, int salt) {
  static const char* names[] = {"Lily", "Tom", "Sue", "Max", "Ben", "Amy"};
  std::string t;
  for (int i = 0; i < copies; ++i)
    t += std::string("Once upon a time, there was a little girl named ") + names[(i + salt) % 6] +
         ". She loved to play outside in the park. ";
  return t;
}

// What `longctx run` gives for the prompt: Session::run, greedy.
std::string run_alone(const std::string& prompt, int64_t n) {
  SessionParams p;
  p.ctx.n_ctx = 2048;
  p.ctx.n_threads = 1;
  auto s = Session::create(stories(), p);
  EXPECT_TRUE(s.has_value());
  SamplerParams sp;
  sp.temp = 0;
  Sampler sm(sp);
  GenerateOptions g;
  g.n_predict = n;
  auto st = (*s)->run(Prompt{stories().tokenizer().encode(prompt, true, true)}, sm, g, nullptr);
  EXPECT_TRUE(st.has_value());
  return st ? st->text : "";
}

json post(const httplib::Client& c0, const std::string& path, const json& body, int* status = nullptr) {
  httplib::Client& c = const_cast<httplib::Client&>(c0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

TEST(Server, CompletionEqualsRunAndStreamsTheSameText) {
  TestServer srv;
  auto c = srv.client();
  const std::string prompt = story(2, 0);
  const std::string want = run_alone(prompt, 24);
  int status = 0;
  json r = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["timings"].contains("prompt_per_second"));
  // Streamed: the chunks' texts joined, then [DONE].
  std::string body;
  auto res = c.Post("/v1/completions",
                    json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}}.dump(),
                    "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  std::string text;
  size_t pos = 0;
  bool saw_done = false, saw_finish = false;
  while ((pos = res->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = res->body.find("\n\n", pos);
    const std::string payload = res->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      saw_done = true;
      continue;
    }
    json j = json::parse(payload);
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) {
      saw_finish = true;
      EXPECT_EQ(j["usage"]["completion_tokens"], 24);
    }
  }
  EXPECT_TRUE(saw_done);
  EXPECT_TRUE(saw_finish);
  EXPECT_EQ(text, want);
}

TEST(Server, FourClientsAtOnceGetWhatTheyGetAlone) {
  // Long enough that the four generations overlap even when a slow (sanitised) build starts
  // the clients' connections tens of milliseconds apart.
  constexpr int kTokens = 128;
  TestServer srv;
  std::vector<std::string> prompts, want(4), got(4);
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(story(1 + i, i));
    want[i] = run_alone(prompts[i], kTokens);
  }
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      auto c = srv.client();
      json r = post(c, "/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", kTokens}, {"temperature", 0}});
      got[i] = r.value("choices", json::array({{{"text", "(error) " + r.dump()}}}))[0]["text"];
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << i;
  // They ran as batches: decode steps took tokens of several requests.
  const EngineMetrics m = srv.engine->metrics();
  EXPECT_GT(m.batched_tokens, m.batch_steps);
}

// A long prompt that arrives while two requests generate is prefilled a chunk at a time inside
// their decode passes (Context::decode_mixed); every answer is still what it is alone. With
// merge_prefill off the chunks run as their own passes, with the same answers.
TEST(Server, LongPromptPrefillsInsideTheDecodeBatch) {
  constexpr int kTokens = 400;
  const std::string long_prompt = story(40, 3);
  const std::string want_long = run_alone(long_prompt, 8);
  std::vector<std::string> prompts = {story(1, 0), story(2, 1)}, want;
  for (const auto& p : prompts) want.push_back(run_alone(p, kTokens));
  for (bool merge : {true, false}) {
    EngineParams ep;
    ep.merge_prefill = merge;
    TestServer srv(ep);
    std::vector<std::string> got(2);
    std::vector<std::thread> ts;
    for (int i = 0; i < 2; ++i)
      ts.emplace_back([&, i] {
        auto c = srv.client();
        json r = post(c, "/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", kTokens}, {"temperature", 0}});
        got[i] = r.value("choices", json::array({{{"text", "(error) " + r.dump()}}}))[0]["text"];
      });
    // The long prompt goes in once both generate.
    for (int spin = 0; spin < 20000 && srv.engine->metrics().batched_tokens < 8; ++spin)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    auto c = srv.client();
    json r = post(c, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0}});
    for (auto& t : ts) t.join();
    EXPECT_EQ(r.value("choices", json::array({{{"text", "(error) " + r.dump()}}}))[0]["text"], want_long) << merge;
    for (int i = 0; i < 2; ++i) EXPECT_EQ(got[i], want[i]) << i << " merge " << merge;
    const EngineMetrics m = srv.engine->metrics();
    if (merge) {
      EXPECT_GT(m.merged_prefill_chunks, 0);
    } else {
      EXPECT_EQ(m.merged_prefill_chunks, 0);
    }
  }
}

TEST(Server, SecondRequestReusesThePrefix) {
  TestServer srv;
  auto c = srv.client();
  const std::string prompt = story(4, 1);
  json a = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}});
  json b = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}});
  const int64_t n_prompt = a["usage"]["prompt_tokens"];
  EXPECT_EQ(a["timings"]["cache_n"], 0);
  EXPECT_EQ(b["timings"]["cache_n"], n_prompt - 1);  // all but the last token, whose logits start the answer
  EXPECT_EQ(b["timings"]["prompt_n"], 1);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
}

TEST(Server, SavedSlotRestoredInANewEngineContinuesIdentically) {
  const std::string dir = (std::filesystem::temp_directory_path() / "lc_server_slots").string();
  std::filesystem::create_directories(dir);
  const std::string prompt = story(3, 2);
  json first;
  {
    EngineParams ep;
    ep.n_slots = 1;
    ep.slot_save_path = dir;
    TestServer srv(ep);
    auto c = srv.client();
    first = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}});
    int status = 0;
    json s = post(c, "/slots/0?action=save", {{"filename", "slot0.bin"}}, &status);
    ASSERT_EQ(status, 200) << s.dump();
    EXPECT_GT(s["n_saved"].get<int64_t>(), 0);
    // A name that leaves the folder is refused.
    post(c, "/slots/0?action=save", {{"filename", "../escape.bin"}}, &status);
    EXPECT_EQ(status, 400);
  }
  EngineParams ep;
  ep.n_slots = 1;
  ep.slot_save_path = dir;
  TestServer srv(ep);
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/slots/0?action=restore", {{"filename", "slot0.bin"}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  json again = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}});
  EXPECT_EQ(again["timings"]["cache_n"].get<int64_t>(), first["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
  post(c, "/slots/0?action=restore", {{"filename", "nosuch.bin"}}, &status);
  EXPECT_EQ(status, 404);
  std::filesystem::remove_all(dir);
}

void expect_error(const httplib::Result& r, int status, const std::string& needle) {
  ASSERT_TRUE(r) << "no response (" << needle << ")";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
  EXPECT_TRUE(j["error"]["type"].is_string());
}

TEST(Server, BadInputGetsOpenAiErrors) {
  EngineParams ep;
  ep.kv_budget = int64_t{256} << 10;  // 256 KiB, about 200 tokens of this model: a long prompt cannot fit
  ServerParams hp;
  hp.max_body = size_t{1} << 20;
  hp.limits.max_tokens_cap = 1000;
  TestServer srv(ep, hp);
  auto c = srv.client();
  const char* ct = "application/json";
  expect_error(c.Post("/v1/completions", "{\"prompt\": ", ct), 400, "not valid JSON");
  expect_error(c.Post("/v1/completions", "[1,2]", ct), 400, "JSON object");
  expect_error(c.Post("/v1/completions", R"({"prompt": 5})", ct), 400, "'prompt'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": -1})", ct), 400, "'max_tokens'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 1e300})", ct), 400, "'max_tokens'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 5000})", ct), 400, "--max-tokens");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "temperature": "hot"})", ct), 400, "'temperature'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "temperature": 9})", ct), 400, "'temperature'");
  expect_error(c.Post("/v1/completions", R"({"prompt": [1, 99999]})", ct), 400, "vocabulary");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "n": 2})", ct), 400, "'n'");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": []})", ct), 400, "'messages'");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", ct), 400,
               "robot");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})", ct),
               400, "'tools'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "longctx": {"attn": "nosuchmethod"}})", ct), 400,
               "nosuchmethod");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "longctx": {"kv_press": "snapkv:ratio=7"}})", ct), 400,
               "ratio");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "longctx": {"color": "red"}})", ct), 400, "color");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "longctx": {"reader": "memagent"}})", ct), 400,
               "longctx.question");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "logit_bias": {"99999": 1}})", ct), 400, "vocabulary");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "logit_bias": {"5": 300}})", ct), 400, "[-100, 100]");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "logit_bias": {"five": 1}})", ct), 400, "'five'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "logit_bias": [[5]]})", ct), 400, "pairs");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "logit_bias": 5})", ct), 400, "'logit_bias'");
  expect_error(c.Post("/detokenize", R"({"tokens": [-5]})", ct), 400, "token id");
  expect_error(c.Get("/v1/nothing"), 404, "no endpoint");
  // A body over --max-body (a 20 MiB prompt), and a prompt beyond the KV budget.
  const std::string big = json{{"prompt", std::string(20 << 20, 'a')}}.dump();
  auto r = c.Post("/v1/completions", big, ct);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  expect_error(c.Post("/v1/completions", json{{"prompt", story(60, 0)}, {"max_tokens", 8}}.dump(), ct), 503,
               "MiB of KV cache");
  // Still serving.
  int status = 0;
  post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200);
}

// logit_bias against its definition on the model's own logits: banning the greedy first token
// gives the best of the others, and a bias of 100 makes one token every token.
TEST(Server, LogitBiasBansAndForcesTokens) {
  const std::string prompt = story(2, 0);
  const Tokenizer& tok = stories().tokenizer();
  ContextParams cp;
  cp.n_ctx = 512;
  cp.n_threads = 1;
  auto ctx = Context::create(stories(), cp);
  ASSERT_TRUE(ctx.has_value());
  ASSERT_TRUE((*ctx)->decode(tok.encode(prompt, true, true), Logits::kLast).is_ok());
  const float* l = (*ctx)->logits(0);
  const int32_t nv = tok.n_vocab();
  int32_t first = 0, second = -1;
  for (int32_t i = 1; i < nv; ++i)
    if (l[i] > l[first]) first = i;
  for (int32_t i = 0; i < nv; ++i)
    if (i != first && (second < 0 || l[i] > l[second])) second = i;

  TestServer srv;
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], tok.token_to_piece(first));
  r = post(c, "/v1/completions",
           {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logit_bias", {{std::to_string(first), false}}}},
           &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], tok.token_to_piece(second));
  // llama.cpp's array form, and -100 (OpenAI's ban) on the chat endpoint's sampler too.
  r = post(c, "/v1/completions",
           {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logit_bias", json::array({json::array({first, -100})})}},
           &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], tok.token_to_piece(second));
  // +100 on one token, sampled at temperature 1: the only token that comes (mid-text, each
  // token prints as its piece).
  const int32_t x = tok.encode(" dog", false, false).at(0);
  r = post(c, "/v1/completions",
           {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 1}, {"seed", 5}, {"logit_bias", {{std::to_string(x), 100}}}},
           &status);
  ASSERT_EQ(status, 200) << r.dump();
  std::string six;
  for (int i = 0; i < 6; ++i) six += tok.token_to_piece(x);
  EXPECT_EQ(r["choices"][0]["text"], six);
}

TEST(Server, ApiKeyIsRequiredWhenSet) {
  ServerParams hp;
  hp.api_key = "sesame";
  TestServer srv({}, hp);
  auto c = srv.client();
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json"), 401, "API key");
  c.set_bearer_token_auth("wrong");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json"), 401, "API key");
  c.set_bearer_token_auth("sesame");
  auto r = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  httplib::Client open("127.0.0.1", srv.port);
  auto h = open.Get("/health");  // the page and /health stay open
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
}

int idle_slots(const TestServer& srv) {
  int n = 0;
  for (const SlotInfo& s : srv.engine->slots()) n += s.state == "idle";
  return n;
}

// A client that goes away mid-stream cancels its request and frees its slot; a client that
// sends one byte a second holds a connection but not the server.
TEST(Server, DisconnectFreesTheSlotAndSlowClientsDoNotBlock) {
  EngineParams ep;
  ep.n_slots = 2;
  TestServer srv(ep);
  {
    auto c = srv.client();
    std::atomic<int> chunks{0};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", story(1, 0)}, {"max_tokens", 4000}, {"stream", true}, {"temperature", 0.8},
                    {"seed", 1}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 1; };
    auto r = c.send(req);
    EXPECT_EQ(chunks.load(), 1);
  }
  for (int i = 0; i < 600 && idle_slots(srv) < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(idle_slots(srv), 2);
  EXPECT_GE(srv.engine->metrics().requests_cancelled, 1);

  // One byte a second of a request's head, on a raw socket.
  std::atomic<bool> stop{false};
  std::thread slow([&] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(srv.port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
      for (size_t i = 0; i < head.size() && !stop; ++i) {
        if (send(fd, head.data() + i, 1, MSG_NOSIGNAL) != 1) break;
        for (int k = 0; k < 10 && !stop; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    close(fd);
  });
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/completions", {{"prompt", story(1, 3)}, {"max_tokens", 8}}, &status);
  EXPECT_EQ(status, 200) << r.dump();
  stop = true;
  slow.join();
}

// The memory the process holds: RSS; under AddressSanitizer the bytes the program has
// allocated and not freed (RSS there is the sanitizer's: freed memory waits in a quarantine and
// new shadow pages are touched as the heap moves, so it grows whatever the server does).
int64_t memory_held() {
#if defined(__SANITIZE_ADDRESS__)
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  return current_rss_bytes();
#endif
}

TEST(Server, MemoryStaysFlatOver1000Requests) {
  TestServer srv;
  auto c = srv.client();
  auto one = [&](int i) {
    int status = 0;
    post(c, i % 2 ? "/v1/completions" : "/v1/chat/completions",
         i % 2 ? json{{"prompt", story(1, i)}, {"max_tokens", 4}}
               : json{{"messages", {{{"role", "user"}, {"content", story(1, i)}}}}, {"max_tokens", 4}},
         &status);
    EXPECT_EQ(status, 200);
  };
  for (int i = 0; i < 300; ++i) one(i);
  const int64_t before = memory_held();
  for (int i = 300; i < 1000; ++i) one(i);
  const int64_t after = memory_held();
  EXPECT_LE(static_cast<double>(after), 1.05 * static_cast<double>(before))
      << "memory held: " << before / 1024 << " KiB after 300 requests, " << after / 1024 << " KiB after 1000";
}

}  // namespace
}  // namespace lc::server

namespace lc::server {
namespace {

// A sparse backend's read map: which parts of the sequence the last token read, per bin; for
// quest_fast (which always reads the current page) with a budget of 64 tokens over ~300, some
// bins are unread and the last one is read.
TEST(Server, ReadMapShowsWhatASparseBackendRead) {
  TestServer srv;
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/completions",
                {{"prompt", story(12, 0)},
                 {"max_tokens", 4},
                 {"longctx", {{"attn", "quest_fast:page=16,budget=64"}, {"read_map", true}}}},
                &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_TRUE(r.contains("longctx")) << r.dump();
  const auto map = r["longctx"]["read_map"].get<std::vector<float>>();
  ASSERT_EQ(map.size(), 64u);
  int unread = 0;
  for (float v : map) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
    unread += v == 0.0f;
  }
  EXPECT_GT(unread, 0);
  EXPECT_GT(map.back(), 0.0f);
  // Dense reads everything.
  r = post(c, "/v1/completions",
           {{"prompt", story(12, 0)}, {"max_tokens", 4}, {"longctx", {{"attn", "dense"}, {"read_map", true}}}});
  for (float v : r["longctx"]["read_map"].get<std::vector<float>>()) EXPECT_EQ(v, 1.0f);
}

// A reader runs through the server: the messages before the last user message are its
// document, the last one its question.
TEST(Server, ReaderRequestsRunTheReader) {
  TestServer srv;
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/chat/completions",
                {{"messages",
                  {{{"role", "user"}, {"content", story(30, 1)}}, {{"role", "user"}, {"content", "Who played?"}}}},
                 {"max_tokens", 8},
                 {"longctx", {{"reader", "memagent:chunk=128,memory=32,window=1024"}}}},
                &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int64_t>(), 300);  // every call's prompt, over the whole story
}

// What the reader answers alone, on its own thread with the library (no server, no gate).
std::string read_alone(const std::string& spec, const std::string& document, const std::string& question) {
  auto reader = readers::make_reader(spec);
  EXPECT_TRUE(reader.has_value());
  SessionParams p;
  p.ctx.n_ctx = 0;
  p.ctx.n_threads = 1;
  p.ctx.n_batch = 64;
  p.ctx.kv_block = 16;
  auto s = Session::create(stories(), p);
  EXPECT_TRUE(s.has_value());
  SamplerParams sp;
  sp.temp = 0;
  Sampler sm(sp);
  readers::SessionCaller caller(**s, sm, ChatTemplate::kNone);
  const std::string path = ::testing::TempDir() + "reader_alone_" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream out(path, std::ios::binary);
    out << document;
  }
  auto r = readers::read_document(**reader, caller, readers::TemplateSource(), path, question, readers::ReadOptions());
  std::filesystem::remove(path);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? r->answer : "";
}

// A reader's forward passes run on the engine's loop: its generated tokens as rows of the decode
// steps beside a generating chat, its prompts as chunks between them. The reader answers what it
// answers alone, the chat what it gets alone, and some steps held both (more rows than steps).
TEST(Server, ReaderPassesRunInTheBatchBesideAChat) {
  const std::string spec = "memagent:chunk=128,memory=32,window=1024";
  const std::string doc = story(30, 1), question = "Who played?";
  const std::string want_reader = read_alone(spec, doc, question);
  const std::string chat = story(1, 0);
  constexpr int kTokens = 600;
  const std::string want_chat = run_alone(chat, kTokens);
  TestServer srv;
  std::string got_chat;
  std::thread t([&] {
    auto c = srv.client();
    json r = post(c, "/v1/completions", {{"prompt", chat}, {"max_tokens", kTokens}, {"temperature", 0}});
    got_chat = r.value("choices", json::array({{{"text", "(error) " + r.dump()}}}))[0]["text"];
  });
  for (int spin = 0; spin < 20000 && srv.engine->metrics().batched_tokens < 8; ++spin)
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/completions",
                {{"prompt", doc}, {"max_tokens", 8}, {"temperature", 0}, {"longctx", {{"reader", spec}, {"question", question}}}},
                &status);
  const EngineMetrics during = srv.engine->metrics();
  t.join();
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want_reader);
  EXPECT_EQ(got_chat, want_chat);
  EXPECT_GT(during.reader_rows, 0);
  EXPECT_GT(during.reader_chunks, 0);
  EXPECT_GT(during.batched_tokens, during.batch_steps) << "no step held the chat's row and the reader's";
}

// An engine stopped while a reader waits on a forward pass ends: the reader's pass gets an error,
// its thread ends, and the request is answered with a 503.
TEST(Server, StoppingWhileAReaderWaitsEnds) {
  EngineParams ep;
  ep.defaults.ctx.n_threads = 2;
  ep.defaults.ctx.n_batch = 64;
  ep.defaults.ctx.kv_block = 16;
  ep.kv_budget = int64_t{256} << 20;
  auto e = Engine::create(stories(), ep);
  ASSERT_TRUE(e.has_value()) << e.error().message;
  JobSpec js;
  js.document = story(400, 2);
  js.question = "Who?";
  js.methods.reader = "memagent:chunk=128,memory=32,window=1024";
  js.gen.n_predict = 8;
  js.sampling.temp = 0;
  ApiError err;
  auto job = (*e)->submit(js, now_seconds() + 600, err);
  ASSERT_TRUE(job) << err.message;
  for (int spin = 0; spin < 40000 && (*e)->metrics().reader_chunks < 2; ++spin)
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  EXPECT_GE((*e)->metrics().reader_chunks, 2);
  e->reset();  // the loop ends while the reader runs
  std::vector<JobEvent> ev;
  EXPECT_TRUE(job->wait(ev, 0));
  ASSERT_TRUE(job->error().has_value());
  EXPECT_EQ(job->error()->status, 503) << job->error()->message;
}

// SJF takes the shortest prompt first, and aging lets a long one that waited go first.
TEST(Scheduler, FcfsAndSjfWithAging) {
  auto fcfs = make_scheduler("fcfs");
  auto sjf = make_scheduler("sjf", 100.0);
  ASSERT_TRUE(fcfs.has_value() && sjf.has_value());
  EXPECT_FALSE(make_scheduler("lifo").has_value());
  std::deque<std::shared_ptr<Job>> q;
  auto job = [](uint64_t id, size_t n, double t) {
    JobSpec s;
    s.prompt.assign(n, 1);
    auto j = std::make_shared<Job>(id, s, 1e9);
    j->t_submit = t;
    return j;
  };
  q.push_back(job(1, 1000, 10.0));
  q.push_back(job(2, 50, 10.0));
  q.push_back(job(3, 10, 10.0));
  EXPECT_EQ((*fcfs)->pick(q, 10.0), 0u);
  EXPECT_EQ((*sjf)->pick(q, 10.0), 2u);
  q[0]->t_submit = 0.0;  // waited 10 s: 1000 - 100 * 10 = 0 < 10
  EXPECT_EQ((*sjf)->pick(q, 10.0), 0u);
}

}  // namespace
}  // namespace lc::server

namespace lc::server {
namespace {

// A prompt whose prefix another slot holds (here, a slot busy generating) takes that slot's
// full KV blocks by reference: the answer equals what the request gets alone, cache_n counts
// the shared tokens, and /metrics shows the shared blocks.
TEST(Server, SlotsShareTheBlocksOfACommonPrefix) {
  EngineParams ep;
  ep.n_slots = 2;
  TestServer srv(ep);
  const std::string prefix = story(6, 4);
  const std::string a = prefix + "Tom said hello.", b = prefix + "Sue ran home.";
  std::atomic<bool> a_started{false};
  std::thread ta([&] {
    auto c = srv.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", a}, {"max_tokens", 400}, {"stream", true}, {"temperature", 0}, {"ignore_eos", true}}
                   .dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      a_started = true;
      return true;
    };
    c.send(req);
  });
  for (int i = 0; i < 2000 && !a_started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(a_started.load());
  auto c = srv.client();
  int status = 0;
  json r = post(c, "/v1/completions", {{"prompt", b}, {"max_tokens", 16}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const auto ta_tokens = stories().tokenizer().encode(a, true, true);
  const auto tb_tokens = stories().tokenizer().encode(b, true, true);
  size_t common = 0;
  while (common < ta_tokens.size() && common < tb_tokens.size() && ta_tokens[common] == tb_tokens[common]) ++common;
  EXPECT_EQ(r["timings"]["cache_n"].get<int64_t>(), static_cast<int64_t>(common / 16 * 16));  // kv_block 16
  EXPECT_EQ(r["choices"][0]["text"], run_alone(b, 16));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("longctx_prefix_shared_tokens_total " + std::to_string(common / 16 * 16)), std::string::npos)
      << m->body;
  ta.join();
}

}  // namespace
}  // namespace lc::server
