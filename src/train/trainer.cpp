#include "train/trainer.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/sys.h"
#include "gguf/gguf.h"
#include "kernels/blas_cpu.h"
#include "kernels/kernels.h"
#include "train/export.h"

namespace lc::train {
namespace {

constexpr char kMagic[8] = {'L', 'C', 'T', 'R', 'A', 'I', 'N', '1'};
constexpr uint32_t kVersion = 1;

// Little-endian (host order on x86-64) field-by-field serialisation of the checkpoint.
class Out {
 public:
  template <class V>
  void put(const V& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(V));
  }
  void put_floats(const float* p, size_t n) {
    const auto* q = reinterpret_cast<const uint8_t*>(p);
    b.insert(b.end(), q, q + n * sizeof(float));
  }
  std::vector<uint8_t> b;
};

class In {
 public:
  In(const std::string& s, const std::string& path) : s_(s), path_(path) {}
  template <class V>
  Status get(V* v) {
    if (pos_ + sizeof(V) > s_.size()) return truncated();
    std::memcpy(v, s_.data() + pos_, sizeof(V));
    pos_ += sizeof(V);
    return ok_status();
  }
  Status get_floats(float* p, size_t n) {
    if (n > (s_.size() - pos_) / sizeof(float)) return truncated();
    std::memcpy(p, s_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return ok_status();
  }
  bool at_end() const { return pos_ == s_.size(); }

 private:
  Status truncated() const {
    return make_error(fmt::format("checkpoint '{}' is truncated or corrupt", path_));
  }
  const std::string& s_;
  const std::string& path_;
  size_t pos_ = 0;
};

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const long long t = static_cast<long long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace

Expected<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& in) {
  TrainOptions o = in;
  if (o.vocab_path.empty()) return make_error("no vocabulary GGUF given (--vocab)");
  if (o.data_path.empty() && o.curriculum.empty())
    return make_error("no training data given (--data or --curriculum)");
  if (o.seq_len < 1 || o.seq_len > (1 << 16))
    return make_error(fmt::format("sequence length {} is out of range [1, 65536]", o.seq_len));
  if (o.batch < 1 || o.batch > (1 << 16))
    return make_error(fmt::format("batch {} is out of range [1, 65536]", o.batch));
  if (o.chunk > 0 && o.model.fixed_distance > 0)
    return make_error("--fixed-distance is not supported with --chunk (the chunk-recurrent attention reads its "
                      "paged keys at their real distances)");
  if (o.chunk < 0 || o.chunk > o.seq_len)
    return make_error(fmt::format("--chunk {} must be in [1, --seq-len = {}] (0: the whole window at once)",
                                  o.chunk, o.seq_len));
  if (o.checkpoint_every < 0) return make_error("checkpoint interval must be >= 0");
  if (o.n_threads < 0 || o.n_threads > 1024)
    return make_error(fmt::format("thread count {} is out of range [0, 1024]", o.n_threads));
  if (o.resume && o.checkpoint_dir.empty()) return make_error("--resume needs a checkpoint directory");
  LC_TRY(validate(o.optim));

  std::unique_ptr<Trainer> tr(new Trainer());
  auto vocab = gguf::File::open(o.vocab_path);
  if (!vocab) return make_error("vocabulary: " + vocab.error().message);
  tr->vocab_ = std::move(*vocab);
  auto tok = Tokenizer::from_gguf(*tr->vocab_);
  if (!tok) return make_error(fmt::format("vocabulary '{}': {}", o.vocab_path, tok.error().message));
  tr->tok_ = std::move(*tok);
  o.model.n_vocab = tr->tok_->n_vocab();
  if (o.model.n_ctx == 0) o.model.n_ctx = o.seq_len;
  if (o.seq_len > o.model.n_ctx)
    return make_error(fmt::format("sequence length {} exceeds the model context {}", o.seq_len,
                                  o.model.n_ctx));
  LC_ASSIGN_OR_RETURN(o.model, resolve_config(o.model));
  if (!o.data_path.empty()) {
    LC_ASSIGN_OR_RETURN(tr->data_, TokenData::load(o.data_path, o.data_format, *tr->tok_));
  }
  if (!o.curriculum.empty()) {
    CurriculumOptions co;
    LC_ASSIGN_OR_RETURN(co.tasks, parse_curriculum(o.curriculum));
    co.min_len = std::min(o.cur_min_len, o.seq_len);
    co.max_len = o.seq_len;
    co.ramp = o.cur_ramp;
    co.lm_fraction = o.cur_lm;
    co.hard_values = o.cur_hard_values;
    co.alphabet = o.cur_alphabet;
    co.total_steps = o.optim.steps;
    LC_ASSIGN_OR_RETURN(tr->cur_, Curriculum::create(*tr->tok_, co, o.data_path.empty() ? nullptr : &tr->data_));
    // A warm-up over part of the vocabulary never shows the other pieces, and the softmax
    // pushes all of their (tied) embeddings the same way, by Adam's full step size: they
    // collapse onto one direction with eight times the norm of the used ones (docs/model.md).
    // They stay as initialised instead, distinct, for the stages that use them.
    const std::vector<int32_t> used = tr->cur_->warmup_pieces();
    if (!used.empty())
      for (int32_t id = 0; id < tr->tok_->n_vocab(); ++id)
        if (!std::binary_search(used.begin(), used.end(), id)) tr->frozen_rows_.push_back(id);
  } else if (tr->data_.size() < o.seq_len + 1)
    return make_error(fmt::format("data '{}' has {} tokens; one training window needs seq_len + 1 = {}",
                                  o.data_path, tr->data_.size(), o.seq_len + 1));

  tr->pool_ = std::make_unique<ThreadPool>(o.n_threads > 0 ? o.n_threads : default_thread_count());
  // Chunk-recurrent: chunked_ keeps one chunk's activations and the K/V pool; the model then
  // holds the parameters and gradients, its whole-window buffers sized for a single token (at
  // the chunk size they would be ~40 MiB that nothing uses, at 512 tokens and n_embd 128).
  LC_ASSIGN_OR_RETURN(tr->model_, Transformer<float>::create(o.model, o.chunk > 0 ? 1 : o.seq_len));
  if (o.chunk > 0) {
    LC_ASSIGN_OR_RETURN(tr->chunked_, ChunkRecurrent<float>::create(*tr->model_, o.chunk, o.seq_len));
    LC_TRY(tr->chunked_->reserve(o.seq_len));
  }
  try {
    tr->adam_ = std::make_unique<AdamW>(tr->model_->n_params());
  } catch (const std::bad_alloc&) {
    return make_error("out of memory allocating the optimizer state");
  }
  tr->inputs_.assign(static_cast<size_t>(o.seq_len * o.batch), 0);
  tr->targets_.assign(static_cast<size_t>(o.seq_len * o.batch), 0);
  tr->o_ = o;
  tr->model_->init(o.seed, o.init_std);
  tr->rng_ = Rng(o.seed ^ 0xDA7A5EEDull);  // data order: its own stream, saved in checkpoints
  if (!o.init_from.empty()) {
    if (o.resume) return make_error("--init-from and --resume exclude each other (a checkpoint holds the weights)");
    LC_TRY(tr->load_weights(o.init_from));
  }
  if (o.resume) LC_TRY(tr->load_checkpoint(tr->checkpoint_path()));
  tr->t_start_ = now_seconds();
  return tr;
}

StepRecord Trainer::step() {
  const double t0 = now_seconds();
  const int64_t T = o_.seq_len, B = o_.batch;
  const float lr = learning_rate(o_.optim, step_);
  Transformer<float>& m = *model_;
  m.zero_grads();
  double loss = 0;
  // The loss is the mean over the batch's windows of each window's mean over its scored tokens,
  // so that a task sequence whose only scored tokens are a short answer counts as much as a
  // window of plain text. (With plain data every token is scored and this is the plain mean.)
  std::vector<int64_t> lens(static_cast<size_t>(B), T);
  int64_t windows = 0;
  for (int64_t b = 0; b < B; ++b) {
    int32_t* in = inputs_.data() + b * T;
    int32_t* tg = targets_.data() + b * T;
    ++windows;
    if (!cur_) {
      data_.sample(rng_, T, in, tg);
      continue;
    }
    for (int attempt = 0;; ++attempt) {
      auto cs = cur_->sample(rng_, step_, in, tg);
      if (cs && cs->n_scored > 0) {
        lens[static_cast<size_t>(b)] = cs->n;
        break;
      }
      if (attempt == 16) {  // create() drew every task: this does not happen in practice
        if (data_error_.is_ok()) data_error_ = cs ? make_error("curriculum: no scored tokens") : cs.error();
        lens[static_cast<size_t>(b)] = 0;
        --windows;
        break;
      }
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[static_cast<size_t>(b)];
    if (n == 0) continue;
    const int32_t* in = inputs_.data() + b * T;
    const int32_t* tg = targets_.data() + b * T;
    int64_t scored = 0;
    for (int64_t t = 0; t < n; ++t) scored += tg[t] >= 0;
    const float scale = 1.0f / static_cast<float>(windows * scored);
    if (chunked_) {
      loss += chunked_->forward(in, tg, n, *pool_);
      chunked_->backward(scale, *pool_);
    } else {
      loss += m.forward(in, tg, n, *pool_);
      m.backward(scale, *pool_);
    }
  }
  loss /= static_cast<double>(std::max<int64_t>(windows, 1));
  if (!frozen_rows_.empty()) {  // AdamW then moves them only by weight decay (none in a warm-up)
    for (const ParamTensor& pt : m.tensors()) {
      if (pt.name != "token_embd.weight" && pt.name != "output.weight") continue;
      const size_t row = static_cast<size_t>(pt.ne[0]);
      for (int32_t id : frozen_rows_) std::fill_n(m.grads() + pt.offset + static_cast<size_t>(id) * row, row, 0.0f);
    }
  }
  const double norm = global_norm(m.grads(), m.n_params(), *pool_);
  if (o_.optim.grad_clip > 0 && norm > o_.optim.grad_clip) {
    const float f = static_cast<float>(o_.optim.grad_clip / norm);
    float* g = m.grads();
    pool_->parallel_for(static_cast<int64_t>(m.n_params()), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) g[i] *= f;
    }, 1024);
  }
  adam_->update(o_.optim, lr, m.params(), m.grads(), m.tensors(), *pool_);
  ++step_;
  const double t1 = now_seconds();
  StepRecord r;
  r.step = step_;
  r.loss = loss;
  r.lr = lr;
  r.grad_norm = norm;
  int64_t tokens = 0;
  for (int64_t n : lens) tokens += n;
  tokens_done_ += tokens;
  r.tokens_per_s = static_cast<double>(tokens) / std::max(t1 - t0, 1e-9);
  r.elapsed_s = elapsed_before_ + (t1 - t_start_);
  history_.push_back(r);
  return r;
}

