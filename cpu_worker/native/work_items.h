// The items of one layer's CPU part: equal runs of blocks, and the merge of a cut list's pieces by LSE.
//
// A CPU part holds rows x Hkv block lists of any lengths. Laid end to end (row-major, then KV head) they are
// one run of `total` blocks, and item i is blocks [i * chunk, (i + 1) * chunk) of it (the last item: up to
// the end). So every item but the last reads exactly `chunk` blocks, whatever the batch and the list
// lengths, and a thread that claims one claims a known amount of memory traffic:
//
//   lists   |--row 0, h 0--|-h 1-||-h 2-|----------row 1, h 0----------|-h 1-|   (|| an empty list)
//   items   |  item 0   |  item 1   |  item 2   |  item 3   |  item 4  |
//
// chunk = max(min_item_blocks, ceil(total / (kItemsPerThread x threads, at least kMinItems))): with n >= 5
// items the largest is at most n / (n - 1) <= 1.25x the mean. A list inside one item is written straight
// to its output rows. A list that crosses item boundaries is cut: each piece writes its partial (O, LSE)
// to a slot of the job's scratch (item i's slot 2i for the list it continues, 2i + 1 for the list it starts
// and does not finish), and whichever thread finishes the list's last piece merges its pieces into the
// output rows:
//
//   m = max_s lse_s;  w_s = exp(lse_s - m);  o = sum_s w_s o_s / sum_s w_s;  lse = m + log(sum_s w_s)
//
// (o_s normalised; an empty piece has lse_s = -inf and weight 0; all empty gives o = 0, lse = -inf, as an
// empty list does.) Reference: reference.merge_states over the pieces' (o, lse). An empty list belongs to the
// item its position falls in; a part with no block at all is one item, which writes the empty results.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kMinItems = 8;

// Items a part of `threads` threads is cut into at most (what a layer's scratch is sized for).
inline int64_t max_items(int64_t threads) { return std::max<int64_t>(kMinItems, kItemsPerThread * threads); }

struct ItemPlan {
  int64_t lists = 0;  // rows x Hkv
  int64_t total = 0;  // blocks of every list
  int64_t chunk = 1;  // blocks of an item (the last: what is left)
  int64_t items = 0;
  std::vector<int64_t> start;  // [lists + 1]: list j is blocks [start[j], start[j + 1]) of the run

  // The item that holds block `block` of the run (a position at the end: the last item).
  int64_t item_of(int64_t block) const { return std::min(block / chunk, items - 1); }
  // The first and last item of list j.
  int64_t first_item(int64_t j) const { return item_of(start[j]); }
  int64_t last_item(int64_t j) const { return start[j + 1] > start[j] ? item_of(start[j + 1] - 1) : first_item(j); }
  bool cut(int64_t j) const { return last_item(j) != first_item(j); }
  // Blocks [lo, hi) of item i.
  int64_t item_begin(int64_t i) const { return i * chunk; }
  int64_t item_end(int64_t i) const { return i == items - 1 ? total : std::min(total, (i + 1) * chunk); }
  // The first list item i holds: the first that ends past its start, or an empty one at its start.
  int64_t first_list(int64_t i) const {
    const int64_t lo = item_begin(i);
    const auto at = std::lower_bound(start.begin(), start.begin() + lists, lo);  // first list starting at lo+
    const auto past = std::upper_bound(start.begin() + 1, start.begin() + lists + 1, lo);  // first ending past lo
    return std::min(at - start.begin(), (past - start.begin()) - 1);
  }
};

// counts[j] for the lists j in [0, lists) -> plan (its `start` storage reused: no allocation once sized).
// Returns the first list whose count is outside [0, capacity] (the part is not attended then), or -1.
inline int64_t plan_items(const int32_t* counts, int64_t lists, int64_t capacity, int64_t threads,
                          int64_t min_item_blocks, ItemPlan& plan) {
  plan.lists = lists;
  if (static_cast<int64_t>(plan.start.size()) < lists + 1) plan.start.resize(lists + 1);
  plan.start[0] = 0;
  for (int64_t j = 0; j < lists; ++j) {
    const int32_t count = counts[j];
    if (count < 0 || count > capacity) return j;
    plan.start[j + 1] = plan.start[j] + count;
  }
  plan.total = plan.start[lists];
  const int64_t target = max_items(threads);
  plan.chunk = std::max<int64_t>({1, min_item_blocks, (plan.total + target - 1) / target});
  plan.items = plan.total == 0 ? (lists > 0 ? 1 : 0) : (plan.total + plan.chunk - 1) / plan.chunk;
  return -1;
}

// Merge `pieces` partial (o [G, D], lse [G]) results, at o_at(s) / lse_at(s) for piece s, into out_o [G, D]
// and out_lse [G].
template <typename OAt, typename LseAt>
inline void merge_pieces(int64_t pieces, OAt o_at, LseAt lse_at, int64_t group_size, int64_t head_dim,
                         float* out_o, float* out_lse) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < group_size; ++g) {
    float m = neg_inf;
    for (int64_t s = 0; s < pieces; ++s) m = std::max(m, lse_at(s)[g]);
    float* dst = out_o + g * head_dim;
    std::fill(dst, dst + head_dim, 0.0f);
    if (m == neg_inf) {
      out_lse[g] = neg_inf;
      continue;
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < pieces; ++s) {
      const float w = std::exp(lse_at(s)[g] - m);
      if (w == 0.0f) continue;
      sum += w;
      const float* src = o_at(s) + g * head_dim;
      for (int64_t i = 0; i < head_dim; ++i) dst[i] += w * src[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < head_dim; ++i) dst[i] *= inv;
    out_lse[g] = m + std::log(sum);
  }
}

}  // namespace
