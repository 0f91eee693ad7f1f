#include "server/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/log.h"
#include "core/sys.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "readers/templates.h"
#include "runtime/qttt.h"

#include <nlohmann/json.hpp>

namespace lc::server {

namespace {
constexpr int kReadMapBins = 64;
double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
}  // namespace

// ---- Job ----

bool Job::wait(std::vector<JobEvent>& out, double timeout_s) {
  std::unique_lock<std::mutex> lk(m_);
  cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_ || !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return done_;
}

void Job::push(JobEvent e) {
  {
    std::lock_guard<std::mutex> lk(m_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void Job::finish(const RequestStats& st, std::optional<ApiError> err, std::vector<float> read_map) {
  {
    std::lock_guard<std::mutex> lk(m_);
    stats_ = st;
    error_ = std::move(err);
    read_map_ = std::move(read_map);
    done_ = true;
  }
  cv_.notify_all();
}

std::vector<float> Job::read_map() const {
  std::lock_guard<std::mutex> lk(m_);
  return read_map_;
}

// ---- schedulers ----

namespace {

class Fcfs final : public Scheduler {
 public:
  std::string name() const override { return "fcfs"; }
  size_t pick(const std::deque<std::shared_ptr<Job>>&, double) const override { return 0; }
};

class Sjf final : public Scheduler {
 public:
  explicit Sjf(double aging) : aging_(aging) {}
  std::string name() const override { return "sjf"; }
  size_t pick(const std::deque<std::shared_ptr<Job>>& q, double now) const override {
    size_t best = 0;
    double best_key = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      const double len = static_cast<double>(q[i]->spec().prompt.size() + q[i]->spec().document.size() / 4);
      const double key = len - aging_ * (now - q[i]->t_submit);
      if (i == 0 || key < best_key) {
        best = i;
        best_key = key;
      }
    }
    return best;
  }

 private:
  double aging_;
};

}  // namespace

Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, double aging) {
  if (name == "fcfs") return std::unique_ptr<Scheduler>(new Fcfs());
  if (name == "sjf") return std::unique_ptr<Scheduler>(new Sjf(aging));
  return make_error(ErrorCode::kInvalidArgument, fmt::format("--schedule: unknown policy '{}' (fcfs, sjf)", name));
}

// ---- slots ----

struct Engine::Slot {
  int id = 0;
  std::unique_ptr<Session> session;
  std::string key;   // the methods the session was made with
  size_t cap = 0;    // its cache's budget: what the request in it reserved
  std::shared_ptr<Job> job;
  JobPhase phase = JobPhase::kDone;  // kDone: idle
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Generation> gen;
  RequestStats st;
  size_t logprobs_sent = 0;
  bool timed_out = false;
  double prefill_tok_s = 0;  // seconds per prompt token of its last prefill step
  double chunk_s = 0;        // seconds its last prefill chunk added to a step where others generated
  // A reader's run: its own thread and Sessions, whose forward passes come to the loop through
  // the gate.
  std::thread reader;
  std::atomic<bool> reader_done{false};
  std::optional<ApiError> reader_err;
  std::unique_ptr<ReaderGate> gate;
};

// One forward pass a reader's thread waits on: a generated token (a row of the next decode step)
// or the next chunk of a pending decode call (run like a slot's prefill chunk).
struct Engine::GatePass {
  enum Kind { kToken, kChunk };
  Kind kind = kToken;
  Context* ctx = nullptr;
  int32_t id = 0;
  int64_t max_tokens = 0;
  bool done = false;
  Status st = ok_status();
  Expected<bool> chunk{false};
};

// The StepGate of a reading slot's Sessions. The reader's thread posts one pass at a time and
// waits; the engine's loop runs it and answers (gate_done). All state is under the engine's mu_.
class Engine::ReaderGate final : public StepGate {
 public:
  explicit ReaderGate(Engine& e) : e_(e) {}
  Status decode_token(Context& ctx, int32_t id) override {
    GatePass p;
    p.kind = GatePass::kToken;
    p.ctx = &ctx;
    p.id = id;
    post(p);
    return p.st;
  }
  Expected<bool> prefill_chunk(Context& ctx, int64_t max_tokens) override {
    GatePass p;
    p.kind = GatePass::kChunk;
    p.ctx = &ctx;
    p.max_tokens = max_tokens;
    post(p);
    if (!p.st) return p.st.error();
    return std::move(p.chunk);
  }
  // Opens the gate for a new reader (under mu_).
  void open() { closed_ = false; }
  // Answers a waiting pass with an error and refuses later ones (under mu_): the loop is ending.
  void close() {
    closed_ = true;
    if (pending_) {
      pending_->st = make_error(ErrorCode::kCancelled, "the server is shutting down");
      pending_->done = true;
      pending_ = nullptr;
      done_cv_.notify_all();
    }
  }
  GatePass* pending() const { return pending_; }  // under mu_
  void answer(GatePass& p) {                      // under mu_
    p.done = true;
    if (pending_ == &p) pending_ = nullptr;
    done_cv_.notify_all();
  }

 private:
  void post(GatePass& p) {
    std::unique_lock<std::mutex> lk(e_.mu_);
    if (closed_) {
      p.st = make_error(ErrorCode::kCancelled, "the server is shutting down");
      return;
    }
    pending_ = &p;
    e_.cv_.notify_all();
    done_cv_.wait(lk, [&] { return p.done; });
  }
  Engine& e_;
  GatePass* pending_ = nullptr;
  bool closed_ = false;
  std::condition_variable done_cv_;
};

namespace {

std::string methods_key(const Methods& m) {
  return m.rope + "|" + m.attn + "|" + m.kv_press + "|" + m.qttt;
}

ApiError api_error(const Error& e) {
  switch (e.code) {
    case ErrorCode::kContextFull: return {503, e.message, "server_error"};
    case ErrorCode::kCancelled: return {499, e.message, "cancelled"};
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
    case ErrorCode::kTooShort: return {400, e.message, "invalid_request_error"};
    default: return {500, e.message, "server_error"};
  }
}

}  // namespace

Engine::Engine(const Model& model, const EngineParams& p) : model_(model), p_(p) {}

Expected<std::unique_ptr<Engine>> Engine::create(const Model& model, const EngineParams& p) {
  if (p.n_slots < 1 || p.n_slots > 256)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("-np: {} slots is not in 1..256", p.n_slots));
  auto e = std::unique_ptr<Engine>(new Engine(model, p));
  LC_ASSIGN_OR_RETURN(e->sched_, make_scheduler(p.schedule));
  if (!p.slot_save_path.empty() && !std::filesystem::is_directory(p.slot_save_path))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--slot-save-path: {} is not a folder", p.slot_save_path));
  // The server's own methods must work: a session made with them tells the bytes per token.
  SessionParams probe = p.defaults;
  probe.ctx.n_ctx = 16;
  probe.ctx.kv_budget = 0;
  probe.ctx.kv_spill.clear();
  LC_ASSIGN_OR_RETURN(auto s, Session::create(model, probe));
  e->bytes_per_token_ = s->context().kv().memory().bytes_per_token;
  const size_t block_bytes = s->context().kv().pool().block_bytes();
  e->block_tokens_ = p.defaults.ctx.kv_block;
  if (p.kv_budget > 0) {
    e->budget_ = static_cast<size_t>(p.kv_budget);
  } else {
    const int64_t avail = available_memory_bytes();
    e->budget_ = avail > 0 ? static_cast<size_t>(avail / 4 * 3) : size_t{8} << 30;
  }
  e->m_.kv_budget_bytes = e->budget_;
  {
    // One block pool for every slot: the budget holds for all of them at once, and slots share
    // the full blocks of a common prefix.
    LC_ASSIGN_OR_RETURN(auto pool, BlockPool::create(block_bytes, static_cast<int64_t>(e->budget_),
                                                      p.defaults.ctx.kv_spill));
    e->kv_pool_ = std::shared_ptr<BlockPool>(std::move(pool));
  }
  e->pool_ = std::make_unique<ThreadPool>(p.defaults.ctx.n_threads > 0 ? p.defaults.ctx.n_threads
                                                                       : default_thread_count());
  for (int i = 0; i < p.n_slots; ++i) {
    auto sl = std::make_unique<Slot>();
    sl->id = i;
    e->slots_.push_back(std::move(sl));
  }
  e->thread_ = std::thread([eng = e.get()] { eng->loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    for (auto& j : queue_) j->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t Engine::reservation(int64_t tokens) const {
  // Whole blocks per (layer, KV head), one more for the block being filled.
  const int64_t bt = std::max<int64_t>(block_tokens_, 1);
  const int64_t blocks = (tokens + bt - 1) / bt + 1;
  return static_cast<size_t>(blocks * bt) * bytes_per_token_;
}

Expected<SessionParams> Engine::session_params(const Methods& m) const {
  SessionParams sp = p_.defaults;
  if (!m.rope.empty()) sp.ctx.rope = m.rope;
  if (!m.attn.empty()) sp.ctx.attn = m.attn;
  if (!m.kv_press.empty()) sp.ctx.kv_press = m.kv_press == "none" ? "" : m.kv_press;
  if (!m.qttt.empty()) {
    LC_ASSIGN_OR_RETURN(sp.qttt, parse_qttt(m.qttt));
  }
  return sp;
}

std::shared_ptr<Job> Engine::submit(JobSpec spec, double deadline, ApiError& err) {
  const bool reader = !spec.methods.reader.empty();
  if (reader) {
    auto r = readers::make_reader(spec.methods.reader);
    if (!r) {
      err = {400, "longctx.reader: " + r.error().message};
      return nullptr;
    }
    if (spec.document.empty() || spec.question.empty()) {
      err = {400, "longctx.reader needs a document and a question: the last user message is the question and the "
                  "messages before it the document (completions: the prompt, and longctx.question)"};
      return nullptr;
    }
  } else if (spec.prompt.empty()) {
    err = {400, "the prompt is empty"};
    return nullptr;
  }
  if (Status s = validate(spec.sampling); !s) {
    err = {400, s.message()};
    return nullptr;
  }
  auto sp = session_params(spec.methods);
  if (!sp) {
    err = {400, sp.error().message};
    return nullptr;
  }
  if (!spec.methods.rope.empty() || !spec.methods.attn.empty() || !spec.methods.kv_press.empty() ||
      !spec.methods.qttt.empty()) {
    // The same checks and messages as the command line's: a small session with these methods.
    SessionParams probe = *sp;
    probe.ctx.n_ctx = 64;
    probe.ctx.n_batch = 16;
    probe.ctx.kv_budget = 0;
    probe.ctx.kv_spill.clear();
    probe.ctx.n_threads = 1;
    auto s = Session::create(model_, probe);
    if (!s) {
      err = {400, s.error().message};  // the request's methods are at fault, whatever the code
      return nullptr;
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(spec.prompt.size());
  if (!reader && p_.max_prompt > 0 && n_prompt > p_.max_prompt) {
    err = {400, fmt::format("the prompt has {} tokens; this server takes at most {} (--max-prompt)", n_prompt,
                            p_.max_prompt)};
    return nullptr;
  }
  const int64_t window = std::max<int64_t>(model_.hparams().n_ctx_train, 4096);
  const size_t need = reader ? reservation(window + spec.gen.n_predict) : reservation(n_prompt + spec.gen.n_predict);
  if (need > budget_ && p_.defaults.ctx.kv_spill.empty()) {
    err = {503,
           fmt::format("the request needs {:.1f} MiB of KV cache ({} prompt tokens + {} max_tokens at {} bytes per "
                       "token); the server's KV budget is {:.1f} MiB (--kv-budget)",
                       mib(need), n_prompt, spec.gen.n_predict, bytes_per_token_, mib(budget_)),
           "server_error"};
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (queue_.size() >= p_.max_queue) {
    err = {429, fmt::format("the queue is full ({} requests waiting); try again later", queue_.size()),
           "rate_limit_error"};
    return nullptr;
  }
  auto job = std::make_shared<Job>(next_id_++, std::move(spec), deadline);
  job->t_submit = now_seconds();
  queue_.push_back(job);
  m_.queued = static_cast<int64_t>(queue_.size());
  cv_.notify_all();
  return job;
}

bool Engine::admit() {
  if (queue_.empty()) return false;
  std::vector<Slot*> idle;
  for (auto& s : slots_)
    if (!s->job) idle.push_back(s.get());
  if (idle.empty()) return false;
  const double now = now_seconds();
  const size_t qi = sched_->pick(queue_, now);
  std::shared_ptr<Job> job = queue_[qi];
  const JobSpec& spec = job->spec();
  const bool reader = !spec.methods.reader.empty();
  const int64_t window = std::max<int64_t>(model_.hparams().n_ctx_train, 4096);
  size_t need = reader ? reservation(window + spec.gen.n_predict)
                       : reservation(static_cast<int64_t>(spec.prompt.size()) + spec.gen.n_predict);
  if (!p_.defaults.ctx.kv_spill.empty()) need = std::min(need, budget_);  // beyond it, blocks spill
  const std::string key = methods_key(spec.methods);
  // The idle slot with these methods whose cache shares the longest prefix with the prompt;
  // else an idle slot without a cache, else the idle slot with the smallest one.
  Slot* best = nullptr;
  size_t best_common = 0;
  if (!reader)
    for (Slot* s : idle) {
      if (!s->session || s->key != key) continue;
      const auto& h = s->session->history();
      size_t c = 0;
      while (c < h.size() && c < spec.prompt.size() && h[c] == spec.prompt[c]) ++c;
      if (!best || c > best_common) {
        best = s;
        best_common = c;
      }
    }
  if (best && best_common == 0) best = nullptr;
  if (!best)
    for (Slot* s : idle)
      if (!best || (s->session == nullptr) > (best->session == nullptr) ||
          ((s->session == nullptr) == (best->session == nullptr) && s->cap < best->cap))
        best = s;
  size_t others = 0;
  for (auto& s : slots_)
    if (s.get() != best) others += s->cap;
  const size_t want = std::max(need, best->session && best->key == key && !reader ? best->cap : 0);
  if (others + want > budget_) {
    // Drop idle slots' caches, largest first, until the request fits.
    std::vector<Slot*> victims;
    for (Slot* s : idle)
      if (s != best && s->cap > 0) victims.push_back(s);
    std::sort(victims.begin(), victims.end(), [](Slot* a, Slot* b) { return a->cap > b->cap; });
    for (Slot* v : victims) {
      if (others + want <= budget_) break;
      others -= v->cap;
      v->session.reset();
      v->cap = 0;
      v->key.clear();
    }
    if (others + want > budget_) return false;  // wait for active requests to finish
  }
  if (!(best->session && best->key == key && best->cap >= need && !reader)) {
    best->session.reset();
    best->key = key;
    best->cap = need;
  }
  best->job = job;
  best->phase = reader ? JobPhase::kReading : JobPhase::kPrefill;
  job->set_slot(best->id);
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(qi));
  return true;
}

void Engine::start(Slot& s) {
  const JobSpec& spec = s.job->spec();
  s.st = RequestStats{};
  s.logprobs_sent = 0;
  s.timed_out = false;
  s.prefill_tok_s = 0;
  s.chunk_s = 0;
  s.gen.reset();
  if (!spec.methods.reader.empty()) {
    s.reader_done = false;
    s.reader_err.reset();
    if (!s.gate) s.gate = std::make_unique<ReaderGate>(*this);
    {
      std::lock_guard<std::mutex> lk(mu_);
      s.gate->open();
    }
    s.reader = std::thread([this, &s] { run_reader(s); });
    return;
  }
  auto sp = session_params(spec.methods);
  if (!sp) return finish(s, api_error(sp.error()));
  if (!s.session) {
    sp->ctx.n_ctx = 0;  // grows with the request, within its reservation
    sp->ctx.kv_budget = 0;  // the shared pool's budget holds (the reservations keep within it)
    sp->ctx.pool = pool_.get();
    sp->ctx.kv_pool = kv_pool_;
    auto made = Session::create(model_, *sp);
    if (!made) return finish(s, api_error(made.error()));
    s.session = std::move(*made);
  }
  // Another slot's cache (busy or idle) that holds a longer prefix of the prompt than this
  // slot's own: its full blocks are shared, not recomputed.
  if (s.session->check_multi_turn().is_ok()) {
    auto common = [&](const std::vector<int32_t>& t) {
      size_t c = 0;
      while (c < t.size() && c < spec.prompt.size() && t[c] == spec.prompt[c]) ++c;
      return static_cast<int64_t>(c);
    };
    const int64_t own = common(s.session->context().tokens());
    Slot* from = nullptr;
    int64_t best = own;
    for (auto& o : slots_) {
      if (o.get() == &s || !o->session || o->key != s.key) continue;
      const int64_t c = common(o->session->context().tokens());
      if (c > best) {
        best = c;
        from = o.get();
      }
    }
    // Worth it from one block beyond what the slot holds; the last prompt token is always
    // evaluated (its logits start the answer).
    best = std::min<int64_t>(best, static_cast<int64_t>(spec.prompt.size()) - 1);
    if (from && best / block_tokens_ > own / block_tokens_) {
      auto took = s.session->adopt_prefix(*from->session, best);
      if (took) {
        std::lock_guard<std::mutex> lk(mu_);
        m_.prefix_shared_tokens += *took;
      } else {
        LC_LOG_INFO("serve: slot {} could not share slot {}'s prefix: {}", s.id, from->id, took.error().message);
      }
    }
  }
  s.sampler = std::make_unique<Sampler>(spec.sampling);
  s.session->context().set_answer_tokens(spec.gen.n_predict);  // SpecKV's lookahead=answer
  Status st = s.session->check_multi_turn().is_ok()
                  ? s.session->begin_continue(spec.prompt)
                  : s.session->begin_run(Prompt{spec.prompt, spec.n_context}, spec.sampling.seed);
  if (!st) return finish(s, api_error(st.error()));
  s.phase = JobPhase::kPrefill;
}

bool Engine::step_prefill(DecodeRows& rows) {
  const size_t n = slots_.size();
  const bool others = !rows.ctxs.empty();
  // While other requests generate, prefill chunks add about prefill_share of their decode
  // step's time on average, so that a long document does not stall them. Each step earns that
  // share as credit; a chunk runs when the credit covers what this slot's last chunk took, and
  // spends what it takes. A chunk has a cost per call besides its cost per token (a deep
  // document's attention reads its whole window's K/V at every call), so a slow chunk runs
  // every few steps rather than shrinking to nothing.
  if (others) {
    prefill_credit_s_ = std::min(prefill_credit_s_ + p_.prefill_share * decode_step_s_, 1.0);
  } else {
    prefill_credit_s_ = 0;
  }
  for (size_t k = 0; k < n; ++k) {
    Slot& s = *slots_[(prefill_rr_ + k) % n];
    // A slot's prompt, or the chunk a reader's thread waits on (one of its Sessions' calls).
    GatePass* gp = gate_pass(s, GatePass::kChunk);
    if (!s.job || (s.phase != JobPhase::kPrefill && !gp)) continue;
    Context& ctx = gp ? *gp->ctx : s.session->context();
    const bool paced = others && ctx.press() == nullptr;
    if (paced && s.chunk_s > 0 && prefill_credit_s_ < s.chunk_s) continue;  // not this step
    prefill_rr_ = (prefill_rr_ + k + 1) % n;
    // The chunk is sized from the slot's last cost per token (at least 16 tokens, so that the
    // cost per call is shared; exact for methods without a press; a press keeps its chunking).
    int64_t cap = 0;
    if (paced) {
      cap = s.prefill_tok_s > 0 && decode_step_s_ > 0
                ? std::clamp<int64_t>(static_cast<int64_t>(p_.prefill_share * decode_step_s_ / s.prefill_tok_s),
                                      std::min<int64_t>(16, ctx.n_batch()), ctx.n_batch())
                : 16;
    }
    // The chunk runs inside the rows' forward pass (one pass over the weights for both) when
    // it can; `ran` says whether the rows went with it (not for qTTT's training, a fallback
    // inside decode_mixed still runs them).
    bool ran = false, merged = false;
    std::vector<Status> row_st;
    Session::ChunkStep step;
    // A merged step's time is the rows' and the chunk's together: the rows' own decode step is
    // measured alone first, again when their number changes, and every 64 merged steps (their
    // depth grows), so that the chunk's share stays what --prefill-share asks.
    const bool measured = decode_step_s_ > 0 && decode_step_rows_ == rows.ctxs.size() && merged_since_measure_ < 64;
    if (others && p_.merge_prefill && measured) {
      step = [&](Context& c, int64_t max_tokens) -> Expected<bool> {
        Context::MixedResult r = Context::decode_mixed(rows.ctxs, rows.toks, c, max_tokens);
        row_st = std::move(r.rows);
        ran = true;
        merged = r.merged;
        return std::move(r.prefill);
      };
    }
    const int64_t before = ctx.n_past();
    const double t0 = now_seconds();
    Expected<bool> done = false;
    if (gp) {
      const int64_t m = gp->max_tokens > 0 && cap > 0 ? std::min(gp->max_tokens, cap) : std::max(gp->max_tokens, cap);
      done = step ? step(ctx, m) : ctx.decode_step(m);
    } else {
      done = s.session->prefill_step(cap, step);
    }
    const double t = now_seconds() - t0;
    const int64_t did = ctx.n_past() - before;
    if (ran) {
      if (merged) {
        ++merged_since_measure_;
        std::lock_guard<std::mutex> lk(mu_);
        m_.merged_prefill_chunks += 1;
      }
      rows_done(rows, row_st, -1);  // the step's time is not a decode step's
    }
    // Seconds per prompt token; in a merged pass, beyond what the rows alone took.
    const double own = ran && decode_step_s_ > 0 && t > decode_step_s_ ? t - decode_step_s_ : t;
    if (did > 0) s.prefill_tok_s = own / static_cast<double>(did);
    if (paced) {
      s.chunk_s = own;
      prefill_credit_s_ -= own;
    }
    if (gp) {
      gate_done(s, *gp, ok_status(), std::move(done));
      return ran;
    }
    if (!done) {
      finish(s, api_error(done.error()));
      return ran;
    }
    if (!*done) return ran;
    s.st = s.session->prefill_stats();
    s.phase = JobPhase::kGenerating;
    if (s.job->spec().methods.read_map) s.session->context().attention().record_selection(true);
    Slot* sp = &s;
    s.gen = std::make_unique<Generation>(
        *s.session, *s.sampler, s.job->spec().gen,
        [sp](int32_t, std::string_view text) {
          JobEvent e;
          e.text = std::string(text);
          if (sp->logprobs_sent < sp->st.logprobs.size()) {
            e.logprobs.assign(sp->st.logprobs.begin() + static_cast<std::ptrdiff_t>(sp->logprobs_sent),
                              sp->st.logprobs.end());
            sp->logprobs_sent = sp->st.logprobs.size();
          }
          sp->job->push(std::move(e));
          return !sp->job->cancelled();
        },
        s.st);
    return ran;
  }
  return false;
}

Engine::DecodeRows Engine::collect_rows() {
  DecodeRows rows;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.job || s.phase != JobPhase::kGenerating) continue;
    auto next = s.gen->next();
    if (!next) {
      s.gen->finish();
      finish(s, api_error(next.error()));
      continue;
    }
    if (!*next) {
      s.gen->finish();
      // An answer the client's cancel (or the deadline) ended is not a success.
      const bool stopped = s.st.stop == StopReason::kCancelled || s.st.stop == StopReason::kCallback;
      finish(s, stopped && s.job->cancelled() ? std::optional<ApiError>(ApiError{499, "cancelled", "cancelled"})
                                              : std::nullopt);
      continue;
    }
    rows.ctxs.push_back(&s.session->context());
    rows.toks.push_back(**next);
    rows.who.push_back(&s);
    rows.pass.push_back(nullptr);
  }
  // Readers' generated tokens join the step after the slots' rows.
  for (auto& sp : slots_)
    if (GatePass* p = gate_pass(*sp, GatePass::kToken)) {
      rows.ctxs.push_back(p->ctx);
      rows.toks.push_back(p->id);
      rows.who.push_back(sp.get());
      rows.pass.push_back(p);
    }
  return rows;
}

Engine::GatePass* Engine::gate_pass(Slot& s, int kind) {
  if (!s.job || s.phase != JobPhase::kReading || !s.gate) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  GatePass* p = s.gate->pending();
  return p && p->kind == kind ? p : nullptr;
}

void Engine::gate_done(Slot& s, GatePass& p, Status st, Expected<bool> chunk) {
  std::lock_guard<std::mutex> lk(mu_);
  (p.kind == GatePass::kToken ? m_.reader_rows : m_.reader_chunks) += 1;
  p.st = std::move(st);
  p.chunk = std::move(chunk);
  s.gate->answer(p);
}

void Engine::step_decode(DecodeRows& rows) {
  if (rows.ctxs.empty()) return;
  const double t0 = now_seconds();
  const std::vector<Status> st = Context::decode_batch(rows.ctxs, rows.toks);
  rows_done(rows, st, now_seconds() - t0);
}

void Engine::rows_done(DecodeRows& rows, const std::vector<Status>& st, double seconds) {
  if (seconds >= 0) {
    decode_step_s_ = seconds;
    decode_step_rows_ = rows.ctxs.size();
    merged_since_measure_ = 0;
  }
  const double now = now_seconds();
  {
    std::lock_guard<std::mutex> lk(mu_);
    m_.batch_steps += 1;
    m_.batched_tokens += static_cast<int64_t>(rows.ctxs.size());
    const int64_t sec = static_cast<int64_t>(now);
    auto& slot = recent_[static_cast<size_t>(sec % 10)];
    if (slot.first != sec) slot = {sec, 0};
    slot.second += static_cast<int64_t>(rows.ctxs.size());
  }
  for (size_t i = 0; i < rows.who.size(); ++i) {
    if (rows.pass[i]) {  // a reader's token: its thread gets the status
      gate_done(*rows.who[i], *rows.pass[i], i < st.size() ? st[i] : make_error("internal: no status for a decode row"), false);
      continue;
    }
    if (i >= st.size() || !st[i]) {
      rows.who[i]->gen->finish();
      finish(*rows.who[i], api_error(i < st.size() ? st[i].error() : Error{"internal: no status for a decode row"}));
    }
  }
}

void Engine::finish(Slot& s, std::optional<ApiError> err) {
  std::vector<float> map;
  if (s.session && s.job->spec().methods.read_map && !err) {
    // Which parts of the sequence the last token's query heads read in the last layer.
    const Selection& sel = s.session->context().attention().selection();
    const int64_t n = s.session->n_past();
    if (n > 0 && !sel.keys.empty()) {
      const int64_t bins = std::min<int64_t>(kReadMapBins, n);  // no empty bins
      std::vector<int64_t> hit(static_cast<size_t>(bins), 0), size(static_cast<size_t>(bins), 0);
      std::vector<char> read(static_cast<size_t>(n), 0);
      const int64_t last_row = sel.n - 1;
      for (int64_t h = 0; h < sel.n_head; ++h)
        for (const SelectedKey& k : sel.keys[static_cast<size_t>(last_row * sel.n_head + h)])
          if (k.seq_index >= 0 && k.seq_index < n) read[static_cast<size_t>(k.seq_index)] = 1;
      for (int64_t t = 0; t < n; ++t) {
        const size_t b = static_cast<size_t>(t * bins / n);
        ++size[b];
        hit[b] += read[static_cast<size_t>(t)];
      }
      for (size_t b = 0; b < static_cast<size_t>(bins); ++b)
        map.push_back(static_cast<float>(hit[b]) / static_cast<float>(size[b]));
    }
  }
  if (s.session) {
    s.session->context().attention().record_selection(false);
    s.session->end_request();
  }
  if (s.timed_out && (!err || err->status == 499))
    err = ApiError{504, fmt::format("the request passed its deadline ({:.0f} s after it was sent)",
                                    s.job->deadline() - s.job->t_submit),
                   "timeout_error"};
  // Logprobs of tokens whose text never became final (a stop string) still go out.
  if (s.logprobs_sent < s.st.logprobs.size()) {
    JobEvent e;
    e.logprobs.assign(s.st.logprobs.begin() + static_cast<std::ptrdiff_t>(s.logprobs_sent), s.st.logprobs.end());
    s.logprobs_sent = s.st.logprobs.size();
    s.job->push(std::move(e));
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!err) {
      m_.requests_finished += 1;
      m_.prompt_tokens += s.st.n_prompt;
      m_.cached_tokens += s.st.n_reused;
      m_.predicted_tokens += s.st.n_gen;
      m_.prompt_seconds += s.st.t_prompt;
      m_.predicted_seconds += s.st.t_gen;
    } else if (err->status == 499) {
      m_.requests_cancelled += 1;
    } else {
      m_.requests_failed += 1;
    }
  }
  s.job->finish(s.st, std::move(err), std::move(map));
  s.job.reset();
  s.gen.reset();
  s.sampler.reset();
  s.phase = JobPhase::kDone;
}

void Engine::run_reader(Slot& s) {
  const JobSpec& spec = s.job->spec();
  auto fail = [&](ApiError e) {
    s.reader_err = std::move(e);
    s.reader_done = true;
    cv_.notify_all();
  };
  auto reader = readers::make_reader(spec.methods.reader);
  if (!reader) return fail({400, "longctx.reader: " + reader.error().message});
  auto sp = session_params(spec.methods);
  if (!sp) return fail(api_error(sp.error()));
  sp->ctx.n_ctx = 0;
  sp->ctx.kv_budget = static_cast<int64_t>(s.cap);
  auto session = Session::create(model_, *sp);
  if (!session) return fail(api_error(session.error()));
  // Its forward passes run on the engine's loop, in the batches (the reader's thread waits).
  if (p_.reader_batch) (*session)->set_step_gate(s.gate.get());
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("longctx-serve-{}-{}.txt", static_cast<int>(::getpid()), s.job->id())).string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << spec.document;
    if (!out) return fail({500, "could not write the document to a temporary file", "server_error"});
  }
  Sampler sampler(spec.sampling);
  readers::SessionCaller caller(**session, sampler, p_.chat_template);
  readers::TemplateSource templates;
  readers::ReadOptions opt;
  opt.cancel = s.job->cancel_flag();
  const double t0 = now_seconds();
  auto r = readers::read_document(**reader, caller, templates, path, spec.question, opt);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (!r) return fail(api_error(r.error()));
  s.st.text = r->answer;
  s.st.n_prompt = r->stats.prompt_tokens;
  s.st.n_gen = r->stats.gen_tokens;
  s.st.t_gen = now_seconds() - t0;
  s.st.stop = StopReason::kEog;
  JobEvent e;
  e.text = r->answer;
  s.job->push(std::move(e));
  s.reader_done = true;
  cv_.notify_all();
}

void Engine::loop() {
  for (;;) {
    std::vector<Slot*> started;
    std::deque<std::function<void()>> tasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto busy = [&] {
        for (auto& s : slots_)
          if (s->job && s->phase != JobPhase::kReading) return true;
        return false;
      };
      auto reader_ready = [&] {  // a reader finished, or waits on a forward pass
        for (auto& s : slots_)
          if (s->job && s->phase == JobPhase::kReading && (s->reader_done || (s->gate && s->gate->pending())))
            return true;
        return false;
      };
      cv_.wait_for(lk, std::chrono::milliseconds(100),
                   [&] { return stop_ || busy() || reader_ready() || !queue_.empty() || !tasks_.empty(); });
      if (stop_) break;
      // Queued requests that were cancelled or passed their deadline leave the queue.
      const double now = now_seconds();
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->cancelled() || now > (*it)->deadline()) {
          const bool late = !(*it)->cancelled();
          (*it)->finish(RequestStats{},
                        late ? ApiError{504, "the request passed its deadline while queued", "timeout_error"}
                             : ApiError{499, "cancelled while queued", "cancelled"});
          (late ? m_.requests_failed : m_.requests_cancelled) += 1;
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      std::vector<Slot*> before;
      for (auto& s : slots_)
        if (!s->job) before.push_back(s.get());
      while (admit()) {
      }
      for (Slot* s : before)
        if (s->job) started.push_back(s);
      m_.queued = static_cast<int64_t>(queue_.size());
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t();
    for (Slot* s : started) start(*s);
    const double now = now_seconds();
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (!s.job) continue;
      if (now > s.job->deadline() && !s.timed_out) {
        s.timed_out = true;
        s.job->cancel();
      }
      if (s.job->cancelled() && s.session) s.session->cancel();
      if (s.phase == JobPhase::kReading && s.reader_done) {
        s.reader.join();
        finish(s, s.reader_err);
      }
    }
    DecodeRows rows = collect_rows();
    if (!step_prefill(rows)) step_decode(rows);
    publish();
  }
  // Shutting down: slot actions still waiting run; readers are asked to stop and joined;
  // active requests end with an error.
  std::deque<std::function<void()>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(tasks_);
  }
  for (auto& t : left) t();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& s : slots_)
      if (s->gate) s->gate->close();  // a reader waiting on a pass gets an error and ends
  }
  for (auto& s : slots_) {
    if (s->job) s->job->cancel();
    if (s->reader.joinable()) s->reader.join();
    if (s->job) {
      if (s->gen) s->gen->finish();
      finish(*s, ApiError{503, "the server is shutting down", "server_error"});
    }
  }
}

