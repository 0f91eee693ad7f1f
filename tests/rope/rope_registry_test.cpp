// The --rope spec parser: good specs resolve every key; bad ones name the problem.
#include <string>

#include "rope_test_util.h"

namespace lc {
namespace {

using rope_test::model;

std::string err_scaling(const std::string& spec, const RopeModelInfo& info) {
  auto r = make_rope_scaling(spec, info);
  EXPECT_FALSE(r.has_value()) << spec << " parsed as " << (r ? (*r)->describe() : "");
  return r ? "" : r.error().message;
}
std::string err_plan(const std::string& spec, const RopeModelInfo& info) {
  auto r = make_rope_plan(spec, info);
  EXPECT_FALSE(r.has_value()) << spec << " parsed as " << (r ? r->describe() : "");
  return r ? "" : r.error().message;
}
#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "'" << (haystack) << "' lacks '" << (needle) << "'"

TEST(RopeRegistry, DescribeResolvesDefaults) {
  const auto info = model(128, 10000.0, 4096);
  struct {
    const char* spec;
    const char* canonical;
  } cases[] = {
      {"", "gguf"},
      {"gguf", "gguf"},
      {"none", "none:base=10000"},
      {"linear:factor=4", "linear:factor=4,base=10000"},
      {"ntk:factor=2.5,base=500000", "ntk:factor=2.5,base=500000"},
      {"dynamic-ntk:factor=2", "dynamic-ntk:factor=2,orig=4096,base=10000,cache=append"},
      {"dynamic-ntk:factor=2,cache=rerotate", "dynamic-ntk:factor=2,orig=4096,base=10000,cache=rerotate"},
      {"yarn:factor=8", "yarn:factor=8,orig=4096,base=10000,alpha=1,beta=32,ramp=code,attn_factor=1"},
      {" yarn : orig=2048 , factor=16, ramp=paper ",
       "yarn:factor=16,orig=2048,base=10000,alpha=1,beta=32,ramp=paper,attn_factor=1"},
      {"llama3", "llama3:factor=8,orig=8192,low=1,high=4,base=10000"},
      {"mrrope-uni:factor=4", "mrrope-uni:factor=4,orig=4096,base=10000,alpha=1,beta=32,attn_factor=1"},
      {"mrrope-pro:factor=16,orig=8192",
       "mrrope-pro:factor=16,orig=8192,base=10000,alpha=1,beta=32,attn_factor=1"},
  };
  for (const auto& c : cases) {
    auto s = make_rope_scaling(c.spec, info);
    ASSERT_TRUE(s.has_value()) << c.spec << ": " << s.error().message;
    EXPECT_EQ((*s)->describe(), c.canonical);
    // The canonical form parses back to itself.
    auto again = make_rope_scaling((*s)->describe(), info);
    ASSERT_TRUE(again.has_value()) << (*s)->describe();
    EXPECT_EQ((*again)->describe(), c.canonical);
  }
}

TEST(RopeRegistry, PlanComposesLogn) {
  const auto info = model(64, 10000.0, 4096);
  auto p = make_rope_plan("yarn:factor=8,orig=4096+logn", info);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_TRUE(p->logn());
  EXPECT_EQ(p->logn_l0(), 4096);
  EXPECT_EQ(p->describe(),
            "yarn:factor=8,orig=4096,base=10000,alpha=1,beta=32,ramp=code,attn_factor=1+logn:orig=4096");

  p = make_rope_plan("logn:orig=2048 + ntk:factor=2", info);  // order does not matter
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_EQ(p->logn_l0(), 2048);
  EXPECT_EQ(p->scaling().describe(), "ntk:factor=2,base=10000");

  p = make_rope_plan("logn", info);  // logn alone: the model's own rope
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->describe(), "gguf+logn:orig=4096");

  p = make_rope_plan("", info);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->logn());
  EXPECT_EQ(p->q_scale(1 << 20), 1.0f);
  EXPECT_EQ(p->describe(), "gguf");

  p = make_rope_plan("dynamic-ntk:factor=4", info);
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->dynamic());
}

TEST(RopeRegistry, UnknownMethod) {
  const auto info = model(64, 10000.0, 4096);
  const std::string e = err_scaling("yarm:factor=8", info);
  EXPECT_HAS(e, "unknown method 'yarm'");
  EXPECT_HAS(e, "yarn");
  EXPECT_HAS(e, "mrrope-pro");
  EXPECT_HAS(err_plan("foo+logn", info), "unknown method 'foo'");
}

TEST(RopeRegistry, UnknownKey) {
  const auto info = model(64, 10000.0, 4096);
  std::string e = err_scaling("yarn:factor=8,scale=2", info);
  EXPECT_HAS(e, "rope yarn");
  EXPECT_HAS(e, "unknown key 'scale'");
  EXPECT_HAS(e, "factor (required), orig, base, alpha, beta, ramp, attn_factor");
  e = err_scaling("yarn:factor=8,logn=1", info);
  EXPECT_HAS(e, "unknown key 'logn'");
  EXPECT_HAS(e, "+logn");
  e = err_scaling("gguf:factor=2", info);
  EXPECT_HAS(e, "unknown key 'factor'");
  EXPECT_HAS(err_plan("yarn:factor=8+logn:factor=2", info), "rope logn: unknown key 'factor'");
}

