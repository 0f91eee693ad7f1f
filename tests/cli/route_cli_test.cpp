// `longctx route` over real `longctx serve` backends on loopback: every policy routes every
// request exactly once and answers what the backend answers; a dead backend's requests go to
// another; bad flags and bodies get clear errors.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_cli.h"

extern char** environ;

namespace lc_cli {
namespace {

using nlohmann::json;

// A longctx process whose stdout goes to a file; the port it prints.
struct Proc {
  pid_t pid = 0;
  int port = 0;
  ~Proc() { stop(SIGTERM); }
  void stop(int sig) {
    if (pid > 0) {
      kill(pid, sig);
      int st = 0;
      waitpid(pid, &st, 0);
      pid = 0;
    }
  }
};

void start(Proc& p, const std::string& args, const std::string& marker, const std::string& name) {
  const std::string out = ::testing::TempDir() + "/route_" + name + ".out";
  std::remove(out.c_str());  // not an earlier run's port
  const std::string cmd = "exec " + kBin + " " + args + " > " + out + " 2> " + out + ".err";
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&p.pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  for (int i = 0; i < 600 && p.port == 0; ++i) {
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    if (const auto at = s.find(marker); at != std::string::npos && s.find('\n', at) != std::string::npos)
      p.port = std::stoi(s.substr(at + marker.size()));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(p.port, 0) << name << " did not start";
}

std::string completion(int port, const std::string& prompt, bool stream, int* status = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (status) *status = r ? r->status : -1;
  if (!r || r->status != 200) return "<error " + std::to_string(r ? r->status : -1) + ">";
  if (!stream) return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  std::string text;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("data: {", 0) == 0) {
      const json j = json::parse(line.substr(6));
      if (j.contains("error")) return "<error event>";
      text += j["choices"][0].value("text", "");
    }
  return text;
}

json stats(int port) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/router/stats");
  return r && r->status == 200 ? json::parse(r->body) : json();
}

const char* kPrompt = "Once upon a time there was a";

TEST(Route, EveryPolicyRoutesEachRequestOnceAndAnswersAsTheBackend) {
  Proc b1, b2;
  start(b1, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "b1");
  start(b2, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "b2");
  const std::string want = completion(b1.port, kPrompt, false);
  ASSERT_EQ(want.find("<error"), std::string::npos);
  for (const char* policy : {"rr", "least", "cqb"}) {
    Proc r;
    start(r, fmt::format("route --port 0 --policy {} --max-inflight 2 --backend http://127.0.0.1:{} --backend "
                         "http://127.0.0.1:{}", policy, b1.port, b2.port),
          "routing on http://127.0.0.1:", std::string("router_") + policy);
    std::vector<std::string> got(12);
    std::vector<std::thread> th;
    for (int c = 0; c < 4; ++c)
      th.emplace_back([&, c] {
        for (int i = 0; i < 3; ++i) got[static_cast<size_t>(c * 3 + i)] = completion(r.port, kPrompt, i == 2);
      });
    for (auto& t : th) t.join();
    for (const std::string& g : got) EXPECT_EQ(g, want) << policy;
    const json st = stats(r.port);
    ASSERT_TRUE(st.is_object()) << policy;
    int64_t routed = 0, completed = 0, failed = 0;
    for (const json& b : st["backends"]) {
      routed += b["routed"].get<int64_t>();
      completed += b["completed"].get<int64_t>();
      failed += b["failed"].get<int64_t>();
      if (std::string(policy) == "rr") {
        EXPECT_GE(b["routed"].get<int64_t>(), 1) << "round-robin skipped a backend";
      }
    }
    EXPECT_EQ(st["requests"].get<int64_t>(), 12) << policy;
    EXPECT_EQ(routed, 12) << policy;
    EXPECT_EQ(completed, 12) << policy;
    EXPECT_EQ(failed, 0) << policy;
    // A non-streamed answer names the backend that gave it.
    httplib::Client c("127.0.0.1", r.port);
    auto one = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(one) << policy;
    const std::string via = one->get_header_value("X-Longctx-Backend");
    EXPECT_TRUE(via == fmt::format("http://127.0.0.1:{}", b1.port) || via == fmt::format("http://127.0.0.1:{}", b2.port))
        << policy << ": '" << via << "'";
  }
}

TEST(Route, ADeadBackendsRequestsAreAnsweredByAnother) {
  Proc b1, b2;
  start(b1, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "d1");
  start(b2, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "d2");
  const std::string want = completion(b1.port, kPrompt, false);
  Proc r;
  start(r, fmt::format("route --port 0 --policy rr --backend http://127.0.0.1:{} --backend http://127.0.0.1:{}",
                       b1.port, b2.port),
        "routing on http://127.0.0.1:", "router_dead");
  b2.stop(SIGKILL);
  for (int i = 0; i < 6; ++i) {
    int status = 0;
    EXPECT_EQ(completion(r.port, kPrompt, i % 2 == 1, &status), want) << i;
    EXPECT_EQ(status, 200);
  }
  const json st = stats(r.port);
  EXPECT_EQ(st["backends"][0]["completed"].get<int64_t>(), 6);
  EXPECT_GE(st["backends"][1]["failed"].get<int64_t>(), 1);
  EXPECT_EQ(st["backends"][1]["completed"].get<int64_t>(), 0);
  // With every backend gone, a request gets an error, not silence.
  b1.stop(SIGKILL);
  int status = 0;
  completion(r.port, kPrompt, false, &status);
  EXPECT_EQ(status, 502);
  EXPECT_EQ(completion(r.port, kPrompt, true), "<error event>");
}

// A backend killed while it works on a request: the router retries the request on the other one,
// and the client gets the other's answer.
TEST(Route, ABackendKilledMidRequestHasItsRequestRetried) {
  Proc b1, b2;
  start(b1, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "m1");
  start(b2, "serve --port 0 -np 2 -t 1", "listening on http://127.0.0.1:", "m2");
  std::string doc;
  for (int i = 0; i < 1500; ++i) doc += fmt::format("The river ran past the old mill number {}. ", i);
  doc += "Where is the mill?";
  const std::string want = completion(b1.port, doc, false);
  ASSERT_EQ(want.find("<error"), std::string::npos);
  Proc r;  // round-robin: the first request goes to the first backend, b2
  start(r, fmt::format("route --port 0 --policy rr --backend http://127.0.0.1:{} --backend http://127.0.0.1:{}",
                       b2.port, b1.port),
        "routing on http://127.0.0.1:", "router_mid");
  int status = 0;
  std::string got;
  std::thread client([&] { got = completion(r.port, doc, false, &status); });
  // Kill b2 once it is busy with the request.
  httplib::Client probe("127.0.0.1", b2.port);
  bool busy = false;
  for (int i = 0; i < 600 && !busy; ++i) {
    auto h = probe.Get("/health");
    busy = h && h->status == 200 && json::parse(h->body).value("slots_processing", 0) > 0;
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(busy) << "the request never reached the first backend";
  b2.stop(SIGKILL);
  client.join();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(got, want);
  const json st = stats(r.port);
  EXPECT_EQ(st["backends"][0]["failed"].get<int64_t>(), 1);
  EXPECT_EQ(st["backends"][1]["completed"].get<int64_t>(), 1);
}

TEST(Route, ClearErrors) {
  Result res = run("route --port 0");
  EXPECT_NE(res.code, 0);
  EXPECT_NE(res.out.find("--backend"), std::string::npos) << res.out;
  res = run("route --port 0 --backend https://example.org:1");
  EXPECT_EQ(res.code, 1);
  EXPECT_NE(res.out.find("only http://"), std::string::npos) << res.out;
  res = run("route --port 0 --backend http://127.0.0.1:8081 --policy fifo");
  EXPECT_EQ(res.code, 1);
  EXPECT_NE(res.out.find("unknown policy 'fifo'"), std::string::npos) << res.out;
  Proc r;
  start(r, "route --port 0 --backend http://127.0.0.1:9", "routing on http://127.0.0.1:", "router_err");
  httplib::Client c("127.0.0.1", r.port);
  auto bad = c.Post("/v1/completions", "not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace lc_cli