void Engine::publish() {
  const double now = now_seconds();
  const bool full = now - last_publish_ > 0.25;
  if (full) last_publish_ = now;
  std::vector<SlotInfo> snap;
  size_t resident = 0, spilled = 0, reserved = 0;
  int64_t busy = 0;
  for (const auto& s : slots_) {
    SlotInfo si;
    si.id = s->id;
    si.state = !s->job ? "idle"
               : s->phase == JobPhase::kPrefill ? "prefill"
               : s->phase == JobPhase::kReading ? "reading"
                                                : "generating";
    si.kv_cap_bytes = s->cap;
    si.job = s->job ? s->job->id() : 0;
    if (s->session) {
      const Context& c = s->session->context();
      si.n_past = c.n_past();
      if (full) {
        const KvMemory mem = c.kv().memory();  // walks the slot's block tables: not every step
        si.kv_resident_bytes = mem.resident_bytes;
        si.kv_spilled_bytes = mem.spilled_bytes;
      } else {
        for (const SlotInfo& old : snapshot_)
          if (old.id == s->id) {
            si.kv_resident_bytes = old.kv_resident_bytes;
            si.kv_spilled_bytes = old.kv_spilled_bytes;
          }
      }
      si.attn = c.attention().spec();
      si.rope = s->session->params().ctx.rope;
      si.kv_press = s->session->params().ctx.kv_press;
    }
    reserved += s->cap;
    busy += s->job != nullptr;
    snap.push_back(std::move(si));
  }
  // The pool's own totals: a block two slots share counts once.
  resident = kv_pool_->ram_bytes();
  spilled = kv_pool_->spilled_bytes();
  std::lock_guard<std::mutex> lk(mu_);
  snapshot_ = std::move(snap);
  m_.busy_slots = busy;
  m_.kv_resident_bytes = resident;
  m_.kv_spilled_bytes = spilled;
  m_.kv_reserved_bytes = reserved;
  m_.kv_in_use_bytes = static_cast<size_t>(kv_pool_->n_used()) * kv_pool_->block_bytes();
  m_.kv_shared_blocks = kv_pool_->n_shared();
}

