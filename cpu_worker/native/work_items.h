// The items of one layer's CPU part, of balanced bytes, and the merge of a list's block ranges by LSE.
//
// A CPU part holds rows x Hkv block lists of different lengths. Items are cut to about
// chunk = total blocks / (4 x threads) blocks each (never fewer than min_split_blocks):
//   - short lists of one row are grouped, consecutive KV heads together, until the group reaches the chunk:
//     one kernel call then walks them as one run of blocks, prefetching across the heads (one item per list
//     would restart the prefetch every few blocks);
//   - a list longer than the chunk is cut into block ranges (at most kMaxSplits): several threads share one
//     long request (one request on a 64-core host, or one list much longer than the rest). Each range writes
//     its partial O and LSE to the job's scratch, and the thread that finishes a list's last range merges
//     them into the list's output rows:
//
//   m = max_s lse_s;  w_s = exp(lse_s - m);  o = sum_s w_s o_s / sum_s w_s;  lse = m + log(sum_s w_s)
//
// (o_s are already normalised; an empty range has lse_s = -inf and weight 0; all empty gives o = 0, lse = -inf,
// as an empty list does.) Reference: reference.merge_states over the ranges' (o, lse). min_split_blocks = 0
// gives one item per list.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kMaxSplits = 16;
constexpr int64_t kItemsPerThread = 4;

struct WorkItem {
  int32_t row = 0, head_begin = 0, head_end = 1, split = 0, splits = 1;
  int64_t list = -1;  // index of the list's partials in the job's scratch when splits > 1
};

struct WorkPlan {
  std::vector<WorkItem> items;
  std::vector<int32_t> ranges_left;  // per cut list: ranges not yet finished
};

// counts[row * num_kv_heads + head] for rows [0, rows); a count outside [0, capacity] is its own item, which
// reports it.
inline WorkPlan plan_items(const int32_t* counts, int64_t rows, int64_t num_kv_heads, int64_t capacity,
                           int64_t threads, int64_t min_split_blocks) {
  WorkPlan plan;
  auto valid = [&](int64_t count) { return count >= 0 && count <= capacity; };
  int64_t total = 0;
  for (int64_t i = 0; i < rows * num_kv_heads; ++i) total += valid(counts[i]) ? counts[i] : 0;
  const int64_t target = std::max<int64_t>(1, kItemsPerThread * threads);
  const int64_t chunk = std::max<int64_t>({1, min_split_blocks, (total + target - 1) / target});
  auto add = [&](int64_t row, int64_t begin, int64_t end) {
    plan.items.push_back(WorkItem{static_cast<int32_t>(row), static_cast<int32_t>(begin),
                                  static_cast<int32_t>(end), 0, 1, -1});
  };
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t* row_counts = counts + row * num_kv_heads;
    int64_t begin = 0, blocks = 0;  // the open group of heads [begin, head) and its blocks
    for (int64_t head = 0; head < num_kv_heads; ++head) {
      const int64_t count = row_counts[head];
      const bool cut = min_split_blocks > 0 && valid(count) && count > chunk;
      if (min_split_blocks <= 0 || !valid(count) || cut) {  // its own item(s); close the open group first
        if (head > begin) add(row, begin, head);
        begin = head + 1;
        blocks = 0;
        if (!cut) {
          add(row, head, head + 1);
          continue;
        }
        const int64_t splits = std::min(kMaxSplits, (count + chunk - 1) / chunk);
        WorkItem item{static_cast<int32_t>(row), static_cast<int32_t>(head), static_cast<int32_t>(head + 1), 0,
                      static_cast<int32_t>(splits), static_cast<int64_t>(plan.ranges_left.size())};
        plan.ranges_left.push_back(static_cast<int32_t>(splits));
        for (int64_t s = 0; s < splits; ++s) {
          item.split = static_cast<int32_t>(s);
          plan.items.push_back(item);
        }
        continue;
      }
      blocks += count;
      if (blocks >= chunk) {  // the group is full: close it with this head
        add(row, begin, head + 1);
        begin = head + 1;
        blocks = 0;
      }
    }
    if (num_kv_heads > begin) add(row, begin, num_kv_heads);
  }
  return plan;
}

// Merge `splits` partial (o [G, D], lse [G]) results, laid out one after the other, into out_o [G, D] and
// out_lse [G].
inline void merge_ranges(const float* o, const float* lse, int64_t splits, int64_t group_size, int64_t head_dim,
                         float* out_o, float* out_lse) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < group_size; ++g) {
    float m = neg_inf;
    for (int64_t s = 0; s < splits; ++s) m = std::max(m, lse[s * group_size + g]);
    float* dst = out_o + g * head_dim;
    std::fill(dst, dst + head_dim, 0.0f);
    if (m == neg_inf) {
      out_lse[g] = neg_inf;
      continue;
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float w = std::exp(lse[s * group_size + g] - m);
      if (w == 0.0f) continue;
      sum += w;
      const float* src = o + (s * group_size + g) * head_dim;
      for (int64_t i = 0; i < head_dim; ++i) dst[i] += w * src[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < head_dim; ++i) dst[i] *= inv;
    out_lse[g] = m + std::log(sum);
  }
}

}  // namespace
