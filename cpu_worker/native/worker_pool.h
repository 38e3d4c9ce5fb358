// The CPU part's worker pool: C++ threads driven by the hand-off words, with no Python on their path.
//
// digest -> select -> split -> device part / CPU part (here) -> merge. The protocol is
// scout_sglang/handoff_words.py: per registered layer, a row of int32 control words in page-locked
// memory. The device (a CUDA stream, or on the CPU device the engine's thread) writes ROWS, then
// DOORBELL = the step's sequence number; a thread that sees DOORBELL change makes a job of items of
// balanced bytes (work_items.h: consecutive KV heads of one sequence grouped, a long list cut into block
// ranges merged by LSE), the pool's threads take items under one mutex (an item is tens of microseconds of
// memory traffic, the lock a few tens of nanoseconds), and the thread that finishes the last item writes
// STATUS and ERROR_ROW, then DONE = the sequence number, with release
// order. DONE is always written, also on error, so a device that waits is never left hanging by a live
// worker; a job its layer rang again before it finished is stale: it takes no new item and writes no
// word (its result would be ignored), and the next job of the layer starts only when the stale one has
// no item in flight (both write the same output rows).
//
// Threads spin on the doorbells for spin_s after their last work or kick(), then sleep on a condition
// variable with a short timeout (kt-kernel's worker pool spins then sleeps the same way); kick() at each
// step's plan wakes them, since a GPU rings without a host call. Faults (tests only) are drawn once per job
// by the thread that starts it: fail (the job reports an error), delay (it sleeps first), thread exit (the
// thread ends mid-job; the job never finishes and the device's deadline covers it; kick() starts a new
// thread in its place).

#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <torch/extension.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attend.h"
#include "work_items.h"

namespace {

// Word indices of a layer's row (handoff_words.py).
constexpr int kRowsWord = 0, kDoorbellWord = 1, kStatusWord = 2, kErrorRowWord = 3, kDoneWord = 4;
constexpr int32_t kStatusOk = 0, kStatusError = 1;

// One layer's CPU part: its static buffers, registered once (the tensors are kept alive here).
struct LayerPart {
  torch::Tensor q, pages, counts, out_o, out_lse, k_cache, v_cache, words;
  float scale = 1.0f;
  int32_t* word = nullptr;
  int64_t num_qo_heads = 0, num_kv_heads = 0, capacity = 0, num_pages = 0;
  Dims dims{};
  std::shared_ptr<std::atomic<int64_t>> busy_ns = std::make_shared<std::atomic<int64_t>>(0);  // attending it
};

struct Job {
  int64_t layer = 0;
  int32_t seq = 0;
  WorkPlan plan;
  std::vector<float> partial_o, partial_lse;  // [split lists, kMaxSplits, G, D] and [split lists, kMaxSplits, G]
  int64_t items = 0, next = 0, left = 0, in_flight = 0;
  int32_t error_row = -1;
  std::string error;
  double delay_ms = 0.0;
  bool stale = false, started = false, failed_by_plan = false;
};

// What a thread polls without the lock: a layer's words and the doorbell value last turned into a job.
struct Doorbell {
  int64_t index;
  const int32_t* word;
  std::atomic<int32_t>* seen;
};

struct FaultPlanDraws {
  double raise = 0.0, delay = 0.0, delay_ms = 0.0;
  int64_t thread_exits = 0;
};

class WorkerPool {
 public:
  // cpus: the CPUs the threads may run on (empty: the process's); pin: thread i on cpus[i % n] alone;
  // min_split_blocks: the shortest block range a list is cut into (0: one item per list; work_items.h).
  WorkerPool(int64_t threads, std::vector<int64_t> cpus, bool pin, double spin_s, int64_t min_split_blocks)
      : cpus_(std::move(cpus)), pin_(pin), spin_(std::chrono::duration<double>(spin_s)),
        min_split_blocks_(min_split_blocks) {
    TORCH_CHECK(threads >= 1, "threads must be >= 1, got ", threads);
    last_kick_ns_.store(Clock::now().time_since_epoch().count());
    for (int64_t i = 0; i < threads; ++i) {
      alive_.push_back(std::make_unique<std::atomic<bool>>(true));
      tids_.push_back(std::make_unique<std::atomic<int64_t>>(0));
    }
    for (int64_t i = 0; i < threads; ++i) threads_.emplace_back(&WorkerPool::loop, this, i);
  }