TEST(RopeRegistry, BadFactor) {
  const auto info = model(64, 10000.0, 4096);
  for (const char* spec : {"yarn:factor=0", "linear:factor=-2", "ntk:factor=0.5"}) {
    const std::string e = err_scaling(spec, info);
    EXPECT_HAS(e, "factor must be >= 1");
  }
  EXPECT_HAS(err_scaling("yarn:factor=abc", info), "factor must be a number, got 'abc'");
  EXPECT_HAS(err_scaling("yarn:factor=", info), "factor must be a number, got ''");
  EXPECT_HAS(err_scaling("yarn:factor=8x", info), "factor must be a number");
  EXPECT_HAS(err_scaling("yarn:factor=nan", info), "factor must be a number");
  EXPECT_HAS(err_scaling("yarn:factor=inf", info), "factor must be a number");
}

TEST(RopeRegistry, MissingRequiredKey) {
  const auto info = model(64, 10000.0, 4096);
  for (const char* m : {"linear", "ntk", "dynamic-ntk", "yarn", "mrrope-uni", "mrrope-pro"}) {
    const std::string e = err_scaling(m, info);
    EXPECT_HAS(e, std::string("rope ") + m + ": missing required key 'factor'");
    EXPECT_HAS(err_scaling(std::string(m) + ":base=20000", info), "missing required key 'factor'");
  }
  // orig defaults to the training context; without one it must be given.
  const auto no_ctx = model(64, 10000.0, 0);
  EXPECT_HAS(err_scaling("yarn:factor=4", no_ctx), "orig has no default");
  EXPECT_TRUE(make_rope_scaling("yarn:factor=4,orig=2048", no_ctx).has_value());
  EXPECT_HAS(err_plan("logn", no_ctx), "orig has no default");
}

TEST(RopeRegistry, OtherBadValues) {
  const auto info = model(64, 10000.0, 4096);
  EXPECT_HAS(err_scaling("yarn:factor=4,orig=0", info), "orig must be a positive integer");
  EXPECT_HAS(err_scaling("yarn:factor=4,orig=1.5", info), "orig must be a positive integer");
  EXPECT_HAS(err_scaling("yarn:factor=4,base=-1", info), "base must be > 0");
  EXPECT_HAS(err_scaling("yarn:factor=4,ramp=cubic", info), "ramp must be one of code|paper, got 'cubic'");
  EXPECT_HAS(err_scaling("dynamic-ntk:factor=4,cache=keep", info), "cache must be one of append|rerotate, got 'keep'");
  EXPECT_HAS(err_scaling("yarn:factor=4,alpha=32,beta=1", info), "beta (1) must be greater than alpha (32)");
  EXPECT_HAS(err_scaling("mrrope-pro:factor=4,alpha=32,beta=32", info), "must be greater than alpha");
  EXPECT_HAS(err_scaling("llama3:low=4,high=1", info), "high (1) must be greater than low (4)");
  EXPECT_HAS(err_scaling("yarn:factor=4,factor=8", info), "key 'factor' given twice");
  EXPECT_HAS(err_scaling("yarn:factor", info), "expected key=value, got 'factor'");
  EXPECT_HAS(err_scaling("yarn:factor=4,", info), "expected key=value, got ''");
  EXPECT_HAS(err_scaling("yarn:", info), "expected key=value");
  EXPECT_HAS(err_plan("logn:orig=1", info), "orig must be >= 2");
}

TEST(RopeRegistry, BadComposition) {
  const auto info = model(64, 10000.0, 4096);
  EXPECT_HAS(err_plan("yarn:factor=4+ntk:factor=2", info), "two position methods");
  EXPECT_HAS(err_plan("logn+logn", info), "logn given twice");
  EXPECT_HAS(err_plan("yarn:factor=4+", info), "empty component");
  EXPECT_HAS(err_plan("+logn", info), "empty component");
  EXPECT_HAS(err_scaling("yarn:factor=4+logn", info), "make_rope_plan");
  EXPECT_HAS(err_scaling("logn", info), "not a position method");
}

TEST(RopeRegistry, BadModel) {
  EXPECT_HAS(err_scaling("none", model(63, 10000.0, 4096)), "n_rot must be positive and even");
  EXPECT_HAS(err_plan("none", model(0, 10000.0, 4096)), "n_rot must be positive and even");
  EXPECT_HAS(err_scaling("none", model(64, 0.0, 4096)), "base must be positive");
  EXPECT_HAS(err_scaling("ntk:factor=2", model(2, 10000.0, 4096)), "n_rot > 2");
}

TEST(RopeRegistry, NamesAndHelp) {
  const auto names = rope_method_names();
  for (const char* m : {"gguf", "none", "linear", "ntk", "dynamic-ntk", "yarn", "llama3",
                        "mrrope-uni", "mrrope-pro", "logn"})
    EXPECT_NE(std::find(names.begin(), names.end(), m), names.end()) << m;
  const std::string help = rope_spec_help();
  for (const std::string& m : names) EXPECT_HAS(help, m);
  EXPECT_HAS(help, "ramp");
}

}  // namespace
}  // namespace lc
