// `longctx read`: a reading agent (--reader) answers a question over a document streamed from
// disk in window-sized chunks. The answer goes to stdout, the run's figures to stderr.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "embedded_model.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/sys.h"
#include "options.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "runtime/session.h"

namespace {

struct ReadArgs {
  CommonOpts co;
  SamplingOpts so;
  std::string file, question, reader = "memagent", prompts, checkpoint, log, chat_template;
  bool resume = false;
};

std::string reader_flag_help() {
  std::string names;
  for (const auto& [n, h] : lc::readers::reader_methods()) names += (names.empty() ? "" : ", ") + n;
  return "reader NAME:key=value,... (" + names + "; `longctx methods` lists the keys)";
}

int cmd_read(const ReadArgs& a) {
  if (a.resume && a.checkpoint.empty()) return fail("--resume needs --checkpoint FILE");
  auto reader = lc::readers::make_reader(a.reader);
  if (!reader) return fail(reader.error().message);
  auto sp = a.so.params();
  if (!sp) return fail(sp.error().message);
  // Without -m: the project's model trained on the readers' protocols.
  auto model = load_model_or_reader(a.co);
  if (!model) return fail(model.error().message);
  if (lc::Status s = lc::check_logit_bias_vocab(*sp, (*model)->hparams().n_vocab); !s) return fail(s.message());
  auto ct = chat_template_for(**model, a.chat_template);
  if (!ct) return fail(ct.error().message);
  const lc::ChatTemplate tmpl = *ct;
  lc::SessionParams params;
  auto cp = a.co.ctx_params();
  if (!cp) return fail(cp.error().message);
  params.ctx = *cp;
  auto session = lc::Session::create(**model, params);
  if (!session) return fail(session.error().message);
  lc::Sampler sampler(*sp);
  lc::readers::SessionCaller caller(**session, sampler, tmpl);
  lc::readers::TemplateSource templates(a.prompts);

  std::unique_ptr<std::ofstream> log;
  if (!a.log.empty()) {
    log = std::make_unique<std::ofstream>(a.log, std::ios::binary | std::ios::trunc);
    if (!*log) return fail(fmt::format("--log: cannot write {}", a.log));
  }
  std::unique_ptr<lc::Progress> prog;
  lc::readers::ReadOptions opt;
  opt.checkpoint = a.checkpoint;
  opt.resume = a.resume;
  opt.progress = [&prog](int64_t done, int64_t total) {
    if (!prog) prog = std::make_unique<lc::Progress>("read", total, "B");
    prog->update(done);
  };
  opt.log = [&log, &a](const lc::readers::CallRecord& r) {
    if (a.co.verbose)
      fmt::print(stderr, "[{}{}] {}\n", r.step, r.chunk >= 0 ? fmt::format(" chunk {}", r.chunk) : "",
                 r.reply.size() > 200 ? r.reply.substr(0, 200) + "..." : r.reply);
    if (log)
      *log << nlohmann::json{{"step", r.step}, {"chunk", r.chunk}, {"reply", r.reply},
                             {"prompt_tokens", r.cost.n_prompt}, {"gen_tokens", r.cost.n_gen},
                             {"seconds", r.cost.seconds}}
                  .dump()
           << '\n'
           << std::flush;
  };
  auto r = lc::readers::read_document(**reader, caller, templates, a.file, a.question, opt);
  if (prog) prog->finish();
  if (!r) return fail(r.error().message);
  fmt::print("{}\n", r->answer);
  std::fflush(stdout);
  const auto& s = r->stats;
  fmt::print(stderr,
             "reader:     {}\n"
             "document:   {} tokens in {} chunks{}\n"
             "model:      {} calls, {} tokens prefilled, {} generated\n"
             "time:       {:.2f} s, {:.1f} document tokens/s\n"
             "memory:     peak RSS {:.1f} MiB\n",
             (*reader)->spec(), s.doc_tokens, s.chunks,
             s.resumed_chunks > 0 ? fmt::format(" ({} from the checkpoint)", s.resumed_chunks) : "", s.calls,
             s.prompt_tokens, s.gen_tokens, s.seconds, s.seconds > 0 ? s.doc_tokens / s.seconds : 0.0,
             static_cast<double>(lc::peak_rss_bytes()) / (1024.0 * 1024.0));
  return 0;
}

}  // namespace

std::vector<RegisteredCommand> add_read_commands(CLI::App* app) {
  auto a = std::make_shared<ReadArgs>();
  a->so.p.temp = 0.0f;  // readers decode greedily unless told otherwise
  auto* read = app->add_subcommand(
      "read", "answer a question over a long document with a reading agent (--reader); without -m, the project's "
              "model trained on the readers' protocols (models/longctx-2l-reader.gguf)");
  a->co.add(read);
  a->so.add(read);
  read->add_option("-f,--file", a->file, "the document (streamed from disk)")->required();
  read->add_option("-q,--question", a->question, "the question")->required();
  read->add_option("--reader", a->reader, reader_flag_help())->capture_default_str();
  read->add_option("--reader-prompts", a->prompts,
                   "folder of templates replacing the compiled-in data/readers/*.txt (same file names)");
  read->add_option("--checkpoint", a->checkpoint, "file the reader's state is written to after each chunk");
  read->add_flag("--resume", a->resume, "continue from --checkpoint when it exists (same reader, question, document)");
  read->add_option("--log", a->log, "write every model call (step, chunk, reply, tokens, seconds) as JSON lines");
  read->add_option("--chat-template", a->chat_template,
                   "auto (the model's), or llama3, chatml, llama2, zephyr");
  return {{read, [a] { return cmd_read(*a); }}};
}