  ~WorkerPool() { shutdown(); }

  void register_layer(int64_t index, torch::Tensor q, torch::Tensor pages, torch::Tensor counts,
                      torch::Tensor out_o, torch::Tensor out_lse, torch::Tensor k_cache, torch::Tensor v_cache,
                      torch::Tensor words, double scale) {
    LayerPart part;
    part.q = q; part.pages = pages; part.counts = counts; part.out_o = out_o; part.out_lse = out_lse;
    part.k_cache = k_cache; part.v_cache = v_cache; part.words = words;
    part.scale = static_cast<float>(scale);
    part.word = words.data_ptr<int32_t>();
    part.num_qo_heads = q.size(1);
    part.num_kv_heads = k_cache.size(1);
    part.capacity = pages.size(2);
    part.num_pages = k_cache.size(0);
    part.dims = Dims{part.num_qo_heads / part.num_kv_heads, k_cache.size(2), k_cache.size(3)};
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(parts_.count(index) == 0, "layer ", index, " is already registered");
    parts_[index] = part;
    seen_[index] = std::make_unique<std::atomic<int32_t>>(__atomic_load_n(part.word + kDoorbellWord,
                                                                          __ATOMIC_ACQUIRE));
    scan_.clear();
    for (const auto& [i, p] : parts_) scan_.push_back(Doorbell{i, p.word, seen_[i].get()});
    scan_version_.fetch_add(1);
  }

