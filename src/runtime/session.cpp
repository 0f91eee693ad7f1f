#include "runtime/session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/sys.h"

namespace lc {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kLength: return "length";
    case StopReason::kEog: return "eog";
    case StopReason::kStopString: return "stop";
    case StopReason::kCallback: return "callback";
    case StopReason::kCancelled: return "cancelled";
  }
  return "length";
}

Session::Session(const Model& model, const SessionParams& p, std::unique_ptr<Context> ctx)
    : model_(model), params_(p), ctx_(std::move(ctx)) {
  ctx_->set_chunk_callback([this](int64_t done, int64_t total) {
    if (progress_) progress_(done, total);
    return !cancelled();
  });
}

Expected<std::unique_ptr<Session>> Session::create(const Model& model, const SessionParams& p) {
  LC_ASSIGN_OR_RETURN(std::unique_ptr<Context> ctx, Context::create(model, p.ctx));
  if (p.qttt.enabled()) LC_TRY(check_qttt_context(*ctx));
  return std::unique_ptr<Session>(new Session(model, p, std::move(ctx)));
}

Status Session::check_multi_turn() const {
  if (const KvPress* press = ctx_->press()) {
    if (!press->schedule().query_aware)
      return make_error(ErrorCode::kUnsupported,
                        "--kv-press query=agnostic needs to know where the question starts: use run --question or "
                        "bench run (chat compresses each turn query-aware)");
    if (press->prompt_compression())
      return make_error(ErrorCode::kUnsupported,
                        "--kv-press specpc compresses one prompt before prefill; chat reuses the cache across turns "
                        "(use run)");
  }
  if (params_.qttt.enabled())
    return make_error(ErrorCode::kUnsupported,
                      "--qttt trains on one document before its question; a conversation reuses the cache across "
                      "turns (use run)");
  return ok_status();
}

Status Session::decode_timed(std::span<const int32_t> tokens, Logits which, bool context_part, RequestStats& st) {
  const double t0 = now_seconds();
  Status s = ok_status();
  if (!gate_) {
    s = context_part ? ctx_->decode_context(tokens) : ctx_->decode(tokens, which);
  } else if (s = ctx_->begin_decode(tokens, which, context_part); s) {
    for (;;) {
      auto done = gate_->prefill_chunk(*ctx_, 0);
      if (!done) {
        s = done.error();
        break;
      }
      if (*done) break;
    }
  }
  st.t_prompt += now_seconds() - t0;
  if (s) st.n_prompt += static_cast<int64_t>(tokens.size());
  return s;
}

namespace {

Status check_prompt(const std::vector<int32_t>& tokens, const Context& ctx) {
  if (tokens.empty())
    return make_error(ErrorCode::kInvalidArgument, "the prompt is empty and the model adds no BOS token");
  if (static_cast<int64_t>(tokens.size()) > ctx.n_ctx())
    return make_error(ErrorCode::kContextFull,
                      fmt::format("the prompt has {} tokens but the context holds {} (raise --ctx-size)",
                                  tokens.size(), ctx.n_ctx()));
  return ok_status();
}

// Puts the model's own W_q back when a request ends, however it ends.
struct QueryWeightsGuard {
  Context& ctx;
  ~QueryWeightsGuard() { ctx.clear_query_weights(); }
};

}  // namespace

namespace {
// Tokens of the document: everything before the question; without one, all but the last prompt
// token (generation evaluates that one and reads its logits).
int64_t document_tokens(const Prompt& p) {
  const int64_t n = static_cast<int64_t>(p.tokens.size());
  return p.n_context < 0 || p.n_context >= n ? n - 1 : p.n_context;
}
}  // namespace

Status Session::validate(const Prompt& prompt) const {
  LC_TRY(check_prompt(prompt.tokens, *ctx_));
  return check_qttt_span(params_.qttt, document_tokens(prompt));
}

Expected<RequestStats> Session::run(const Prompt& prompt, Sampler& sampler, const GenerateOptions& g,
                                    const TokenCallback& on_token) {
  QueryWeightsGuard restore{*ctx_};
  ctx_->set_answer_tokens(g.n_predict);  // SpecKV's lookahead=answer
  LC_TRY(begin_run(prompt, g.qttt_seed));
  return finish_request(sampler, g, on_token);
}

Expected<RequestStats> Session::continue_with(std::vector<int32_t> tokens, Sampler& sampler, const GenerateOptions& g,
                                              const TokenCallback& on_token) {
  ctx_->set_answer_tokens(g.n_predict);
  LC_TRY(begin_continue(std::move(tokens)));
  return finish_request(sampler, g, on_token);
}

