// LycheeDecode retrieval heads: calibration (which heads retrieve) and its file format.
//
// Calibration, as `longctx calibrate` will drive it:
//   auto cal = make_lychee_calibrator(shape, /*far=*/1024);           // an AttentionBackend
//   ... run a retrieval prompt (e.g. a needle task) through the model with `cal` as backend ...
//   RetrievalHeads rh = pick_retrieval_heads(cal->stats(), /*per_layer=*/2);
//   LC_TRY(save_retrieval_heads("heads.txt", rh));
// and then `--attn lychee:heads=heads.txt`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/backend.h"

namespace lc {

// Mean attention mass each query head puts on tokens more than `far` positions away.
struct LycheeHeadStats {
  int64_t n_layer = 0, n_head = 0, far = 0;
  std::vector<double> far_mass;  // [n_layer * n_head] summed over queries
  std::vector<int64_t> n_rows;   // [n_layer * n_head] queries counted
  double mean(int64_t il, int64_t h) const {
    const size_t i = static_cast<size_t>(il * n_head + h);
    return n_rows[i] ? far_mass[i] / static_cast<double>(n_rows[i]) : 0.0;
  }
};

// Dense attention that also accumulates LycheeHeadStats (queries with no far token are not
// counted).
class LycheeCalibrator : public AttentionBackend {
 public:
  virtual const LycheeHeadStats& stats() const = 0;

 protected:
  using AttentionBackend::AttentionBackend;
};
Expected<std::unique_ptr<LycheeCalibrator>> make_lychee_calibrator(const AttnShape& shape, int64_t far = 1024);

struct RetrievalHeads {
  int64_t n_layer = 0, n_head = 0;
  std::vector<std::vector<int32_t>> heads;  // [n_layer] ascending query-head ids
};

// The per_layer heads of each layer with the largest mean far mass (ties: lower id).
RetrievalHeads pick_retrieval_heads(const LycheeHeadStats& s, int64_t per_layer);
// The `total` heads of the whole model with the largest mean far mass (ties: lower layer, then
// lower id); layers may get none. For `--attn lychee:share=head,heads=FILE`.
RetrievalHeads pick_retrieval_heads_total(const LycheeHeadStats& s, int64_t total);

// Text format:
//   longctx-retrieval-heads 1
//   n_layer 32 n_head 32
//   layer 0: 3 17
//   ...
Status save_retrieval_heads(const std::string& path, const RetrievalHeads& h);
Expected<RetrievalHeads> load_retrieval_heads(const std::string& path);

}  // namespace lc
