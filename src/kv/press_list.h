// The press registry: ONE line per method, read as an X-macro list. Everything in src/kv that
// names the presses is generated from it: the scorer factories' declarations (press_impl.h),
// the scorer table find_scorer() and adakv's inner= error list, kv_press_methods() (name + help
// line) and the "unknown press" error, kv_press_method_info() (+ paper and keys) (press.cpp).
// The order here is the order of all those lists.
//
//   LC_PRESS_SCORER(name, help, paper): a scorer; a file under src/kv/ (press_<name>.cpp) defines
//     press::make_<name>(Args&, const PressShape&). It runs under the common frame (ratio,
//     budget, window, ...) on its own and as adakv's inner=.
//   LC_PRESS_FRAME(name, help, paper): a press press.cpp builds itself: a budget allocation over
//     a scorer (pyramidkv, adakv) or prompt compression (specpc). No factory of its own.
//   LC_PRESS_CUSTOM(name, help, paper): a press with its own KvPress class and selection, in
//     press_<name>.cpp, which defines press::make_press_<name>(Args&, const PressShape&). It reads
//     every key it accepts from Args (the registry records them and rejects unknown ones).
//
// Adding a training-free scorer = its file + one LC_PRESS_SCORER line (CMake globs src/kv).
//
// Include this file after defining the macro(s) wanted; an undefined one expands to nothing,
// and both are undefined again at the end, so the file can be included any number of times.
// No include guard, on purpose.

#ifndef LC_PRESS_SCORER
#define LC_PRESS_SCORER(name, help, paper)
#endif
#ifndef LC_PRESS_FRAME
#define LC_PRESS_FRAME(name, help, paper)
#endif
#ifndef LC_PRESS_CUSTOM
#define LC_PRESS_CUSTOM(name, help, paper)
#endif

LC_PRESS_SCORER(streaming_llm,
                "first n_sink tokens + the most recent ones; positions re-assigned (reposition=1)",
                "Xiao et al., \"Efficient Streaming Language Models with Attention Sinks\", ICLR 2024")
LC_PRESS_SCORER(snapkv,
                "attention of the last obs queries, pooled along the sequence, reduced over the group",
                "Li et al., \"SnapKV: LLM Knows What You are Looking for Before Generation\", NeurIPS 2024")
LC_PRESS_FRAME(pyramidkv,
               "SnapKV scores, per-layer budgets falling linearly with depth",
               "Cai et al., \"PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
               "Funneling\", arXiv 2406.02069, 2024")
LC_PRESS_SCORER(h2o,
                "observed attention: column sums over the window queries / number of queries that see the key",
                "Zhang et al., \"H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language "
                "Models\", NeurIPS 2023")
LC_PRESS_SCORER(tova,
                "attention of the last query averaged over all heads",
                "Oren et al., \"Transformers are Multi-State RNNs\", arXiv 2401.06104, 2024")
LC_PRESS_SCORER(knorm,
                "-||k||: keeps keys of small norm",
                "Devoto et al., \"A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression\", EMNLP 2024")
LC_PRESS_SCORER(keydiff,
                "-cos(k, mean of the head's unit keys): keeps the most distinctive keys",
                "Park et al., \"KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in "
                "Resource-Constrained Environments\", arXiv 2504.15364, 2025")
LC_PRESS_SCORER(expected_attention,
                "attention expected from query statistics over the next n_future positions, x ||v||",
                "Devoto et al., \"Expected Attention: KV Cache Compression by Estimating Attention from Future "
                "Queries Distribution\", arXiv 2510.00636, 2025")
LC_PRESS_SCORER(random,
                "uniform random scores (control)",
                "the control of the press papers (kvpress RandomPress)")
LC_PRESS_FRAME(adakv,
               "head-wise budgets over a scorer (inner=NAME)",
               "Feng et al., \"Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient "
               "LLM Inference\", arXiv 2407.11550, 2024")
LC_PRESS_SCORER(speckv,
                "attention of the last prompt queries and of a draft's answer run through the model (its keys in the "
                "softmax), max over group x queries, max-pooled (needs --draft)",
                "Galim et al., \"Draft-based Approximate Inference for LLMs\", arXiv 2506.08373, 2025")