std::vector<SlotInfo> Engine::slots() const {
  std::lock_guard<std::mutex> lk(mu_);
  return snapshot_;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineMetrics m = m_;
  int64_t recent = 0;
  const int64_t now = static_cast<int64_t>(now_seconds());
  for (const auto& [sec, n] : recent_)
    if (sec > now - 10) recent += n;
  m.predicted_per_second_recent = static_cast<double>(recent) / 10.0;
  return m;
}

std::optional<ApiError> Engine::slot_action(int id, const std::string& action, const std::string& filename,
                                            std::string& detail) {
  if (id < 0 || id >= p_.n_slots) return ApiError{404, fmt::format("no slot {} (0..{})", id, p_.n_slots - 1), "not_found_error"};
  if (action != "save" && action != "restore" && action != "erase")
    return ApiError{400, fmt::format("action '{}': use save, restore or erase", action)};
  std::string path;
  if (action != "erase") {
    if (p_.slot_save_path.empty())
      return ApiError{400, "slot save and restore need --slot-save-path DIR"};
    // A plain file name inside the folder: no separators, no parent references, no hidden files.
    const bool plain = !filename.empty() && filename.size() <= 200 && filename.find('/') == std::string::npos &&
                       filename.find('\\') == std::string::npos && filename[0] != '.' &&
                       filename.find('\0') == std::string::npos;
    if (!plain) return ApiError{400, "'filename' must be a plain file name (no '/', not starting with '.')"};
    path = (std::filesystem::path(p_.slot_save_path) / filename).string();
  }
  // Slots belong to the engine's thread: the action runs there, between steps.
  std::optional<ApiError> result;
  bool done = false;
  std::mutex m;
  std::condition_variable cv;
  auto task = [&, this] {
    std::optional<ApiError> r;
    Slot& s = *slots_[static_cast<size_t>(id)];
    const double t0 = now_seconds();
    if (s.job) {
      r = ApiError{409, fmt::format("slot {} is serving a request", id), "invalid_request_error"};
    } else if (action == "erase") {
      s.session.reset();
      s.cap = 0;
      s.key.clear();
      detail = fmt::format("{{\"id_slot\": {}, \"n_erased\": 0}}", id);
    } else if (action == "save") {
      if (!s.session) {
        r = ApiError{400, fmt::format("slot {} holds no cache to save", id)};
      } else if (Status st = s.session->save(path); !st) {
        r = ApiError{500, st.message(), "server_error"};
      } else {
        detail = fmt::format("{{\"id_slot\": {}, \"filename\": {}, \"n_saved\": {}, \"timings\": {{\"save_ms\": {:.3f}}}}}", id,
                             nlohmann::json(filename).dump(), s.session->history().size(), (now_seconds() - t0) * 1e3);
      }
    } else {
      // Restore into a session with the server's methods; its cap is what is free of the budget.
      size_t others = 0;
      for (auto& o : slots_)
        if (o.get() != &s) others += o->cap;
      if (!std::filesystem::exists(path)) {
        r = ApiError{404, fmt::format("no saved slot '{}'", filename), "not_found_error"};
      } else if (others >= budget_) {
        r = ApiError{503, "no KV budget is free to restore into", "server_error"};
      } else {
        SessionParams sp = p_.defaults;
        sp.ctx.n_ctx = 0;
        sp.ctx.kv_budget = 0;
        sp.ctx.pool = pool_.get();
        sp.ctx.kv_pool = kv_pool_;
        auto made = Session::create(model_, sp);
        if (!made) {
          r = ApiError{500, made.error().message, "server_error"};
        } else if (Status st = (*made)->load(path); !st) {
          r = ApiError{400, st.message()};
        } else {
          s.session = std::move(*made);
          s.key = methods_key(Methods{});
          s.cap = budget_ - others;
          detail = fmt::format("{{\"id_slot\": {}, \"filename\": {}, \"n_restored\": {}, \"timings\": {{\"restore_ms\": {:.3f}}}}}", id,
                               nlohmann::json(filename).dump(), s.session->history().size(), (now_seconds() - t0) * 1e3);
        }
      }
    }
    publish();
    std::lock_guard<std::mutex> lk(m);
    result = std::move(r);
    done = true;
    cv.notify_all();
  };
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back(task);
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> lk(m);
  cv.wait(lk, [&] { return done; });
  return result;
}

}  // namespace lc::server
