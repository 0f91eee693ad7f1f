#include "kv/block_pool.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace lc {
namespace {

// RAM grows a slab at a time: slabs are at most this large, so memory follows the context
// actually used.
constexpr size_t kSlabBytes = size_t{4} << 20;
// The spill file grows (and is mapped) a segment at a time, so mapped pointers never move.
constexpr size_t kSegmentBytes = size_t{64} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

Expected<std::unique_ptr<BlockPool>> BlockPool::create(size_t block_bytes, int64_t budget_bytes,
                                                       const std::string& spill_dir) {
  if (block_bytes == 0) return make_error("kv block pool: block size is 0 bytes");
  if (budget_bytes < 0)
    return make_error(fmt::format("kv budget {} bytes is negative", budget_bytes));
  if (budget_bytes > 0 && static_cast<size_t>(budget_bytes) < (block_bytes + 63) / 64 * 64)
    return make_error(fmt::format("kv budget of {} bytes is smaller than one KV block ({} bytes): "
                                  "raise --kv-budget or lower --kv-block",
                                  budget_bytes, block_bytes));
  auto p = std::unique_ptr<BlockPool>(new BlockPool());
  p->block_bytes_ = (block_bytes + 63) / 64 * 64;  // every block 64-byte aligned
  p->budget_ = budget_bytes;
  if (!spill_dir.empty()) {
    std::string templ = spill_dir + "/longctx-kv-spill-XXXXXX";
    std::vector<char> path(templ.begin(), templ.end());
    path.push_back('\0');
    const int fd = ::mkstemp(path.data());
    if (fd < 0)
      return make_error(fmt::format("--kv-spill {}: cannot create a spill file there: {}",
                                    spill_dir, std::strerror(errno)));
    // Unlinked at once: the file lives as long as the descriptor, so no exit path (error,
    // signal, kill) leaves it behind.
    ::unlink(path.data());
    p->spill_fd_ = fd;
    p->spill_path_ = path.data();
  }
  return p;
}

BlockPool::~BlockPool() {
  for (auto& s : segments_) ::munmap(s.base, s.bytes);
  if (spill_fd_ >= 0) ::close(spill_fd_);
}

int64_t BlockPool::ram_blocks_available() const {
  if (budget_ == 0) return -1;
  const int64_t cap = budget_ / static_cast<int64_t>(block_bytes_);
  return static_cast<int64_t>(free_ram_.size()) + std::max<int64_t>(0, cap - ram_slots_total_);
}

Status BlockPool::grow_ram() {
  // Grow by a quarter of what is committed (at most a slab): RAM overshoots the tokens held
  // by at most 25% and small contexts stay small.
  int64_t n = std::clamp<int64_t>(ram_slots_total_ / 4, 1,
                                  static_cast<int64_t>(std::max<size_t>(1, kSlabBytes / block_bytes_)));
  if (budget_ > 0) {
    const int64_t cap = budget_ / static_cast<int64_t>(block_bytes_);
    n = std::min(n, cap - ram_slots_total_);
    if (n <= 0)
      return make_error(fmt::format("kv budget of {} bytes reached", budget_));
  }
  const size_t bytes = static_cast<size_t>(n) * block_bytes_;
  // Slabs of a huge page or more are aligned to huge pages and advised to use them: the sparse
  // backends read scattered blocks across gigabytes of cache, and with 4 KiB pages nearly every
  // block they pick costs a TLB miss. Where transparent huge pages are off the advice is
  // ignored.
  const bool huge = bytes >= kHugePage;
  const size_t align = huge ? kHugePage : 64;
  const size_t alloc = (bytes + align - 1) / align * align;
  void* mem = std::aligned_alloc(align, alloc);
  if (mem && huge) ::madvise(mem, alloc, MADV_HUGEPAGE);
  if (!mem)
    return make_error(fmt::format("out of memory allocating {} bytes of KV blocks (set --kv-budget "
                                  "and --kv-spill to bound RAM)", bytes));
  slabs_.emplace_back(mem);
  auto* base = static_cast<uint8_t*>(mem);
  for (int64_t i = 0; i < n; ++i) {
    ram_ptr_.push_back(base + static_cast<size_t>(i) * block_bytes_);
    ram_owner_.push_back(-1);
  }
  for (int64_t i = 0; i < n; ++i) push_free_ram(static_cast<int32_t>(ram_slots_total_ + i));
  ram_slots_total_ += n;
  return ok_status();
}

Status BlockPool::grow_file() {
  const size_t per_seg = std::max<size_t>(1, kSegmentBytes / block_bytes_);
  const size_t bytes = per_seg * block_bytes_;
  const off_t off = static_cast<off_t>(file_slots_total_) * static_cast<off_t>(block_bytes_);
  const int rc = ::posix_fallocate(spill_fd_, off, static_cast<off_t>(bytes));
  if (rc != 0)
    return make_error(fmt::format("--kv-spill: cannot reserve {} more bytes in the spill file in {}: {}",
                                  bytes, spill_path_, std::strerror(rc)));
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, spill_fd_, off);
  if (m == MAP_FAILED)
    return make_error(fmt::format("--kv-spill: cannot map the spill file: {}", std::strerror(errno)));
  segments_.push_back({static_cast<uint8_t*>(m), bytes});
  auto* base = static_cast<uint8_t*>(m);
  for (size_t i = 0; i < per_seg; ++i) file_ptr_.push_back(base + i * block_bytes_);
  for (size_t i = per_seg; i-- > 0;) free_file_.push_back(static_cast<int32_t>(file_slots_total_ + static_cast<int64_t>(i)));
  file_slots_total_ += static_cast<int64_t>(per_seg);
  return ok_status();
}

