// Where the context ends in a sample's prompt tokens, checked against the real tiny model's
// tokenizer (stories260K). (Moved from tests/bench/run_test.cpp with the task generators.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/model.h"
#include "tasks/tasks.h"

namespace lc::tasks {
namespace {

const std::string kModel = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

// The context/question split of every task: the prompt's tokens up to the context's end.
TEST(BenchTasks, ContextEndsBeforeTheQuestion) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.has_value());
  const PromptRenderer r((*model)->tokenizer(), ChatTemplate::kNone);
  for (const char* task : {"niah_single_1", "passkey", "qa_1", "vt"}) {
    SampleSpec sp;
    sp.task = task;
    sp.length = 1024;
    auto s = make_sample(r, sp);
    ASSERT_TRUE(s.has_value()) << task << ": " << s.error().message;
    ASSERT_GT(s->n_context_tokens, 0) << task;
    ASSERT_LT(s->n_context_tokens, s->n_prompt) << task;
    // The tokens after the split decode to text that holds the end of the user message
    // (the question), and the split lies at or after the end of the context minus one token.
    const std::vector<int32_t> tail(s->tokens.begin() + s->n_context_tokens, s->tokens.end());
    const std::string tail_text = (*model)->tokenizer().decode(tail);
    const std::string user_tail = s->user.substr(s->user.rfind(s->context) + s->context.size());
    EXPECT_NE(tail_text.find(user_tail.substr(user_tail.size() > 20 ? user_tail.size() - 20 : 0)), std::string::npos) << task;
    const std::vector<int32_t> head(s->tokens.begin(), s->tokens.begin() + s->n_context_tokens);
    EXPECT_LE((*model)->tokenizer().decode(head).size(), s->user.rfind(s->context) + s->context.size() + 1) << task;
  }
}

}  // namespace
}  // namespace lc::tasks