  // Wake the threads and start a new thread in place of each that ended.
  void kick() {
    std::lock_guard<std::mutex> lock(mu_);
    last_kick_ns_.store(Clock::now().time_since_epoch().count());
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!alive_[i]->load() && !stop_.load()) {
        if (threads_[i].joinable()) threads_[i].join();
        alive_[i]->store(true);
        threads_[i] = std::thread(&WorkerPool::loop, this, static_cast<int64_t>(i));
        ++replaced_;
      }
    }
    cv_.notify_all();
  }

  // Wait until layer `index` finished part `seq` or timeout_s passed -> its STATUS, or -1 when not done.
  int64_t wait_done(int64_t index, int64_t seq, double timeout_s) {
    const int32_t* word = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      word = parts_.at(index).word;
    }
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(std::max(0.0, timeout_s));
    int64_t spins = 0;
    while (__atomic_load_n(word + kDoneWord, __ATOMIC_ACQUIRE) != static_cast<int32_t>(seq)) {
      if ((++spins & 255) != 0) {
        _mm_pause();
        continue;
      }
      const auto now = Clock::now();
      if (now >= deadline) return -1;
      // After a short spin, sleep in small steps: on the CPU device this thread's core is the workers' too.
      if (now - start > std::chrono::microseconds(20)) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return __atomic_load_n(word + kStatusWord, __ATOMIC_ACQUIRE);
  }

  void set_faults(double raise, double delay, double delay_ms, int64_t thread_exits, int64_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    faults_ = FaultPlanDraws{raise, delay, delay_ms, thread_exits};
    random_.seed(static_cast<uint64_t>(seed));
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) return;
      stop_.store(true);
      cv_.notify_all();
    }
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  int64_t replaced_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return replaced_;
  }

  int64_t num_threads() const { return static_cast<int64_t>(threads_.size()); }

  // Nanoseconds the threads spent attending items since start-up (summed over threads): the worker's busy time;
  // with a layer index, that layer's parts only.
  int64_t busy_ns() const { return busy_ns_.load(); }
  int64_t layer_busy_ns(int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = parts_.find(index);
    return it == parts_.end() ? 0 : it->second.busy_ns->load();
  }

  // The OS thread ids of the threads (0 until a thread has started), for /proc accounting.
  std::vector<int64_t> thread_ids() const {
    std::vector<int64_t> out;
    for (const auto& tid : tids_) out.push_back(tid->load());
    return out;
  }

  std::string last_error(int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = errors_.find(index);
    return it == errors_.end() ? std::string() : it->second;
  }

  // The CPUs the live threads may run on (read back from the OS), for the server's report.
  std::vector<int64_t> thread_cpus() {
    std::vector<bool> seen(CPU_SETSIZE, false);
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!alive_[i]->load() || !threads_[i].joinable()) continue;
      cpu_set_t set;
      CPU_ZERO(&set);
      if (pthread_getaffinity_np(threads_[i].native_handle(), sizeof(set), &set) != 0) continue;
      for (int c = 0; c < CPU_SETSIZE; ++c) seen[c] = seen[c] || CPU_ISSET(c, &set);
    }
    std::vector<int64_t> out;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (seen[c]) out.push_back(c);
    }
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Taken {
    Job* job;
    const LayerPart* part;  // a map node: its address is stable
    int64_t item;
    bool first;
  };

  void loop(int64_t id) {
    tids_[id]->store(static_cast<int64_t>(syscall(SYS_gettid)));
    if (!cpus_.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (pin_) {
        CPU_SET(static_cast<int>(cpus_[id % cpus_.size()]), &set);
      } else {
        for (int64_t cpu : cpus_) CPU_SET(static_cast<int>(cpu), &set);
      }
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    std::vector<Doorbell> scan;
    int64_t version = -1;
    auto last_work = Clock::now();
    while (true) {
      if (scan_version_.load() != version) {
        std::lock_guard<std::mutex> lock(mu_);
        scan = scan_;
        version = scan_version_.load();
      }
      bool rung = false;
      for (const auto& bell : scan) {
        if (__atomic_load_n(bell.word + kDoorbellWord, __ATOMIC_ACQUIRE) != bell.seen->load()) rung = true;
      }
      if (rung || runnable_.load() > 0) {
        std::unique_lock<std::mutex> lock(mu_);
        if (stop_.load()) break;
        if (rung) collect_doorbells();
        Taken taken{nullptr, nullptr, 0, false};
        if (take(taken)) {
          lock.unlock();
          if (!run(taken)) {  // an injected thread exit
            alive_[id]->store(false);
            return;
          }
          last_work = Clock::now();
        }
        continue;
      }
      // Idle: spin without the lock (the busy threads take it per item), then sleep until a kick.
      if (stop_.load()) break;
      const Clock::time_point kicked{Clock::duration(last_kick_ns_.load())};
      if (Clock::now() - std::max(last_work, kicked) < spin_) {
        _mm_pause();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_.load()) break;
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    alive_[id]->store(false);
  }

  // Under the lock: a job for each layer whose doorbell changed; earlier jobs of that layer become stale.
  void collect_doorbells() {
    for (auto& [index, part] : parts_) {
      const int32_t seq = __atomic_load_n(part.word + kDoorbellWord, __ATOMIC_ACQUIRE);
      if (seq == seen_[index]->load()) continue;
      seen_[index]->store(seq);
      for (auto& job : jobs_) {
        if (job.layer == index) job.stale = true;
      }
      Job job;
      job.layer = index;
      job.seq = seq;
      const int64_t rows = std::max<int64_t>(
          0, std::min<int64_t>(__atomic_load_n(part.word + kRowsWord, __ATOMIC_ACQUIRE), part.q.size(0)));
      job.plan = plan_items(part.counts.data_ptr<int32_t>(), rows, part.num_kv_heads, part.capacity,
                            static_cast<int64_t>(threads_.size()), min_split_blocks_);
      const size_t slots = job.plan.ranges_left.size() * kMaxSplits * part.dims.group_size;
      job.partial_o.resize(slots * part.dims.head_dim);
      job.partial_lse.resize(slots);
      job.items = static_cast<int64_t>(job.plan.items.size());
      job.left = job.items;
      jobs_.push_back(std::move(job));
    }
    // Empty parts finish at once; stale jobs with nothing in flight are dropped.
    for (auto& job : jobs_) {
      if (!job.stale && job.items == 0 && job.left == 0) finish(job);
    }
    // A list: a job a thread is working on keeps its address while others are dropped.
    jobs_.remove_if([](const Job& j) { return (j.stale && j.in_flight == 0) || j.left < 0; });
    recount_runnable();
  }

  // Under the lock: the next item of the oldest job whose layer has no older job in flight.
  bool take(Taken& taken) {
    busy_layers_.clear();  // layers of which an older job still has items in flight (a few: no allocation)
    for (auto& job : jobs_) {
      const bool blocked =
          std::find(busy_layers_.begin(), busy_layers_.end(), job.layer) != busy_layers_.end();
      if (job.in_flight > 0 && !blocked) busy_layers_.push_back(job.layer);
      if (job.stale || blocked || job.next >= job.items) continue;
      taken = Taken{&job, &parts_.at(job.layer), job.next++, !job.started};
      if (taken.first) draw_faults(job);
      ++job.in_flight;
      recount_runnable();
      return true;
    }
    return false;
  }

  void draw_faults(Job& job) {
    job.started = true;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (faults_.thread_exits > 0) return;  // decided in run(): this thread ends
    const bool delay = u(random_) < faults_.delay;
    const bool fail = u(random_) < faults_.raise;
    job.failed_by_plan = fail;
    if (fail) job.error = "injected CPU attention fault (SCOUT_TEST_FAULTS)";
    job.delay_ms = delay ? faults_.delay_ms : 0.0;
  }

  // Outside the lock: one item; false when this thread must end (an injected thread exit).
  bool run(Taken taken) {
    Job& job = *taken.job;
    if (taken.first) {
      std::unique_lock<std::mutex> lock(mu_);
      if (faults_.thread_exits > 0) {
        --faults_.thread_exits;
        job.next = job.items;  // abandoned: nobody finishes it (the device's deadline covers it)
        --job.in_flight;
        recount_runnable();
        return false;
      }
      const double delay_ms = job.delay_ms;
      lock.unlock();
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
    }
    const LayerPart& part = *taken.part;
    const WorkItem item = job.plan.items[taken.item];
    const int64_t G = part.dims.group_size, D = part.dims.head_dim;
    const int64_t slot = (item.list * kMaxSplits + item.split) * G;  // this range's partial, when cut
    std::string error;
    if (!job.failed_by_plan && !job.stale) {
      const auto began = Clock::now();
      error = item.splits == 1
                  ? attend_item(part, item.row, item.head_begin, item.head_end, 0, 1, nullptr, nullptr)
                  : attend_item(part, item.row, item.head_begin, item.head_end, item.split, item.splits,
                                job.partial_o.data() + slot * D, job.partial_lse.data() + slot);
      const int64_t spent = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - began).count();
      busy_ns_.fetch_add(spent);
      part.busy_ns->fetch_add(spent);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (item.splits > 1 && --job.plan.ranges_left[item.list] == 0 && error.empty() && job.error.empty() &&
        !job.failed_by_plan && !job.stale) {
      lock.unlock();  // the list's last range: merge its ranges into the list's output rows
      const int64_t first = item.list * kMaxSplits * G;
      const int64_t q_head = item.row * part.num_qo_heads + item.head_begin * G;
      merge_ranges(job.partial_o.data() + first * D, job.partial_lse.data() + first, item.splits, G, D,
                   part.out_o.data_ptr<float>() + q_head * D, part.out_lse.data_ptr<float>() + q_head);
      lock.lock();
    }
    --job.in_flight;
    if (!error.empty() && job.error_row < 0) {
      job.error_row = item.row;
      job.error = error;
    }
    if (--job.left == 0) finish(job);
    recount_runnable();
    return true;
  }

  // KV heads [head_begin, head_end) of one sequence, range `split` of `splits` of each list, into the part's
  // output rows (o_range null) or, for one head's range, into o_range [G, D] and lse_range [G]; checks the
  // whole lists first (a torn or bad staging must not read out of bounds).
  static std::string attend_item(const LayerPart& part, int64_t row, int64_t head_begin, int64_t head_end,
                                 int64_t split, int64_t splits, float* o_range, float* lse_range) {
    const int32_t* table = part.pages.data_ptr<int32_t>() + row * part.num_kv_heads * part.capacity;
    for (int64_t head = head_begin; head < head_end; ++head) {
      const int32_t count = part.counts.data_ptr<int32_t>()[row * part.num_kv_heads + head];
      if (count < 0 || count > part.capacity) {
        return "row " + std::to_string(row) + " head " + std::to_string(head) + ": count " +
               std::to_string(count) + " outside [0, " + std::to_string(part.capacity) + "]";
      }
      for (int32_t i = 0; i < count; ++i) {
        const int32_t page = table[head * part.capacity + i];
        if (page < 0 || page >= part.num_pages) {
          return "row " + std::to_string(row) + " head " + std::to_string(head) + ": page " +
                 std::to_string(page) + " outside [0, " + std::to_string(part.num_pages) + ")";
        }
      }
    }
    const int64_t q_row = row * part.num_qo_heads * part.dims.head_dim;
    const int32_t* counts = part.counts.data_ptr<int32_t>() + row * part.num_kv_heads;
    float* out_o = o_range ? o_range : part.out_o.data_ptr<float>() + q_row;
    float* out_lse = lse_range ? lse_range : part.out_lse.data_ptr<float>() + row * part.num_qo_heads;
    const int64_t origin = o_range ? head_begin : 0;
    try {
      switch (part.q.scalar_type()) {
        case torch::kBFloat16:
          attend<bf16, float>(part.q.data_ptr<bf16>() + q_row, part.k_cache.data_ptr<bf16>(),
                              part.v_cache.data_ptr<bf16>(), table, counts, part.num_kv_heads, part.capacity,
                              part.dims, part.scale, head_begin, head_end, split, splits, out_o, out_lse, origin);
          break;
        case torch::kFloat16:
          attend<fp16, float>(part.q.data_ptr<fp16>() + q_row, part.k_cache.data_ptr<fp16>(),
                              part.v_cache.data_ptr<fp16>(), table, counts, part.num_kv_heads, part.capacity,
                              part.dims, part.scale, head_begin, head_end, split, splits, out_o, out_lse, origin);
          break;
        default:
          attend<float, float>(part.q.data_ptr<float>() + q_row, part.k_cache.data_ptr<float>(),
                               part.v_cache.data_ptr<float>(), table, counts, part.num_kv_heads, part.capacity,
                               part.dims, part.scale, head_begin, head_end, split, splits, out_o, out_lse, origin);
          break;
      }
    } catch (const std::exception& e) {
      return e.what();
    }
    return std::string();
  }

  // Under the lock: the job's words (not for a stale job: its layer rang again).
  void finish(Job& job) {
    job.left = -1;  // done: dropped at the next collect
    if (job.stale) return;
    int32_t* word = parts_.at(job.layer).word;
    const bool failed = job.failed_by_plan || !job.error.empty();
    if (failed) errors_[job.layer] = job.error;
    __atomic_store_n(word + kStatusWord, failed ? kStatusError : kStatusOk, __ATOMIC_RELAXED);
    __atomic_store_n(word + kErrorRowWord, job.failed_by_plan ? 0 : job.error_row, __ATOMIC_RELAXED);
    __atomic_store_n(word + kDoneWord, job.seq, __ATOMIC_RELEASE);
  }

  void recount_runnable() {
    int64_t n = 0;
    for (const auto& job : jobs_) n += (!job.stale && job.next < job.items) ? 1 : 0;
    runnable_.store(n);
  }

  std::vector<int64_t> cpus_;
  bool pin_;
  std::chrono::duration<double> spin_;
  int64_t min_split_blocks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<std::atomic<bool>>> alive_;
  std::vector<std::unique_ptr<std::atomic<int64_t>>> tids_;
  std::atomic<int64_t> busy_ns_{0};
  std::map<int64_t, LayerPart> parts_;
  std::map<int64_t, std::unique_ptr<std::atomic<int32_t>>> seen_;
  std::map<int64_t, std::string> errors_;
  std::vector<Doorbell> scan_;
  std::atomic<int64_t> scan_version_{0};
  std::list<Job> jobs_;
  std::vector<int64_t> busy_layers_;  // take()'s scratch
  std::atomic<int64_t> runnable_{0};
  std::atomic<Clock::rep> last_kick_ns_{0};  // the last kick's time_since_epoch, read by idle threads unlocked
  std::atomic<bool> stop_{false};
  int64_t replaced_ = 0;
  FaultPlanDraws faults_;
  std::mt19937_64 random_{0};
};

}  // namespace