LC_PRESS_SCORER(lagkv,
                "attention-free: each lag_size partition's keys and values, min/max-normalised by the next "
                "partition's, score by their channel std (softmax, ranked per partition); sinks and the last "
                "partition kept",
                "Liang et al., \"LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important\", "
                "arXiv 2504.04704, 2025")
LC_PRESS_FRAME(specpc,
               "the draft's attention picks prompt tokens (+ neighbours) before the model prefills them (needs --draft)",
               "Galim et al., \"Draft-based Approximate Inference for LLMs\", arXiv 2506.08373, 2025")
LC_PRESS_CUSTOM(kvzip,
                "context reconstruction: max attention of \"Repeat the previous context\" + the context, run after it "
                "chunk by chunk; global ranking (query-agnostic)",
                "Kim et al., \"KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction\", arXiv "
                "2505.23416, 2025")
LC_PRESS_CUSTOM(simlayerkv,
                "lazy layers (last queries' attention on the first + recent tokens > lazy_threshold) keep only those",
                "Zhang et al., \"SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction\", arXiv "
                "2410.13846, 2024")
LC_PRESS_CUSTOM(duo_attention,
                "streaming heads (lowest head scores over the model, head_ratio of them) keep sink + recent tokens; "
                "scores on the fly from the prompt's mean query and key, or patterns=FILE",
                "Xiao et al., \"DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming "
                "Heads\", ICLR 2025")
LC_PRESS_CUSTOM(criticalkv,
                "two stages over a scorer (inner=NAME): first_stage_ratio of the budget by its scores, the rest by "
                "(score + eps) x ||W_o v||_1",
                "Feng et al., \"Identify Critical KV Cache in LLM Inference from an Output Perturbation "
                "Perspective\", arXiv 2502.03805, 2025")
LC_PRESS_CUSTOM(critical_adakv,
                "criticalkv's two stages within AdaKV's head-wise budgets (inner=NAME, alpha)",
                "Feng et al., \"Identify Critical KV Cache in LLM Inference from an Output Perturbation "
                "Perspective\", arXiv 2502.03805, 2025")
LC_PRESS_CUSTOM(chunkkv,
                "whole chunks of chunk_length tokens, ranked by an inner scorer's scores (inner=NAME) summed over "
                "the layer's heads: the same chunks in every head",
                "Liu et al., \"ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM "
                "Inference\", arXiv 2502.00299, 2025")
LC_PRESS_CUSTOM(block,
                "as if the prompt came in blocks of block_size: each block competes with the survivors before it "
                "by an inner scorer (inner=NAME, default keydiff)",
                "kvpress's BlockPress, after the block-wise prefill of Park et al., \"KeyDiff: Key Similarity-Based "
                "KV Cache Eviction for Long-Context LLM Inference in Resource-Constrained Environments\", arXiv "
                "2504.15364, 2025")
LC_PRESS_CUSTOM(decoding,
                "while generating: every interval tokens, each head back to its target best by an inner scorer "
                "(inner=NAME, default knorm; queries from the last buffer + 1 generated tokens); the prompt is left "
                "whole",
                "kvpress's DecodingPress (no paper of its own; kvpress's citation: Jegou, Jeblick, Devoto, "
                "\"Expected Attention: KV Cache Compression by Estimating Attention from Future Queries "
                "Distribution\", arXiv 2510.00636, 2025)")
LC_PRESS_CUSTOM(think,
                "key channels, not tokens: per KV head, the channel_ratio of channels with the lowest mean q^2 "
                "(last window queries) x mean k^2 are pruned: dropped from the cache's storage (store=drop, memory "
                "saved) or zeroed in place (store=zero, as kvpress); chain it after a token press",
                "Xu et al., \"ThinK: Thinner Key Cache by Query-Driven Pruning\", arXiv 2407.21018, 2024 (kvpress's "
                "ThinKPress)")

#undef LC_PRESS_SCORER
#undef LC_PRESS_FRAME
#undef LC_PRESS_CUSTOM
