#include "readers/session_caller.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace lc::readers {
namespace {

// Sculptor's working memory over a Session: every message is rendered through the chat
// template (or, without one, its text as it is) and appended to the cache; a reply is
// generated, then taken out and appended again as the template renders it, so the cache
// holds exactly the rendered conversation. A message's tokens are one range of the sequence,
// which hide() takes out of the cache and restore() puts back.
class SessionConversation final : public Conversation {
 public:
  SessionConversation(std::unique_ptr<Session> s, Sampler& sampler, ChatTemplate tmpl)
      : s_(std::move(s)), sampler_(sampler), tmpl_(tmpl), tok_(s_->model().tokenizer()) {}

  Expected<int64_t> add(const std::string& role, const std::string& content, CallCost& cost) override {
    msgs_.push_back({role, content});
    auto r = append_rendered(render(false), cost);
    if (!r) {
      msgs_.pop_back();
      return r.error();
    }
    return static_cast<int64_t>(msgs_.size()) - 1;
  }

  Expected<std::pair<int64_t, std::string>> reply(int64_t max_tokens, const std::vector<std::string>& stop,
                                                  CallCost& cost) override {
    const int64_t mark = s_->n_past();
    const std::string before = rendered_;
    // The generation prompt (the assistant turn's header); without a template, nothing: the
    // logits of the last message's last token start the reply.
    const std::string gen = tmpl_ == ChatTemplate::kNone ? std::string() : render(true);
    if (gen.size() > rendered_.size()) {
      if (gen.compare(0, rendered_.size(), rendered_) != 0)
        return make_error("conversation: the chat template does not render the conversation as a prefix of itself");
      RequestStats st;
      const auto ids = tok_.encode(gen.substr(rendered_.size()), false, true);
      if (!ids.empty()) LC_TRY(s_->append(ids, st));
      cost.n_prompt += st.n_prompt;
      cost.seconds += st.t_prompt;
    }
    GenerateOptions g;
    g.n_predict = max_tokens;
    g.stop = stop;
    LC_ASSIGN_OR_RETURN(RequestStats st, s_->generate_next(sampler_, g, nullptr));
    cost.n_gen += st.n_gen;
    cost.seconds += st.t_gen;
    // Out with what was sampled, in with the reply as the template writes it.
    s_->truncate(mark);
    rendered_ = before;
    // A reply that ended at its (only) stop string keeps it: "</tool_call>", a newline.
    std::string text = st.text;
    if (st.stop == StopReason::kStopString && stop.size() == 1) text += stop[0];
    msgs_.push_back({"assistant", text});
    CallCost re;
    auto r = append_rendered(render(false), re);
    if (!r) {
      msgs_.pop_back();
      return r.error();
    }
    cost.n_prompt += re.n_prompt;
    cost.seconds += re.seconds;
    return std::pair<int64_t, std::string>{static_cast<int64_t>(msgs_.size()) - 1, text};
  }

  Status hide(int64_t m) override {
    LC_TRY(check(m));
    Span& sp = spans_[static_cast<size_t>(m)];
    if (sp.fragment) return make_error(fmt::format("conversation: message {} is hidden already", m));
    if (sp.count == 0) return make_error(fmt::format("conversation: message {} holds no tokens", m));
    LC_ASSIGN_OR_RETURN(HiddenFragment f, s_->hide(sp.first, sp.count));
    sp.fragment = std::move(f);
    return ok_status();
  }

  Status restore(int64_t m) override {
    LC_TRY(check(m));
    Span& sp = spans_[static_cast<size_t>(m)];
    if (!sp.fragment) return make_error(fmt::format("conversation: message {} is not hidden", m));
    LC_TRY(s_->restore(std::move(*sp.fragment)));
    sp.fragment.reset();
    return ok_status();
  }

