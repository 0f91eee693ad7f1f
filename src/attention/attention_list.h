// The attention registry: ONE line per method, read as an X-macro list. Everything in
// src/attention that names the backends is generated from it: the factories' declarations
// (methods.h), the method table make_attention_backend() searches, the "unknown attention
// method" error, attention_methods() (name + help) and attention_method_info() (+ paper and
// the keys the factory reads) (registry.cpp). The order here is the order of all those lists.
//
//   LC_ATTENTION(name, help, paper): a file under src/attention/ (<name>.cpp) defines
//     make_<name>(MethodSpec&, const AttnShape&), which reads its keys with MethodSpec::get_*
//     (type, default, range and help in one call each).
//
// Adding an attention backend = its file + one LC_ATTENTION line (CMake globs src/attention).
//
// Include this file after defining LC_ATTENTION; it is undefined again at the end, so the file
// can be included any number of times. No include guard, on purpose.

#ifndef LC_ATTENTION
#define LC_ATTENTION(name, help, paper)
#endif

LC_ATTENTION(dense,
             "exact attention, tiled with an online softmax over the paged cache (default)",
             "Vaswani et al., \"Attention Is All You Need\", NeurIPS 2017; the online softmax of Milakov & "
             "Gimelshein, \"Online normalizer calculation for softmax\", arXiv 1805.02867, 2018")
LC_ATTENTION(naive,
             "exact attention with materialised double-precision scores (tests only)",
             "Vaswani et al., \"Attention Is All You Need\", NeurIPS 2017")
LC_ATTENTION(streaming,
             "StreamingLLM: sinks + recent window, positions re-assigned",
             "Xiao et al., \"Efficient Streaming Language Models with Attention Sinks\", ICLR 2024")
LC_ATTENTION(quest,
             "Quest as the official code runs it: dense prefill; each decoded query head attends its top "
             "max(3, budget/page) pages by min/max key bounds",
             "Tang et al., \"Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference\", ICML 2024")
LC_ATTENTION(quest_fast,
             "faster relative of quest: sparse prefill tiles, pages shared by a GQA group, 8-bit bounds",
             "Tang et al., \"Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference\", ICML 2024 "
             "(modified: docs/attention.md)")
LC_ATTENTION(infllm,
             "InfLLM: sinks + local + retrieved memory blocks at a fixed distance",
             "Xiao et al., \"InfLLM: Training-Free Long-Context Extrapolation for LLMs with an Efficient Context "
             "Memory\", NeurIPS 2024")
LC_ATTENTION(dssa,
             "DSSA / InfLLM-v2: dense below switch, block-sparse above",
             "Zhao et al., \"InfLLM-V2: Dense-Sparse Switchable Attention for Seamless Short-to-Long "
             "Adaptation\", arXiv 2509.24663, 2025 (seeds/002)")
LC_ATTENTION(fixed,
             "exact attention with keys further than distance=N scored at that distance (LM-Infinite's ceiling); "
             "default for models trained with it (their GGUF gives N)",
             "Han et al., \"LM-Infinite: Zero-Shot Extreme Length Generalization for Large Language Models\", "
             "NAACL 2024")
LC_ATTENTION(lychee,
             "LycheeDecode: retrieval heads attend fully and pick top-k blocks for the others",
             "\"LycheeDecode\", ICLR 2026 submission (seeds/002): hybrid-head sparse decoding")
LC_ATTENTION(vslash,
             "vertical-slash sparse prefill as SpecKV runs it: a whole-prompt call reads a band of recent tokens "
             "and the vertical tokens its last queries attend most; other calls are dense",
             "Jiang et al., \"MInference 1.0: Accelerating Pre-filling for Long-Context LLMs via Dynamic Sparse "
             "Attention\", NeurIPS 2024; as configured by Galim et al., \"Draft-based Approximate Inference for "
             "LLMs\", arXiv 2506.08373, 2025")

#undef LC_ATTENTION