Expected<RequestStats> Session::finish_request(Sampler& sampler, const GenerateOptions& g, const TokenCallback& on_token) {
  for (;;) {
    LC_ASSIGN_OR_RETURN(bool done, prefill_step());
    if (done) break;
  }
  RequestStats st = plan_.st;
  LC_TRY(generate(sampler, g, on_token, st));
  return st;
}

Status Session::begin_run(const Prompt& prompt, uint64_t qttt_seed) {
  cancel_.store(false, std::memory_order_relaxed);
  logits_ready_ = false;
  plan_ = PrefillPlan{};
  LC_TRY(validate(prompt));
  ctx_->clear();
  history_ = prompt.tokens;
  plan_.n_doc = document_tokens(prompt);
  plan_.qttt_seed = qttt_seed;
  const KvPress* press = ctx_->press();
  if (press && !press->schedule().query_aware && plan_.n_doc > 0)
    plan_.stage = PrefillPlan::kAgnostic;  // the press compresses the document before the question is read
  else
    plan_.stage = params_.qttt.enabled() ? PrefillPlan::kQtttDoc : PrefillPlan::kRest;
  return ok_status();
}

Status Session::begin_continue(std::vector<int32_t> tokens) {
  cancel_.store(false, std::memory_order_relaxed);
  logits_ready_ = false;
  plan_ = PrefillPlan{};
  LC_TRY(check_multi_turn());
  LC_TRY(check_prompt(tokens, *ctx_));
  // Keep the longest prefix the cache holds (the way servers reuse a prompt cache: a template's
  // end-of-turn markers may tokenize differently from what was sampled), and evaluate at least
  // one token, whose logits start the answer.
  const size_t cached = std::min(static_cast<size_t>(ctx_->n_past()), history_.size());
  size_t common = 0;
  while (common < tokens.size() && common < cached && tokens[common] == history_[common]) ++common;
  if (common == tokens.size()) --common;
  ctx_->truncate(static_cast<int64_t>(common));
  history_ = std::move(tokens);
  plan_.st.n_reused = static_cast<int64_t>(common);
  plan_.stage = PrefillPlan::kRest;
  return ok_status();
}

Expected<bool> Session::prefill_step(int64_t max_tokens) { return prefill_step(max_tokens, ChunkStep()); }

Expected<bool> Session::prefill_step(int64_t max_tokens, const ChunkStep& step) {
  PrefillPlan& pl = plan_;
  auto fail = [&](Error e) -> Expected<bool> {
    pl.stage = PrefillPlan::kIdle;
    pl.in_call = false;
    return e;
  };
  switch (pl.stage) {
    case PrefillPlan::kIdle:
      return make_error(ErrorCode::kInvalidArgument, "prefill_step: no request begun (begin_run or begin_continue)");
    case PrefillPlan::kDone:
      return true;
    case PrefillPlan::kQtttTrain: {
      // qTTT: a few steps on the query projections after the document's prefill, one step per
      // call (a server runs other slots between them); the question and the answer then read
      // the cache with the trained W_q. (A press and qTTT never meet: the Session refuses the
      // pair when it is made.)
      if (!pl.qttt) {
        auto r = QtttRun::create(*ctx_, params_.qttt, pl.qttt_seed, pl.n_doc);
        if (!r) return fail(r.error());
        pl.qttt = std::move(*r);
      }
      auto done = pl.qttt->step();
      if (!done) {
        pl.qttt.reset();
        return fail(done.error());
      }
      if (!*done) return false;
      pl.st.qttt = pl.qttt->stats();
      pl.st.qttt_ran = true;
      pl.qttt.reset();
      pl.stage = PrefillPlan::kRest;
      return false;
    }
    default:
      break;
  }
  if (!pl.in_call) {
    std::span<const int32_t> toks;
    Logits which = Logits::kNone;
    const bool context_part = pl.stage == PrefillPlan::kAgnostic;
    if (pl.stage == PrefillPlan::kAgnostic || pl.stage == PrefillPlan::kQtttDoc) {
      toks = std::span<const int32_t>(history_.data(), static_cast<size_t>(pl.n_doc));
    } else {
      const int64_t start = ctx_->n_past();
      if (start >= static_cast<int64_t>(history_.size()))
        return fail(Error{"internal: the cache already holds the whole prompt"});
      toks = std::span<const int32_t>(history_.data() + start, history_.size() - static_cast<size_t>(start));
      which = Logits::kLast;
    }
    const double t0 = now_seconds();
    Status s = ctx_->begin_decode(toks, which, context_part);
    pl.st.t_prompt += now_seconds() - t0;
    if (!s) return fail(s.error());
    pl.in_call = true;
    pl.stage_tokens = static_cast<int64_t>(toks.size());
  }
  const double t0 = now_seconds();
  auto done = step    ? step(*ctx_, max_tokens)
              : gate_ ? gate_->prefill_chunk(*ctx_, max_tokens)
                      : ctx_->decode_step(max_tokens);
  pl.st.t_prompt += now_seconds() - t0;
  if (!done) return fail(done.error());
  if (!*done) return false;
  pl.in_call = false;
  pl.st.n_prompt += pl.stage_tokens;
  switch (pl.stage) {
    case PrefillPlan::kAgnostic: {
      // The cache holds the (with SpecPC, selected) document; the question follows.
      std::vector<int32_t> question(history_.begin() + pl.n_doc, history_.end());
      history_ = ctx_->tokens();
      history_.insert(history_.end(), question.begin(), question.end());
      pl.stage = params_.qttt.enabled() ? PrefillPlan::kQtttDoc : PrefillPlan::kRest;
      return false;
    }
    case PrefillPlan::kQtttDoc:
      pl.stage = PrefillPlan::kQtttTrain;
      return false;
    default:
      pl.stage = PrefillPlan::kDone;
      return true;
  }
}