  bool hidden(int64_t m) const override {
    return m >= 0 && m < static_cast<int64_t>(spans_.size()) && spans_[static_cast<size_t>(m)].fragment.has_value();
  }
  int64_t tokens_held() const override { return static_cast<int64_t>(s_->context().tokens().size()); }
  int64_t message_tokens(int64_t m) const override {
    return m >= 0 && m < static_cast<int64_t>(spans_.size()) ? spans_[static_cast<size_t>(m)].count : 0;
  }
  bool chat() const override { return tmpl_ != ChatTemplate::kNone; }

 private:
  struct Span {
    int64_t first = 0, count = 0;  // sequence range of the message's tokens
    std::optional<HiddenFragment> fragment;
  };

  Status check(int64_t m) const {
    if (m < 0 || m >= static_cast<int64_t>(spans_.size()))
      return make_error(fmt::format("conversation: no message {} (there are {})", m, spans_.size()));
    return ok_status();
  }

  std::string render(bool generation_prompt) const {
    if (tmpl_ == ChatTemplate::kNone) {
      std::string s;
      for (const auto& m : msgs_) s += m.content;
      return s;
    }
    return apply_chat_template(tmpl_, msgs_, generation_prompt);
  }

  // Appends the part of `full` after what is rendered already as the newest message's tokens.
  Expected<int64_t> append_rendered(const std::string& full, CallCost& cost) {
    if (full.compare(0, rendered_.size(), rendered_) != 0)
      return make_error("conversation: the chat template does not render the conversation as a prefix of itself");
    const std::string tail = full.substr(rendered_.size());
    const auto ids = tok_.encode(tail, rendered_.empty(), tmpl_ != ChatTemplate::kNone);
    Span sp;
    sp.first = s_->n_past();
    sp.count = static_cast<int64_t>(ids.size());
    if (!ids.empty()) {
      RequestStats st;
      LC_TRY(s_->append(ids, st));
      cost.n_prompt += st.n_prompt;
      cost.seconds += st.t_prompt;
    }
    spans_.push_back(std::move(sp));
    rendered_ = full;
    return sp.count;
  }

  std::unique_ptr<Session> s_;
  Sampler& sampler_;
  ChatTemplate tmpl_;
  const Tokenizer& tok_;
  std::vector<ChatMessage> msgs_;
  std::vector<Span> spans_;  // one per message
  std::string rendered_;     // the conversation as rendered into the cache so far
};

}  // namespace

Expected<std::unique_ptr<Conversation>> SessionCaller::converse() {
  LC_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(session_.model(), session_.params()));
  s->set_step_gate(session_.step_gate());  // its passes run where the caller's run
  return std::unique_ptr<Conversation>(std::make_unique<SessionConversation>(std::move(s), sampler_, render_.chat_template()));
}

SessionCaller::SessionCaller(Session& session, Sampler& sampler, ChatTemplate tmpl, bool reuse_prefix)
    : session_(session), sampler_(sampler), render_(session.model().tokenizer(), tmpl) {
  const AttentionCaps caps = session.context().attention().caps();
  reuse_ = reuse_prefix && session.check_multi_turn().is_ok() && session.context().press() == nullptr &&
           !caps.evicts && !caps.relabels_positions;
}

Expected<std::string> SessionCaller::call(const std::string& user, const std::string& reply_prefix,
                                          int64_t max_tokens, const std::vector<std::string>& stop, CallCost& cost) {
  Prompt p;
  p.tokens = render_.tokens(user, reply_prefix);
  GenerateOptions g;
  g.n_predict = max_tokens;
  g.stop = stop;
  const bool reuse = reuse_ && !first_;
  first_ = false;
  LC_ASSIGN_OR_RETURN(RequestStats st, reuse ? session_.continue_with(p.tokens, sampler_, g, nullptr)
                                             : session_.run(p, sampler_, g, nullptr));
  cost.n_prompt = st.n_prompt;
  cost.n_gen = st.n_gen;
  cost.seconds = st.t_prompt + st.t_gen;
  return st.text;
}