Status BlockPool::spill_one() {
  // Oldest allocation first: blocks appended long ago are the cold ones (the newest hold the
  // tokens being written and the local window every method reads).
  while (fifo_head_ < fifo_.size()) {
    const int32_t id = fifo_[fifo_head_];
    const uint64_t st = fifo_stamp_[fifo_head_];
    ++fifo_head_;
    Loc& l = locs_[static_cast<size_t>(id)];
    if (!l.used || l.spilled || alloc_stamp_[static_cast<size_t>(id)] != st) continue;
    if (free_file_.empty()) LC_TRY(grow_file());
    const int32_t fs = free_file_.back();
    free_file_.pop_back();
    uint8_t* dst = file_ptr_[static_cast<size_t>(fs)];
    std::memcpy(dst, l.ptr, block_bytes_);
    ram_owner_[static_cast<size_t>(l.slot)] = -1;
    push_free_ram(l.slot);
    l.ptr = dst;
    l.slot = fs;
    l.spilled = true;
    ++n_spilled_;
    if (fifo_head_ > 4096 && fifo_head_ * 2 > fifo_.size()) {  // compact the queue
      fifo_.erase(fifo_.begin(), fifo_.begin() + static_cast<std::ptrdiff_t>(fifo_head_));
      fifo_stamp_.erase(fifo_stamp_.begin(), fifo_stamp_.begin() + static_cast<std::ptrdiff_t>(fifo_head_));
      fifo_head_ = 0;
    }
    return ok_status();
  }
  return make_error(fmt::format("kv budget of {} bytes is smaller than one KV block ({} bytes)",
                                budget_, block_bytes_));
}