Status Session::append(std::span<const int32_t> tokens, RequestStats& st) {
  cancel_.store(false, std::memory_order_relaxed);
  logits_ready_ = false;
  if (tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "append: no tokens");
  if (ctx_->n_ctx() > 0 && ctx_->n_past() + static_cast<int64_t>(tokens.size()) > ctx_->n_ctx())
    return make_error(ErrorCode::kContextFull,
                      fmt::format("append: {} tokens after {} do not fit the context of {} tokens", tokens.size(),
                                  ctx_->n_past(), ctx_->n_ctx()));
  LC_TRY(decode_timed(tokens, Logits::kLast, false, st));
  history_ = ctx_->tokens();
  logits_ready_ = true;
  return ok_status();
}

Expected<RequestStats> Session::generate_next(Sampler& sampler, const GenerateOptions& g,
                                              const TokenCallback& on_token) {
  if (!logits_ready_)
    return make_error(ErrorCode::kInvalidArgument, "generate_next: append() tokens first (the logits are stale)");
  logits_ready_ = false;
  RequestStats st;
  LC_TRY(generate(sampler, g, on_token, st));
  return st;
}

Expected<int64_t> Session::adopt_prefix(const Session& src, int64_t n) {
  logits_ready_ = false;
  plan_ = PrefillPlan{};
  ctx_->clear();
  history_.clear();
  LC_ASSIGN_OR_RETURN(const int64_t took, ctx_->adopt_prefix(src.context(), n));
  history_ = ctx_->tokens();
  return took;
}

void Session::truncate(int64_t n) {
  logits_ready_ = false;
  ctx_->truncate(n);
  history_ = ctx_->tokens();
}

Expected<HiddenFragment> Session::hide(int64_t first, int64_t count) {
  logits_ready_ = false;
  LC_ASSIGN_OR_RETURN(HiddenFragment f, ctx_->hide(first, count));
  history_ = ctx_->tokens();
  return f;
}

Status Session::restore(HiddenFragment&& fragment) {
  logits_ready_ = false;
  LC_TRY(ctx_->restore(std::move(fragment)));
  history_ = ctx_->tokens();
  return ok_status();
}

namespace {

// Length of the longest suffix of `text` that is a proper prefix of one of the stop strings:
// text that may still become a stop string and is held back.
size_t held_back(std::string_view text, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const auto& s : stop)
    for (size_t k = std::min(s.size() - 1, text.size()); k > best; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        best = k;
        break;
      }
  return best;
}

}  // namespace

Status Session::generate(Sampler& sampler, const GenerateOptions& g, const TokenCallback& on_token, RequestStats& st) {
  Generation gen(*this, sampler, g, on_token, st);
  for (;;) {
    auto next = gen.next();
    if (!next) {
      gen.finish();
      return next.error();
    }
    if (!*next) break;
    const int32_t id = **next;
    if (Status s = gate_ ? gate_->decode_token(*ctx_, id) : ctx_->decode(std::span<const int32_t>(&id, 1), Logits::kLast);
        !s) {
      gen.finish();
      return s;
    }
  }
  gen.finish();
  return ok_status();
}

