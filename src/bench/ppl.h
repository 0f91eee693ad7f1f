// Perplexity as a function of position: one long text evaluated in a single sequence (chunked
// prefill, the cache keeps every earlier token), the negative log-likelihood of each next
// token grouped into position buckets. It answers "is the model still predicting well at
// token 100K?", which a chunked perplexity (llama.cpp's, runtime/measure.h) cannot.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/method.h"
#include "core/status.h"
#include "model/context.h"

namespace lc::bench {

struct PplBucket {
  int64_t begin = 0, end = 0;  // positions of the predicted tokens: [begin, end)
  int64_t n = 0;
  double nll = 0;              // mean negative log-likelihood (nats)
  double ppl = 0;              // exp(nll)
};

struct PplCurve {
  std::string model, method;
  int64_t n_tokens = 0;        // tokens evaluated
  double ppl = 0;              // over every predicted token
  double seconds = 0;
  std::vector<PplBucket> buckets;
};

// tokens: the text (BOS first if the model adds one); every token from position 1 on is
// predicted from all before it. bucket: positions per bucket (> 0). on_progress(done tokens).
Expected<PplCurve> perplexity_by_position(Context& ctx, const std::vector<int32_t>& tokens, int64_t bucket,
                                          const std::function<void(int64_t)>& on_progress = {});

Status write_ppl_csv(const std::vector<PplCurve>& curves, const std::string& path);
Status write_ppl_plot(const std::vector<PplCurve>& curves, const std::string& path_stem);

}  // namespace lc::bench