std::string Trainer::checkpoint_path() const {
  return (std::filesystem::path(o_.checkpoint_dir) / "checkpoint.bin").string();
}

Status Trainer::save_checkpoint(const std::string& path) const {
  const ModelConfig& c = model_->config();
  Out w;
  for (char ch : kMagic) w.put(ch);
  w.put(kVersion);
  for (int64_t v : {c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.n_vocab, c.n_ctx}) w.put(v);
  w.put(c.rope_base);
  w.put(c.rms_eps);
  w.put(static_cast<uint8_t>(c.tied));
  w.put(o_.seq_len);
  w.put(o_.batch);
  w.put(o_.seed);
  w.put(step_);
  w.put(adam_->t());
  const RngState& rs = rng_.state();
  w.put(rs.s);
  w.put(rs.spare);
  w.put(rs.have_spare);
  w.put(history_.empty() ? 0.0 : history_.back().elapsed_s);
  const uint64_t n = model_->n_params();
  w.put(n);
  w.put_floats(model_->params(), n);
  w.put_floats(adam_->m(), n);
  w.put_floats(adam_->v(), n);
  w.put(static_cast<uint64_t>(history_.size()));
  for (const StepRecord& r : history_) {
    w.put(r.step);
    w.put(r.loss);
    w.put(r.lr);
    w.put(r.grad_norm);
    w.put(r.tokens_per_s);
    w.put(r.elapsed_s);
  }
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(fmt::format("cannot write checkpoint '{}': {}", tmp, std::strerror(errno)));
  const bool ok = std::fwrite(w.b.data(), 1, w.b.size(), f) == w.b.size();
  if (std::fclose(f) != 0 || !ok) return make_error(fmt::format("write error on checkpoint '{}'", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
  return ok_status();
}

// Weights of an earlier stage (any exported or converted `llama` GGUF of exactly this shape),
// dequantised to f32; the optimizer state and the step start afresh.
Status Trainer::load_weights(const std::string& path) {
  LC_ASSIGN_OR_RETURN(auto f, gguf::File::open(path));
  auto& m = *model_;
  std::vector<float> row;
  for (const auto& t : m.tensors()) {
    const gguf::TensorInfo* ti = f->find_tensor(t.name);
    if (!ti) return make_error(fmt::format("--init-from '{}' has no tensor '{}'", path, t.name));
    bool same = ti->n_dims == static_cast<int>(t.ne.size());
    for (size_t i = 0; same && i < t.ne.size(); ++i) same = ti->ne[i] == t.ne[i];
    if (!same) {
      std::string want, have;
      for (int64_t v : t.ne) want += (want.empty() ? "" : " x ") + std::to_string(v);
      for (int i = 0; i < ti->n_dims; ++i) have += (have.empty() ? "" : " x ") + std::to_string(ti->ne[i]);
      return make_error(fmt::format("--init-from '{}': tensor '{}' is {}, this model's is {}", path,
                                    t.name, have, want));
    }
    const int64_t cols = t.ne[0], rows = static_cast<int64_t>(t.size) / cols;
    const size_t rb = row_bytes(ti->type, cols);
    if (rb == 0 || ti->n_bytes < rb * static_cast<size_t>(rows))
      return make_error(fmt::format("--init-from '{}': tensor '{}' has an unsupported type or too few bytes",
                                    path, t.name));
    float* dst = m.params() + t.offset;
    for (int64_t r = 0; r < rows; ++r) kernels::dequantize_row(ti->type, ti->data + r * rb, dst + r * cols, cols);
  }
  for (const auto& ti : f->tensors())
    if (!m.find(ti.name))
      return make_error(fmt::format("--init-from '{}' has tensor '{}', which this model does not (another shape?)",
                                    path, ti.name));
  return ok_status();
}

Status Trainer::load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(fmt::format("checkpoint '{}' cannot be opened: {}", path, std::strerror(errno)));
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  In r(s, path);
  char magic[8];
  for (char& ch : magic) LC_TRY(r.get(&ch));
  uint32_t version = 0;
  LC_TRY(r.get(&version));
  if (std::memcmp(magic, kMagic, 8) != 0 || version != kVersion)
    return make_error(fmt::format("'{}' is not a longctx training checkpoint (version {})", path, kVersion));
  const ModelConfig& c = model_->config();
  const char* names[] = {"n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab", "n_ctx"};
  const int64_t have[] = {c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.n_vocab, c.n_ctx};
  for (int i = 0; i < 7; ++i) {
    int64_t v = 0;
    LC_TRY(r.get(&v));
    if (v != have[i])
      return make_error(fmt::format("checkpoint '{}' has {} = {} but this run asks for {}", path,
                                    names[i], v, have[i]));
  }
  float base = 0, eps = 0;
  uint8_t tied = 0;
  LC_TRY(r.get(&base));
  LC_TRY(r.get(&eps));
  LC_TRY(r.get(&tied));
  if (base != c.rope_base || eps != c.rms_eps || (tied != 0) != c.tied)
    return make_error(fmt::format("checkpoint '{}' differs from this run in rope base, rms eps or output tying",
                                  path));
  int64_t seq_len = 0, batch = 0;
  uint64_t seed = 0;
  LC_TRY(r.get(&seq_len));
  LC_TRY(r.get(&batch));
  LC_TRY(r.get(&seed));
  if (seq_len != o_.seq_len || batch != o_.batch || seed != o_.seed)
    return make_error(fmt::format("checkpoint '{}' was made with seq_len {}, batch {}, seed {}; this run "
                                  "asks for {}, {}, {}", path, seq_len, batch,
                                  seed, o_.seq_len, o_.batch,
                                  o_.seed));
  int64_t step = 0, adam_t = 0;
  LC_TRY(r.get(&step));
  LC_TRY(r.get(&adam_t));
  RngState rs;
  LC_TRY(r.get(&rs.s));
  LC_TRY(r.get(&rs.spare));
  LC_TRY(r.get(&rs.have_spare));
  double elapsed = 0;
  LC_TRY(r.get(&elapsed));
  uint64_t n = 0;
  LC_TRY(r.get(&n));
  if (n != model_->n_params())
    return make_error(fmt::format("checkpoint '{}' holds {} parameters, the model {}", path,
                                  n, model_->n_params()));
  LC_TRY(r.get_floats(model_->params(), n));
  LC_TRY(r.get_floats(adam_->m(), n));
  LC_TRY(r.get_floats(adam_->v(), n));
  uint64_t nh = 0;
  LC_TRY(r.get(&nh));
  if (nh > static_cast<uint64_t>(step)) return make_error(fmt::format("checkpoint '{}' is corrupt", path));
  std::vector<StepRecord> hist(nh);
  for (StepRecord& h : hist) {
    LC_TRY(r.get(&h.step));
    LC_TRY(r.get(&h.loss));
    LC_TRY(r.get(&h.lr));
    LC_TRY(r.get(&h.grad_norm));
    LC_TRY(r.get(&h.tokens_per_s));
    LC_TRY(r.get(&h.elapsed_s));
  }
  if (!r.at_end()) return make_error(fmt::format("checkpoint '{}' has trailing bytes", path));
  step_ = step;
  adam_->set_t(adam_t);
  rng_ = Rng(rs);
  elapsed_before_ = elapsed;
  history_ = std::move(hist);
  t_start_ = now_seconds();
  return ok_status();
}

Status Trainer::export_model(const std::string& path) const { return export_gguf(*model_, *vocab_, path); }

std::string Trainer::loss_file_stem(const std::string& out_path) {
  std::string s = out_path;
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".gguf") == 0) s.resize(s.size() - 5);
  return s;
}

