#include "readers/session_caller.h"

#include <algorithm>

namespace lc::readers {

Expected<std::string> SessionCaller::call(const std::string& user, const std::string& reply_prefix,
                                          int64_t max_tokens, const std::vector<std::string>& stop, CallCost& cost) {
  Prompt p;
  p.tokens = render_.tokens(user, reply_prefix);
  GenerateOptions g;
  g.n_predict = max_tokens;
  g.stop = stop;
  LC_ASSIGN_OR_RETURN(RequestStats st, session_.run(p, sampler_, g, nullptr));
  cost.n_prompt = st.n_prompt;
  cost.n_gen = st.n_gen;
  cost.seconds = st.t_prompt + st.t_gen;
  return st.text;
}

int64_t SessionCaller::prompt_tokens(const std::string& user, const std::string& reply_prefix) const {
  return static_cast<int64_t>(render_.tokens(user, reply_prefix).size());
}

int64_t SessionCaller::default_window() const {
  const int64_t n = session_.model().hparams().n_ctx_train;
  return std::min<int64_t>(n > 0 ? n : 4096, 8192);
}

}  // namespace lc::readers
