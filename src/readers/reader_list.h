// The reader registry: ONE line per reader, read as an X-macro list. The factories'
// declarations (readers_impl.h), the table make_reader() searches, the "unknown reader" error,
// reader_methods() and reader_method_info() (registry.cpp) are generated from it, in this order.
//
//   LC_READER(name, help, paper): a file src/readers/<name>.cpp defines
//     make_<name>(MethodSpec&), which reads its keys with MethodSpec::get_*.
//
// Adding a reader = its file, its templates in data/readers/, and one LC_READER line.
// No include guard, on purpose; LC_READER is undefined at the end.

#ifndef LC_READER
#define LC_READER(name, help, paper)
#endif

LC_READER(memagent,
          "MemAgent: reads chunk by chunk, overwriting a bounded memory from (problem, memory, chunk); "
          "answers from (problem, memory)",
          "Yu et al., \"MemAgent: Reshaping Long-Context LLM with Multi-Conv RL-based Memory Agent\", "
          "arXiv 2507.02259, 2025 (seeds/002)")
LC_READER(mapreduce,
          "multi-agent chunking: each chunk answered alone (an answer or \"none\"), then aggregated by vote, "
          "first answer or a model call",
          "multi-agent chunk reading (seeds/002: task, model and aggregator noise); Zhang et al., \"Chain of "
          "Agents: Large Language Models Collaborating on Long-Context Tasks\", NeurIPS 2024")
LC_READER(smooth,
          "Smooth Reading: round by round, each chunk read with the notes so far; one note per chunk is added; "
          "answers from the notes",
          "\"Smooth Reading\", ICLR 2026 submission (seeds/000): multi-round incremental reading with "
          "iterative summaries, co-designed with recurrent and windowed-attention models")
LC_READER(sculptor,
          "Sculptor: the model manages its own context with tools: fragments, read, summarize, hide and restore "
          "(in the KV cache), exact or regex search over the whole document",
          "\"Sculptor: Empowering LLMs with Cognitive Agency via Active Context Management\", ICLR 2026 "
          "submission (seeds/000)")

#undef LC_READER