Status Trainer::write_loss_files(const std::string& out_path) const {
  const std::string stem = loss_file_stem(out_path);
  LC_TRY(write_text_file(stem + ".loss.csv", loss_csv(history_)));
  // Short enough for the chart's width: layers, width, window, batch (and chunk).
  const ModelConfig& c = model_->config();
  const std::string title =
      fmt::format("{} layers, n_embd {}, seq {} x batch {}{}", c.n_layer, c.n_embd,
                  o_.seq_len, o_.batch,
                  o_.chunk > 0 ? fmt::format(", chunk {}", o_.chunk) : "");
  return write_loss_chart(history_, title, stem + ".loss");
}

Status Trainer::run() {
  if (!o_.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o_.checkpoint_dir, ec);
    if (ec) return make_error(fmt::format("checkpoint directory '{}': {}", o_.checkpoint_dir, ec.message()));
  }
  const int64_t total = o_.optim.steps;
  const bool tty = o_.verbose && stderr_is_terminal();
  const int64_t log_every = std::max<int64_t>(1, total / 20);
  if (o_.verbose) {
    const std::string data = cur_ ? fmt::format("curriculum {}, {}..{} tokens",
                                                curriculum_to_string(cur_->options().tasks),
                                                cur_->options().min_len, cur_->options().max_len)
                                  : fmt::format("{} tokens of data", data_.size());
    fmt::print(stderr, "train: {}; {} parameters; {}; seq {} x batch {}; {} threads, OpenBLAS {} kernels{}\n",
               describe(model_->config()), model_->n_params(), data,
               o_.seq_len, o_.batch, pool_->size(), kernels::blas_core_name(),
               step_ > 0 ? fmt::format("; resuming at step {}", step_) : "");
  }
  const int64_t first = step_;
  const double t0 = now_seconds();
  double last_print = 0;
  // --stop-at: end this process at that step (checkpoint and export as at the end); the
  // schedule still follows --steps, so a later --resume continues the same run.
  const int64_t last = o_.stop_at > 0 ? std::min(o_.stop_at, total) : total;
  while (step_ < last) {
    const StepRecord r = step();
    if (!data_error_.is_ok()) return data_error_;
    const double el = now_seconds() - t0;
    const double tps = static_cast<double>(tokens_done_) / std::max(el, 1e-9);
    const double eta = el / static_cast<double>(step_ - first) * static_cast<double>(last - step_);
    if (!std::isfinite(r.loss))
      return make_error(fmt::format("the loss diverged ({:g}) at step {}: lower --lr or raise --warmup", r.loss,
                                    r.step));
    const std::string line = fmt::format("step {}/{}  loss {:.4f}  lr {:.2e}  {:.0f} tok/s  ETA {}", r.step,
                                         total, r.loss, static_cast<double>(r.lr), tps,
                                         format_duration(eta));
    if (tty && (el - last_print >= 0.2 || step_ == last)) {
      fmt::print(stderr, "\r\033[Ktrain: {}", line);
      std::fflush(stderr);
      last_print = el;
    } else if (o_.verbose && !tty && (r.step % log_every == 0 || step_ == last)) {
      fmt::print(stderr, "train: {}\n", line);
    }
    if (!o_.checkpoint_dir.empty() && o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0 && step_ < last) {
      LC_TRY(save_checkpoint(checkpoint_path()));
      if (!o_.out_path.empty()) {  // the model so far, so that a long run can be evaluated as it goes
        LC_TRY(export_model(o_.out_path));
        LC_TRY(write_loss_files(o_.out_path));
      }
    }
  }
  if (tty) fmt::print(stderr, "\n");
  if (!o_.checkpoint_dir.empty()) LC_TRY(save_checkpoint(checkpoint_path()));
  if (!o_.out_path.empty()) {
    LC_TRY(export_model(o_.out_path));
    LC_TRY(write_loss_files(o_.out_path));
    if (o_.verbose) {
      const std::string stem = loss_file_stem(o_.out_path);
      fmt::print(stderr, "train: wrote {}, {}.loss.csv, .svg, .png\n", o_.out_path, stem);
    }
  }
  return ok_status();
}

}  // namespace lc::train
