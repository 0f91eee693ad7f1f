// A pool of fixed-size KV blocks in two tiers: RAM (grown slab by slab, capped by a byte
// budget) and, optionally, a spill file (cold blocks moved there when the RAM cap is reached).
//
// Why two tiers behind one id: the cache's block tables hold ids, never pointers, so a block can
// move from RAM to the spill file without any table changing. A spilled block stays readable
// and writable through a MAP_SHARED mapping of the file: the kernel pages it in and out (clean
// file pages are reclaimable), so a context larger than RAM runs instead of being OOM-killed.
// Disk space is reserved with posix_fallocate before a segment is mapped, so a full disk is an
// error value, never a SIGBUS.
//
// The spill file is unlinked right after it is created: it lives exactly as long as the open
// descriptor, so it is removed on exit, on error and even on a kill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lc {

class BlockPool {
 public:
  // block_bytes: bytes of one block; budget_bytes: cap on RAM-tier bytes (0: no cap);
  // spill_dir: empty for no spill tier.
  static Expected<std::unique_ptr<BlockPool>> create(size_t block_bytes, int64_t budget_bytes,
                                                     const std::string& spill_dir);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block id, or an error when the budget is reached and there is no spill tier (the
  // message names the budget; the cache adds how many tokens fit).
  Expected<int32_t> allocate();
  // Drops one reference to the block; the block is free when none is left.
  void release(int32_t id);
  // Blocks shared between caches (the server's slots share the full blocks of a common
  // prefix, KvCache::adopt_prefix): another reference to a block in use, and how many it has.
  // A block with more than one reference is never written: its holders copy it first.
  void add_ref(int32_t id);
  int32_t refs(int32_t id) const { return refs_[static_cast<size_t>(id)]; }
  int64_t n_shared() const { return n_shared_; }  // blocks with more than one reference

  // Blocks that can still be allocated without spilling (free RAM slots plus room under the
  // budget); -1 when unlimited.
  int64_t ram_blocks_available() const;
  bool can_spill() const { return spill_fd_ >= 0; }

  uint8_t* data(int32_t id) { return locs_[static_cast<size_t>(id)].ptr; }
  const uint8_t* data(int32_t id) const { return locs_[static_cast<size_t>(id)].ptr; }
  bool spilled(int32_t id) const { return locs_[static_cast<size_t>(id)].spilled; }

  size_t block_bytes() const { return block_bytes_; }
  int64_t budget_bytes() const { return budget_; }
  // Accounting: every id is either in use or free; in-use ids are either in RAM or spilled.
  int64_t n_used() const { return n_used_; }
  int64_t n_spilled() const { return n_spilled_; }
  int64_t n_ids() const { return static_cast<int64_t>(locs_.size()); }
  int64_t n_free_ids() const { return static_cast<int64_t>(free_ids_.size()); }
  int64_t ram_slots() const { return ram_slots_total_; }          // committed RAM slots
  int64_t ram_slots_free() const { return static_cast<int64_t>(free_ram_.size()); }
  size_t ram_bytes() const { return static_cast<size_t>(ram_slots_total_) * block_bytes_; }
  size_t spilled_bytes() const { return static_cast<size_t>(n_spilled_) * block_bytes_; }
  size_t spill_file_bytes() const { return static_cast<size_t>(file_slots_total_) * block_bytes_; }
  const std::string& spill_path() const { return spill_path_; }

  // Tests: fills every free RAM slot and free file slot with 0xFF bytes (NaN in f32, f16,
  // bf16 and in q8_0 scales), so a read of storage that holds no token shows up.
  void poison_free();

 private:
  BlockPool() = default;
  struct Loc {
    uint8_t* ptr = nullptr;
    int32_t slot = -1;  // RAM slot or file slot index
    bool spilled = false;
    bool used = false;
  };
  Status grow_ram();
  Status grow_file();
  Status spill_one();  // moves the oldest RAM-resident block to the file
  void push_free_ram(int32_t slot);
  int32_t pop_free_ram();  // the lowest free slot

  size_t block_bytes_ = 0;
  int64_t budget_ = 0;
  std::vector<Loc> locs_;              // [n_ids]
  std::vector<int32_t> refs_;          // [n_ids] references to each block in use
  int64_t n_shared_ = 0;
  std::vector<int32_t> free_ids_;
  // RAM tier: slabs of blocks; slot s is at ram_ptr_[s].
  std::vector<std::unique_ptr<void, AlignedFree>> slabs_;
  std::vector<uint8_t*> ram_ptr_;      // [ram_slots_total_]
  std::vector<int32_t> ram_owner_;     // [ram_slots_total_] id in the slot, -1 if free
  std::vector<int32_t> free_ram_;      // min-heap of free slots (push_free_ram / pop_free_ram)
  int64_t ram_slots_total_ = 0;
  // Allocation order of RAM-resident ids (oldest first): the spill victims. Entries whose id
  // has since been released or spilled are skipped lazily.
  std::vector<int32_t> fifo_;
  std::vector<uint64_t> alloc_stamp_;  // [n_ids] stamp of the allocation fifo_ refers to
  std::vector<uint64_t> fifo_stamp_;   // [fifo_.size()]
  size_t fifo_head_ = 0;
  uint64_t stamp_ = 0;
  // Spill tier.
  int spill_fd_ = -1;
  std::string spill_path_;
  struct Segment {
    uint8_t* base = nullptr;
    size_t bytes = 0;
  };
  std::vector<Segment> segments_;
  std::vector<uint8_t*> file_ptr_;     // [file_slots_total_]
  std::vector<int32_t> free_file_;
  int64_t file_slots_total_ = 0;
  int64_t n_used_ = 0, n_spilled_ = 0;
};

// Parses a byte size: "512M", "2G", "1.5GiB", "4096", "64k" (K/M/G/T, binary multiples,
// optional "B"/"iB"). Errors name the text and the accepted forms.
Expected<int64_t> parse_byte_size(std::string_view text);

}  // namespace lc
