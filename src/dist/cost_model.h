// A cost model of context-parallel prefill (docs/scale-out.md): what N hosts would take for a
// prompt of T tokens, from one host's measured prefill times and a network of given latency and
// bandwidth. Assumptions (listed in the docs with the fitted numbers):
// * one host's prefill of T tokens takes a*T + b*T^2 seconds (per-token work: the matrices;
//   pairwise work: causal attention), a and b fitted by least squares to measured times;
// * a rank's compute is the same function of the tokens and query-key pairs it handles;
// * star (Acharya et al. 2024): the context is cut into k blocks per host (B = T/(kN) tokens
//   each); every rank but the first evaluates each of its k blocks after the anchor (the first
//   block): 2kB tokens and k (2B)^2/2 pairs; no communication until the query, whose cost is
//   ignored (a few tokens);
// * ring, contiguous shards: rank r evaluates B tokens whose queries see B^2/2 pairs of its own
//   and r*B^2 of earlier shards; the last rank is the slowest (B^2 (N - 1/2) pairs);
// * ring, zigzag shards (the default): every rank evaluates B tokens and T^2/(2N) = N B^2/2
//   pairs, the same share;
// * ring, both: in every layer N - 1 ring steps each send one shard's keys and values
//   (B * bytes_per_token_layer), not overlapped with compute (as src/dist does);
// * a message costs latency + bytes / bandwidth.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lc::dist {

struct PrefillFit {
  double a = 0, b = 0;  // seconds per token, seconds per query-key pair (T^2 / 2 pairs)
  // Fits t = a*T + b*T^2/2 to (T, seconds) points by least squares (at least two lengths).
  static Expected<PrefillFit> fit(const std::vector<std::pair<double, double>>& points);
  double seconds(double tokens, double pairs) const { return a * tokens + b * pairs; }
};

struct Network {
  double latency_s = 0;
  double bytes_per_s = 0;
  double message(double bytes) const { return latency_s + bytes / bytes_per_s; }
};

struct ScaleCase {
  double tokens = 0;                // T
  int hosts = 1;                    // N
  int64_t layers = 1;
  double wire_bytes_per_token = 0;  // keys + values + position of one token in one layer
  bool zigzag = true;               // ring: the zigzag split (else contiguous shards)
  int star_blocks = 1;              // star: context blocks per host (k)
};

double one_host_prefill(const PrefillFit& f, double tokens);
double star_prefill(const PrefillFit& f, const ScaleCase& c);
double ring_prefill(const PrefillFit& f, const ScaleCase& c, const Network& net);

}  // namespace lc::dist