Generation::Generation(Session& session, Sampler& sampler, const GenerateOptions& g, TokenCallback on_token,
                       RequestStats& st)
    : s_(session), sampler_(sampler), g_(g), on_token_(std::move(on_token)), st_(st),
      dec_(session.model().tokenizer()), t0_(now_seconds()) {
  for (const auto& stop : g_.stop) longest_ = std::max(longest_, stop.size());
}

// Passes the final part of the text on; with stop strings, text that may begin one waits.
bool Generation::emit(int32_t id, bool final_piece) {
  const size_t upto =
      final_piece || g_.stop.empty() ? st_.text.size() : st_.text.size() - held_back(st_.text, g_.stop);
  if (upto <= emitted_ && !g_.stop.empty()) return true;
  const std::string_view piece = std::string_view(st_.text).substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return !on_token_ || on_token_(id, piece);
}

// Where the first stop string in the text starts (searched from where a new one could start).
size_t Generation::find_stop(size_t from) const {
  size_t at = std::string::npos;
  for (const auto& stop : g_.stop) at = std::min(at, st_.text.find(stop, from));
  return at;
}

void Generation::record_logprobs(const float* logits, int32_t id) {
  const int32_t nv = s_.model().tokenizer().n_vocab();
  const float mx = *std::max_element(logits, logits + nv);
  double sum = 0;
  for (int32_t j = 0; j < nv; ++j) sum += std::exp(static_cast<double>(logits[j]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob tl;
  tl.id = id;
  tl.logprob = static_cast<float>(logits[id] - lse);
  const int n = std::min(g_.n_probs, nv);
  if (n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(nv));
    for (int32_t j = 0; j < nv; ++j) idx[static_cast<size_t>(j)] = j;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int k = 0; k < n; ++k)
      tl.top.emplace_back(idx[static_cast<size_t>(k)], static_cast<float>(logits[idx[static_cast<size_t>(k)]] - lse));
  }
  st_.logprobs.push_back(std::move(tl));
}

Expected<std::optional<int32_t>> Generation::next() {
  using Next = std::optional<int32_t>;
  if (ended_) return Next{};
  // The end of an answer that neither a stop string nor end-of-generation ended: the text left
  // in the decoder, cut at a stop string that the flush completed.
  auto tail = [&]() {
    ended_ = true;
    st_.text += dec_.flush();
    if (!g_.stop.empty()) {
      const size_t at = find_stop(emitted_);
      if (at != std::string::npos) {
        st_.text.resize(at);
        st_.stop = StopReason::kStopString;
      }
    }
    if (emitted_ < st_.text.size() && on_token_) emit(-1, true);
    return Next{};
  };
  if (i_ == 0)
    for (const auto& stop : g_.stop)
      if (stop.empty()) {
        ended_ = true;
        return make_error(ErrorCode::kInvalidArgument, "a stop string is empty");
      }
  if (i_ >= g_.n_predict) return tail();
  if (s_.cancelled()) {
    st_.stop = StopReason::kCancelled;
    return tail();
  }
  const Tokenizer& tok = s_.model().tokenizer();
  const float* logits = s_.ctx_->logits(0);
  const int32_t id = sampler_.sample(logits, tok.n_vocab(), s_.history_);
  if (g_.n_probs >= 0) record_logprobs(logits, id);
  s_.history_.push_back(id);
  st_.generated.push_back(id);
  ++st_.n_gen;
  if (tok.is_eog(id) && !g_.ignore_eos) {
    ended_ = true;
    st_.stop = StopReason::kEog;
    st_.text += dec_.flush();
    if (on_token_ && emitted_ < st_.text.size()) emit(id, true);
    return Next{};
  }
  const size_t search_from = st_.text.size() >= longest_ ? st_.text.size() - longest_ + 1 : 0;
  st_.text += dec_.push(id);
  if (!g_.stop.empty()) {
    const size_t at = find_stop(search_from);
    if (at != std::string::npos) {
      ended_ = true;
      st_.text.resize(at);
      emit(id, true);
      st_.stop = StopReason::kStopString;
      return Next{};
    }
  }
  if (!emit(id, false)) {
    ended_ = true;
    st_.stop = StopReason::kCallback;
    return Next{};
  }
  ++i_;
  if (i_ == g_.n_predict) return tail();  // the last token needs no forward pass
  if (s_.ctx_->n_past() >= s_.ctx_->n_ctx()) {
    ended_ = true;
    return make_error(ErrorCode::kContextFull,
                      fmt::format("context full after {} tokens (raise --ctx-size)", s_.ctx_->n_ctx()));
  }
  return Next{id};
}

