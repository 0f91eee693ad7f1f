// llama.cpp compatibility of the CLI (issue 21's ecosystem fixes): `tokenize` on
// vocabulary-only GGUFs checked against llama.cpp's tokenizer test vectors (tests/data/vocab),
// special-token parsing on by default as in llama-tokenize / llama-cli, and llama.cpp's flag
// names giving the same run as the native flags.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_cli.h"

namespace {

using lc_cli::Result;
using lc_cli::run;

const std::string kData = std::string(LONGCTX_TEST_DATA) + "/";
const std::string kVocab = kData + "vocab/";
const std::string kStories = kData + "golden/models/stories260K.gguf";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// test-tokenizer-0's files: inputs separated by "\n__ggml_vocab_test__\n", one line of ids each.
std::vector<Case> read_cases(const std::string& base) {
  const std::string inp = slurp(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    texts.push_back(inp.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::vector<Case> cases;
  std::istringstream lines(slurp(base + ".out"));
  std::string line;
  for (size_t i = 0; std::getline(lines, line) && i < texts.size(); ++i) {
    Case c{texts[i], {}};
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  return cases;
}

// An id as `tokenize` prints it before its piece (right-aligned in six columns).
std::string fmt_id(int32_t id) {
  std::string s = std::to_string(id);
  return std::string(s.size() < 6 ? 6 - s.size() : 0, ' ') + s;
}

// The last line of the output that is an id list.
std::string ids_line(const std::string& out) {
  const size_t b = out.rfind("\n[", out.size() > 1 ? out.size() - 2 : 0);
  const size_t s = b == std::string::npos ? 0 : b + 1;
  return out.substr(s, out.find('\n', s) - s);
}

TEST(CompatCli, TokenizeVocabOnlyGgufMatchesLlamaCppVectors) {
  // Tokenizer-only GGUFs (no tensors) of several architectures; the .out files are what the
  // Hugging Face tokenizers give and llama.cpp's test-tokenizer-0 passes on.
  for (const char* name : {"llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "starcoder", "deepseek-llm",
                           "deepseek-coder", "falcon", "mpt", "refact", "bert-bge"}) {
    const std::string base = kVocab + "ggml-vocab-" + name + ".gguf";
    const auto cases = read_cases(base);
    ASSERT_GE(cases.size(), 40u) << name;
    // Every fourth case, and the last (the long one), keep the number of runs small.
    for (size_t i = 0; i < cases.size(); ++i) {
      if (i % 4 != 1 && i + 1 != cases.size()) continue;
      const std::string f = write_file("vocab_case.txt", cases[i].text);
      Result r = run("tokenize -m " + base + " --ids --no-bos --no-parse-special -f " + f);
      ASSERT_EQ(r.code, 0) << name << ": " << r.out;
      EXPECT_EQ(ids_line(r.out), id_list(cases[i].ids)) << name << " case " << i << " '" << cases[i].text << "'";
    }
  }
}

TEST(CompatCli, TokenizeAddsBosAsTheVocabularyAsks) {
  // llama-spm adds BOS (1); the first vector is "" (no ids), the others get BOS in front.
  const std::string base = kVocab + "ggml-vocab-llama-spm.gguf";
  const auto cases = read_cases(base);
  const std::string f = write_file("bos_case.txt", cases[5].text);
  Result r = run("tokenize -m " + base + " --ids -f " + f);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<int32_t> want{1};
  want.insert(want.end(), cases[5].ids.begin(), cases[5].ids.end());
  EXPECT_EQ(ids_line(r.out), id_list(want));
  // Without --ids: one line per token with its piece.
  r = run("tokenize -m " + base + " -p 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("     1 -> '<s>'"), std::string::npos) << r.out;
}

TEST(CompatCli, TokenizeWordPieceVocabulary) {
  // WordPiece (BERT): llama-tokenize adds [CLS] and [SEP] (the GGUF's cls_token_id 101 and
  // seperator_token_id 102) around the ids of llama.cpp's vector for "Hello world".
  const std::string base = kVocab + "ggml-vocab-bert-bge.gguf";
  const auto cases = read_cases(base);
  std::vector<int32_t> hello_world;
  for (const Case& c : cases)
    if (c.text == "Hello world") hello_world = c.ids;
  ASSERT_EQ(hello_world.size(), 2u);
  std::vector<int32_t> want{101};
  want.insert(want.end(), hello_world.begin(), hello_world.end());
  want.push_back(102);
  Result r = run("tokenize -m " + base + " --ids -p 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ids_line(r.out), id_list(want));
  // Without --ids: one line per token with its piece ("\u2581hello" prints as " hello").
  r = run("tokenize -m " + base + " -p 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("   101 -> '[CLS]'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt_id(hello_world[0]) + " -> ' hello'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   102 -> '[SEP]'"), std::string::npos) << r.out;
  // --no-bos: the vector alone.
  r = run("tokenize -m " + base + " --ids --no-bos -p 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ids_line(r.out), id_list(hello_world));
  // Ill-formed UTF-8 is dropped byte by byte, as llama.cpp's WordPiece drops U+FFFD: no crash,
  // and the bytes do not split "hello".
  const std::string f =
      write_file("bert_garbage.txt", "\xff\xfe\xc3 Hel\x80lo world \xf4\x90\x80\x80");
  r = run("tokenize -m " + base + " --ids -f " + f);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ids_line(r.out), id_list(want));
}

TEST(CompatCli, TokenizeMissingFileIsAClearError) {
  Result r = run("tokenize -m " + kVocab + "no-such.gguf -p 'Hello'");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no-such.gguf"), std::string::npos) << r.out;
}

TEST(CompatCli, TokenizeParsesSpecialTokensByDefault) {
  // llama.cpp's golden S11 ("<s> and </s> ... typed as plain text") was made with
  // parse_special = false: --no-parse-special gives exactly it. By default (llama-tokenize's
  // default) "<s>" and "</s>" become BOS (1) and EOS (2).
  std::ifstream jf(kData + "golden/tokenizer/tokenizer_cases.json");
  const auto j = nlohmann::json::parse(jf);
  nlohmann::json s11;
  for (const auto& c : j["cases"])
    if (c["name"] == "S11") s11 = c;
  ASSERT_FALSE(s11.is_null());
  const std::string f = write_file("s11.txt", s11["text"].get<std::string>());
  const std::string golden = id_list(s11["ids"].get<std::vector<int32_t>>());
  Result plain = run("tokenize --ids -m " + kStories + " --no-parse-special -f " + f);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(ids_line(plain.out), golden);
  Result def = run("tokenize --ids -m " + kStories + " -f " + f);
  ASSERT_EQ(def.code, 0) << def.out;
  EXPECT_EQ(ids_line(def.out).rfind("[1, 1, ", 0), 0u) << def.out;
  EXPECT_NE(ids_line(def.out).find(", 2, "), std::string::npos) << def.out;
  Result flag = run("tokenize --ids -m " + kStories + " --parse-special -f " + f);
  ASSERT_EQ(flag.code, 0) << flag.out;
  EXPECT_EQ(ids_line(flag.out), ids_line(def.out));
  // Qwen2: <|im_end|> is 151645 in the Hugging Face tokenizer.
  const std::string qwen = kVocab + "ggml-vocab-qwen2.gguf";
  Result q = run("tokenize --ids -m " + qwen + " -p 'Hi<|im_end|>'");
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_NE(ids_line(q.out).find("151645"), std::string::npos) << q.out;
  q = run("tokenize --ids -m " + qwen + " --no-parse-special -p 'Hi<|im_end|>'");
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_EQ(ids_line(q.out).find("151645"), std::string::npos) << q.out;
  Result both = run("tokenize --ids -m " + kStories + " --parse-special --no-parse-special -p x");
  EXPECT_NE(both.code, 0) << both.out;
}

TEST(CompatCli, RunParsesSpecialTokensInThePromptLikeLlamaCli) {
  // llama-cli tokenizes the prompt with parse_special = true: "<s>" is one token (BOS).
  const auto n_prompt = [](const std::string& out) {
    const size_t p = out.find("prompt:");
    return p == std::string::npos ? -1 : std::stoi(out.substr(p + 7));
  };
  Result def = run("run -m " + kStories + " -p '<s>Once upon a time' -n 1 --temp 0");
  ASSERT_EQ(def.code, 0) << def.out;
  Result plain = run("run -m " + kStories + " -p 'Once upon a time' -n 1 --temp 0");
  ASSERT_EQ(plain.code, 0) << plain.out;
  // Golden: "Once upon a time" is [1, 403, 407, 261, 378]; with "<s>" in front, one more.
  EXPECT_EQ(n_prompt(plain.out), 5) << plain.out;
  EXPECT_EQ(n_prompt(def.out), 6) << def.out;
  Result no = run("run -m " + kStories + " -p '<s>Once upon a time' -n 1 --temp 0 --no-parse-special");
  ASSERT_EQ(no.code, 0) << no.out;
  EXPECT_GT(n_prompt(no.out), 6) << no.out;
}

// The generated text and the method line of a greedy run (timings differ from run to run).
struct RunOut {
  int code;
  std::string text, method, kv, all;
};
RunOut greedy(const std::string& flags) {
  Result r = run("run -m " + kStories + " -p 'Once upon a time' -n 12 --temp 0 " + flags);
  RunOut o{r.code, "", "", "", r.out};
  const size_t end = r.out.find("\n\nprompt:");
  o.text = r.out.substr(0, end);
  // stderr is in the output too: the -ngl notice is not part of the text.
  const size_t note = o.text.find("longctx: note:");
  if (note != std::string::npos) o.text.erase(note, o.text.find('\n', note) + 1 - note);
  const size_t m = r.out.find("method:");
  if (m != std::string::npos) o.method = r.out.substr(m, r.out.find('\n', m) - m);
  const size_t k = r.out.find("bytes/token");
  if (k != std::string::npos) o.kv = r.out.substr(r.out.rfind(',', k), k - r.out.rfind(',', k));
  return o;
}

void expect_same(const std::string& alias, const std::string& native) {
  const RunOut a = greedy(alias), b = greedy(native);
  ASSERT_EQ(a.code, 0) << alias << "\n" << a.all;
  ASSERT_EQ(b.code, 0) << native << "\n" << b.all;
  EXPECT_EQ(a.text, b.text) << alias << " vs " << native;
  EXPECT_EQ(a.method, b.method) << alias << " vs " << native;
  EXPECT_EQ(a.kv, b.kv) << alias << " vs " << native;
}

TEST(CompatCli, CacheTypeAliases) {
  expect_same("-ctk f16 -ctv bf16", "--kv-type-k f16 --kv-type-v bf16");
  expect_same("--cache-type-k bf16 --cache-type-v f16", "--kv-type-k bf16 --kv-type-v f16");
  // The alias really changes the cache: f16 keys take fewer bytes per token than f32.
  EXPECT_NE(greedy("-ctk f16").kv, greedy("").kv);
  const RunOut bad = greedy("-ctk q9_9");
  EXPECT_EQ(bad.code, 1) << bad.all;
  EXPECT_NE(bad.all.find("q9_9"), std::string::npos) << bad.all;
}

TEST(CompatCli, RopeAliasesGiveTheSameMethodAsRope) {
  expect_same("--rope-scaling yarn --rope-freq-scale 0.25 --yarn-orig-ctx 64 --yarn-beta-fast 16 "
              "--yarn-beta-slow 2 --rope-freq-base 20000 --yarn-ext-factor 1",
              "--rope yarn:factor=4,orig=64,alpha=2,beta=16,base=20000");
  expect_same("--rope-scaling yarn --rope-scale 4 --yarn-attn-factor 0.9", "--rope yarn:factor=4,attn_factor=0.9");
  expect_same("--rope-freq-scale 0.5", "--rope linear:factor=2");
  expect_same("--rope-scaling linear --rope-scale 2", "--rope linear:factor=2");
  expect_same("--rope-freq-base 20000", "--rope none:base=20000");
  expect_same("--rope-scaling none", "--rope none");
  // The alias changes the run: the method line says yarn.
  EXPECT_NE(greedy("--rope-scaling yarn --rope-scale 4").method.find("yarn:factor=4"), std::string::npos);
}

TEST(CompatCli, BadRopeAliasesAreClearErrors) {
  struct C {
    const char* flags;
    const char* says;
  };
  for (const C& c : {C{"--rope yarn:factor=2 --rope-scaling yarn --rope-scale 2", "cannot be combined"},
                     C{"--rope-scaling bogus", "--rope-scaling"},
                     C{"--rope-scaling yarn", "needs the factor"},
                     C{"--rope-scaling none --rope-scale 2", "takes no"},
                     C{"--yarn-orig-ctx 64", "need --rope-scaling yarn"},
                     C{"--rope-scaling yarn --rope-scale 2 --yarn-ext-factor 0.5", "--yarn-ext-factor"},
                     C{"--rope-freq-scale 2", "--rope-freq-scale"},
                     C{"--rope-freq-scale 0.5 --rope-scale 2", "not both"},
                     C{"--rope-freq-base -5", "--rope-freq-base"}}) {
    const RunOut r = greedy(c.flags);
    EXPECT_NE(r.code, 0) << c.flags << "\n" << r.all;
    EXPECT_NE(r.all.find(c.says), std::string::npos) << c.flags << "\n" << r.all;
  }
}

TEST(CompatCli, FlashAttnAndGpuLayersAreAccepted) {
  const RunOut base = greedy("");
  ASSERT_EQ(base.code, 0) << base.all;
  for (const char* flags : {"-fa", "-fa on", "-fa off", "--flash-attn auto", "-fa -ngl 0", "-ngl 99",
                            "--n-gpu-layers 99", "-ngl all"}) {
    const RunOut r = greedy(flags);
    ASSERT_EQ(r.code, 0) << flags << "\n" << r.all;
    EXPECT_EQ(r.text, base.text) << flags;
    EXPECT_EQ(r.method, base.method) << flags;
    if (std::string(flags).find("gpu") != std::string::npos || std::string(flags).find("ngl") != std::string::npos)
      EXPECT_NE(r.all.find("CPU engine"), std::string::npos) << flags << "\n" << r.all;
    else
      EXPECT_EQ(r.all.find("CPU engine"), std::string::npos) << flags;
  }
  for (const char* flags : {"-fa maybe", "-ngl many"}) {
    const RunOut r = greedy(flags);
    EXPECT_NE(r.code, 0) << flags << "\n" << r.all;
  }
}

}  // namespace
