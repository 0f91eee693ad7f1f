// `longctx make-vocab`: trains a byte-level BPE vocabulary on text files and/or on the text of
// the synthetic curriculum, and writes it as a vocabulary-only GGUF for `longctx train --vocab`
// (src/tokenizer/bpe_train.h).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "options.h"
#include "gguf/gguf.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/tokenizer.h"
#include "train/curriculum.h"

namespace {

struct VocabArgs {
  std::vector<std::string> data;
  std::string curriculum, from_vocab, out;
  int64_t size = 2048, samples = 2000, seq_len = 1024, min_count = 2;
  uint64_t seed = 1;
};

// Curriculum sequences rendered with from_vocab's tokenizer and decoded back to text (control
// tokens dropped): the text the tasks are made of, whatever vocabulary renders them later.
lc::Status curriculum_text(const VocabArgs& a, std::vector<std::string>& texts) {
  auto file = lc::gguf::File::open(a.from_vocab);
  if (!file) return file.error();
  auto tok = lc::Tokenizer::from_gguf(**file);
  if (!tok) return tok.error();
  auto tasks = lc::train::parse_curriculum(a.curriculum);
  if (!tasks) return tasks.error();
  lc::train::CurriculumOptions co;
  co.tasks = *tasks;
  co.min_len = std::min<int64_t>(256, a.seq_len);
  co.max_len = a.seq_len;
  co.ramp = 0;
  co.total_steps = 1;
  auto cur = lc::train::Curriculum::create(**tok, co);
  if (!cur) return cur.error();
  lc::train::Rng rng(a.seed);
  std::vector<int32_t> toks(static_cast<size_t>(a.seq_len)), tgt(static_cast<size_t>(a.seq_len));
  for (int64_t i = 0; i < a.samples; ++i) {
    auto s = (*cur)->sample(rng, 0, toks.data(), tgt.data());
    if (!s) return s.error();
    texts.push_back((*tok)->decode(std::vector<int32_t>(toks.begin(), toks.begin() + s->n), false));
  }
  return lc::ok_status();
}

}  // namespace

std::vector<RegisteredCommand> add_vocab_commands(CLI::App* app) {
  auto a = std::make_shared<VocabArgs>();
  auto* v = app->add_subcommand("make-vocab", "train a byte-level BPE vocabulary and write it as a vocabulary GGUF "
                                "(for train --vocab)");
  v->add_option("--data", a->data, "text file to train on (repeatable)");
  v->add_option("--curriculum", a->curriculum, "also train on the text of this many curriculum sequences "
                "(--samples): 'default' or task=weight,... as for train");
  v->add_option("--from-vocab", a->from_vocab, "with --curriculum: the GGUF whose tokenizer renders the "
                "sequences, decoded back to text");
  v->add_option("--samples", a->samples, "curriculum sequences")->capture_default_str();
  v->add_option("--seq-len", a->seq_len, "longest curriculum sequence in tokens")->capture_default_str();
  v->add_option("--size", a->size, "tokens in the vocabulary (256 bytes + merges + <s>, </s>)")->capture_default_str();
  v->add_option("--min-count", a->min_count, "stop merging when the best pair occurs fewer times")->capture_default_str();
  v->add_option("--seed", a->seed, "seed of the curriculum samples")->capture_default_str();
  v->add_option("-o,--output", a->out, "output GGUF")->required();
  RegisteredCommand cmd;
  cmd.app = v;
  cmd.run = [a]() -> int {
    if (a->data.empty() && a->curriculum.empty()) return fail("make-vocab: give --data FILE and/or --curriculum SPEC");
    if (!a->curriculum.empty() && a->from_vocab.empty())
      return fail("make-vocab: --curriculum needs --from-vocab V.gguf (the tokenizer that renders the sequences)");
    if (a->samples < 1 || a->samples > 1000000) return fail("make-vocab: --samples must be in 1..1000000");
    if (a->seq_len < 16 || a->seq_len > (int64_t{1} << 20)) return fail("make-vocab: --seq-len must be in 16..1048576");
    std::vector<std::string> texts;
    for (const std::string& path : a->data) {
      std::ifstream in(path, std::ios::binary);
      if (!in) return fail("make-vocab: cannot read --data " + path);
      std::stringstream ss;
      ss << in.rdbuf();
      texts.push_back(ss.str());
    }
    if (!a->curriculum.empty())
      if (lc::Status st = curriculum_text(*a, texts); !st) return fail("make-vocab: " + st.message());
    lc::BpeTrainOptions o;
    o.vocab_size = a->size;
    o.min_pair_count = a->min_count;
    auto vocab = lc::train_bpe(texts, o);
    if (!vocab) return fail("make-vocab: " + vocab.error().message);
    if (lc::Status st = lc::write_bpe_vocab(*vocab, "longctx BPE vocabulary", a->out); !st)
      return fail("make-vocab: " + st.message());
    fmt::print(stderr, "wrote {}: {} tokens, {} merges\n", a->out, vocab->tokens.size(),
               vocab->merges.size());
    return 0;
  };
  return {cmd};
}