Expected<int32_t> BlockPool::allocate() {
  if (free_ram_.empty()) {
    const bool room = budget_ == 0 || ram_slots_total_ < budget_ / static_cast<int64_t>(block_bytes_);
    if (room) {
      LC_TRY(grow_ram());
    } else if (can_spill()) {
      LC_TRY(spill_one());
    } else {
      return make_error(fmt::format("kv budget of {} bytes reached", budget_));
    }
  }
  int32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int32_t>(locs_.size());
    locs_.emplace_back();
    alloc_stamp_.push_back(0);
    refs_.push_back(0);
  }
  refs_[static_cast<size_t>(id)] = 1;
  const int32_t slot = pop_free_ram();
  ram_owner_[static_cast<size_t>(slot)] = id;
  Loc& l = locs_[static_cast<size_t>(id)];
  l = Loc{ram_ptr_[static_cast<size_t>(slot)], slot, false, true};
  alloc_stamp_[static_cast<size_t>(id)] = ++stamp_;
  if (can_spill()) {
    fifo_.push_back(id);
    fifo_stamp_.push_back(stamp_);
  }
  ++n_used_;
  return id;
}

void BlockPool::add_ref(int32_t id) {
  LC_CHECK(locs_[static_cast<size_t>(id)].used);
  if (++refs_[static_cast<size_t>(id)] == 2) ++n_shared_;
}

void BlockPool::release(int32_t id) {
  Loc& l = locs_[static_cast<size_t>(id)];
  LC_CHECK(l.used);
  int32_t& r = refs_[static_cast<size_t>(id)];
  if (r == 2) --n_shared_;
  if (--r > 0) return;
  if (l.spilled) {
    free_file_.push_back(l.slot);
    --n_spilled_;
  } else {
    ram_owner_[static_cast<size_t>(l.slot)] = -1;
    push_free_ram(l.slot);
  }
  l = Loc{};
  free_ids_.push_back(id);
  --n_used_;
}

// Free RAM slots form a min-heap: the lowest slot goes out first, whatever order blocks were
// released in. After an eviction (streaming, a press, truncation) frees scattered blocks, the
// blocks of the next tokens are then taken in address order, as in a freshly filled cache,
// instead of in reverse release order: decode streams each head's blocks, and at 64K tokens a
// scattered layout read 2.6x slower than a fresh fill (docs/performance.md).
void BlockPool::push_free_ram(int32_t slot) {
  free_ram_.push_back(slot);
  std::push_heap(free_ram_.begin(), free_ram_.end(), std::greater<int32_t>());
}

int32_t BlockPool::pop_free_ram() {
  std::pop_heap(free_ram_.begin(), free_ram_.end(), std::greater<int32_t>());
  const int32_t s = free_ram_.back();
  free_ram_.pop_back();
  return s;
}

void BlockPool::poison_free() {
  for (int32_t s : free_ram_) std::memset(ram_ptr_[static_cast<size_t>(s)], 0xFF, block_bytes_);
  for (int32_t s : free_file_) std::memset(file_ptr_[static_cast<size_t>(s)], 0xFF, block_bytes_);
}

Expected<int64_t> parse_byte_size(std::string_view text) {
  auto bad = [&]() {
    return make_error(fmt::format("size '{}' is not a byte size (expected e.g. 4096, 64K, 512M, 2G, "
                                  "1.5GiB; K/M/G/T are powers of 1024)", text));
  };
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad();
  char* end = nullptr;
  const std::string num = s.substr(0, i);
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return bad();
  std::string suf = s.substr(i);
  for (auto& c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (!suf.empty()) {
    const char u = suf[0];
    std::string rest = suf.substr(1);
    if (u == 'B' && rest.empty()) mult = 1;
    else {
      if (u == 'K') mult = 1024.0;
      else if (u == 'M') mult = 1024.0 * 1024;
      else if (u == 'G') mult = 1024.0 * 1024 * 1024;
      else if (u == 'T') mult = 1024.0 * 1024 * 1024 * 1024;
      else return bad();
      if (!(rest.empty() || rest == "B" || rest == "IB")) return bad();
    }
  }
  const double bytes = v * mult;
  if (bytes > 9.0e18) return bad();
  return static_cast<int64_t>(bytes);
}

}  // namespace lc