void Generation::finish() {
  if (finished_) return;
  finished_ = true;
  st_.t_gen += now_seconds() - t0_;
}

namespace {
constexpr uint32_t kSessionMagic = 0x5353434cu;  // "LCSS"
constexpr uint32_t kSessionVersion = 1;

// What a saved session must agree on with the Session that loads it.
std::string session_identity(const Model& m, const Context& ctx) {
  const HParams& hp = m.hparams();
  return fmt::format("arch {}, n_vocab {}, n_layer {}, n_embd {}, n_head {}/{}, head_dim {}, weights {} "
                     "bytes; rope {}; attention {}; press {}",
                     arch_name(hp.arch), hp.n_vocab, hp.n_layer, hp.n_embd,
                     hp.n_head, hp.n_head_kv, hp.head_dim, m.weight_bytes(),
                     ctx.rope_plan().describe(), ctx.attention().spec(),
                     ctx.press() ? ctx.press()->spec().c_str() : "none");
}
}  // namespace

Status Session::save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error(ErrorCode::kIo, fmt::format("{}: cannot write the session file", tmp));
    const std::string id = session_identity(model_, *ctx_);
    out.write(reinterpret_cast<const char*>(&kSessionMagic), sizeof kSessionMagic);
    out.write(reinterpret_cast<const char*>(&kSessionVersion), sizeof kSessionVersion);
    const uint64_t id_len = id.size(), n_hist = history_.size();
    out.write(reinterpret_cast<const char*>(&id_len), sizeof id_len);
    out.write(id.data(), static_cast<std::streamsize>(id.size()));
    out.write(reinterpret_cast<const char*>(&n_hist), sizeof n_hist);
    out.write(reinterpret_cast<const char*>(history_.data()), static_cast<std::streamsize>(n_hist * sizeof(int32_t)));
    if (Status s = ctx_->save_state(out); !s) {
      out.close();
      std::remove(tmp.c_str());
      return s;
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return make_error(ErrorCode::kIo, fmt::format("{}: write error (disk full?)", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return make_error(ErrorCode::kIo, fmt::format("{}: cannot replace the session file", path));
  }
  return ok_status();
}

Status Session::load(const std::string& path) {
  // Whatever happens, the old state is gone: an error leaves an empty Session.
  ctx_->clear();
  ctx_->clear_query_weights();
  history_.clear();
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, fmt::format("{}: cannot open the session file", path));
  uint32_t magic = 0, version = 0;
  uint64_t id_len = 0, n_hist = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  in.read(reinterpret_cast<char*>(&version), sizeof version);
  if (!in || magic != kSessionMagic)
    return make_error(ErrorCode::kBadFile, fmt::format("{}: not a longctx session file", path));
  if (version != kSessionVersion)
    return make_error(ErrorCode::kBadFile, fmt::format("{}: session file version {}, this build reads version {}",
                                                       path, version, kSessionVersion));
  in.read(reinterpret_cast<char*>(&id_len), sizeof id_len);
  if (!in || id_len > 4096) return make_error(ErrorCode::kBadFile, fmt::format("{}: truncated session file", path));
  std::string id(static_cast<size_t>(id_len), '\0');
  in.read(id.data(), static_cast<std::streamsize>(id_len));
  const std::string mine = session_identity(model_, *ctx_);
  if (!in) return make_error(ErrorCode::kBadFile, fmt::format("{}: truncated session file", path));
  if (id != mine)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: the session was saved with another model or other methods ({}); this one has {}",
                                  path, id, mine));
  in.read(reinterpret_cast<char*>(&n_hist), sizeof n_hist);
  if (!in || n_hist > static_cast<uint64_t>(ctx_->n_ctx()))
    return make_error(ErrorCode::kBadFile, fmt::format("{}: bad history length", path));
  std::vector<int32_t> hist(static_cast<size_t>(n_hist));
  in.read(reinterpret_cast<char*>(hist.data()), static_cast<std::streamsize>(n_hist * sizeof(int32_t)));
  if (!in) return make_error(ErrorCode::kBadFile, fmt::format("{}: truncated session file", path));
  history_.clear();
  if (Status s = ctx_->load_state(in); !s) return make_error(s.code(), path + ": " + s.message());
  if (hist.size() < static_cast<size_t>(ctx_->n_past())) {
    ctx_->clear();
    return make_error(ErrorCode::kBadFile, fmt::format("{}: the history is shorter than the cache", path));
  }
  history_ = std::move(hist);
  return ok_status();
}

}  // namespace lc