Expected<std::vector<std::string>> SessionCaller::call_batch(const std::vector<std::string>& users,
                                                            const std::string& reply_prefix, int64_t max_tokens,
                                                            const std::vector<std::string>& stop,
                                                            std::vector<CallCost>& costs) {
  if (users.size() <= 1 || session_.step_gate() != nullptr || session_.params().qttt.enabled())
    return ModelCaller::call_batch(users, reply_prefix, max_tokens, stop, costs);
  while (extra_.size() + 1 < users.size()) {
    LC_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(session_.model(), session_.params()));
    extra_.push_back(std::move(s));
    extra_first_.push_back(1);
  }
  const size_t n = users.size();
  GenerateOptions g;
  g.n_predict = max_tokens;
  g.stop = stop;
  std::vector<Session*> ss(n);
  std::vector<Sampler> samplers(n, sampler_);
  std::vector<RequestStats> st(n);
  std::vector<std::unique_ptr<Generation>> gens(n);
  auto end_all = [&] {
    for (size_t i = 0; i < n; ++i) {
      if (gens[i]) gens[i]->finish();
      if (ss[i]) ss[i]->end_request();
    }
  };
  // Each prompt into its own context (as call() does: the prefix the context holds is kept
  // where that gives what a fresh request gives).
  for (size_t i = 0; i < n; ++i) {
    Session& s = i == 0 ? session_ : *extra_[i - 1];
    ss[i] = &s;
    bool reuse = reuse_;
    if (i == 0) {
      reuse = reuse && !first_;
      first_ = false;
    } else {
      reuse = reuse && !extra_first_[i - 1];
      extra_first_[i - 1] = 0;
    }
    std::vector<int32_t> toks = render_.tokens(users[i], reply_prefix);
    s.context().set_answer_tokens(max_tokens);
    Status b = reuse ? s.begin_continue(std::move(toks)) : s.begin_run(Prompt{std::move(toks)});
    for (bool done = false; b && !done;) {
      auto r = s.prefill_step();
      if (!r) b = r.error();
      else done = *r;
    }
    if (!b) {
      end_all();
      return b.error();
    }
    st[i] = s.prefill_stats();
    gens[i] = std::make_unique<Generation>(s, samplers[i], g, nullptr, st[i]);
  }
  // The replies, one token of each per batched pass.
  std::vector<char> live(n, 1);
  for (;;) {
    std::vector<Context*> ctxs;
    std::vector<int32_t> toks;
    std::vector<size_t> who;
    for (size_t i = 0; i < n; ++i) {
      if (!live[i]) continue;
      auto next = gens[i]->next();
      if (!next) {
        end_all();
        return next.error();
      }
      if (!*next) {
        live[i] = 0;
        continue;
      }
      ctxs.push_back(&ss[i]->context());
      toks.push_back(**next);
      who.push_back(i);
    }
    if (ctxs.empty()) break;
    const std::vector<Status> rs = Context::decode_batch(ctxs, toks);
    for (size_t k = 0; k < rs.size(); ++k)
      if (!rs[k]) {
        end_all();
        return rs[k].error();
      }
  }
  end_all();
  std::vector<std::string> out;
  costs.assign(n, CallCost{});
  for (size_t i = 0; i < n; ++i) {
    costs[i].n_prompt = st[i].n_prompt;
    costs[i].n_gen = st[i].n_gen;
    costs[i].seconds = st[i].t_prompt + st[i].t_gen;
    out.push_back(st[i].text);
  }
  return out;
}

int64_t SessionCaller::prompt_tokens(const std::string& user, const std::string& reply_prefix) const {
  return static_cast<int64_t>(render_.tokens(user, reply_prefix).size());
}

int64_t SessionCaller::default_window() const {
  const int64_t n = session_.model().hparams().n_ctx_train;
  return std::min<int64_t>(n > 0 ? n : 4096, 8192);
}

}  // namespace lc::readers
