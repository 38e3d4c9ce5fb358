// The CPU part's worker pool: C++ threads driven by the hand-off words, with no Python and no lock per item.
//
// digest -> select -> split -> device part / CPU part (here) -> merge. The protocol is
// scout_sglang/handoff_words.py: per registered layer, a row of int32 control words in page-locked memory.
// The device (a CUDA stream, or on the CPU device the engine's thread) writes ROWS, then DOORBELL = the
// step's sequence number. A layer has one job at a time:
//
//   ring seen      one thread wins the layer's prepare lock (try-lock: the others go on), retires the
//                  layer's previous job (no new claim; waits until none of its items is in flight; a job
//                  that had not finished is stale: it writes no word), plans the new one (work_items.h:
//                  items of equal blocks) into the layer's preallocated scratch, and publishes it
//   items          every thread claims items with one atomic add on the layer's claim word (no lock);
//                  the last piece of a cut list merges the list's pieces
//   DONE           the thread that finishes the last item writes STATUS and ERROR_ROW, then DONE = the
//                  sequence number, with release order; always, also on error, so a waiting device is never
//                  left hanging by a live worker
//
// Spinning (kt-kernel's pool spins then sleeps the same way, but on a timer): a step announces the rings it
// will make (expect(layers, seq) at each step's plan: a GPU rings without a host call). Thread 0 then
// watches the doorbells; the others sleep until the step's first ring is published, then every thread spins
// (claims, polls) until every expected layer's part of that step has ended, plus `grace` (0.2 ms by default;
// 0 where every ring is a host call, kick(): the CPU device), and parks on a condition variable until the
// next expect() or kick(): an idle pool burns no CPU. A step whose rings stop coming (no ring, no item for
// `stall`) dozes in 1 ms naps, still catching a late ring, until the next step's expect() replaces it.
//
// Faults (tests only) are drawn once per job by the thread that prepares it: fail (the job reports an error),
// delay (the job is published late), drop (the job reports OK with empty results: the CPU part discarded),
// thread exit (the preparing thread ends; the job never finishes and the device's deadline covers it; the
// next kick() starts a new thread in its place).

#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <torch/extension.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
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
constexpr int64_t kClosed = int64_t{1} << 40;  // a claim word at or past this: no item to take

struct FaultPlanDraws {
  double raise = 0.0, delay = 0.0, delay_ms = 0.0, drop = 0.0;
  int64_t thread_exits = 0;
};

int64_t thread_cpu_ns(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// One layer's CPU part: its static buffers (registered once; the tensors are kept alive here) and its job.
struct LayerPart {
  torch::Tensor q, pages, counts, out_o, out_lse, k_cache, v_cache, words;
  float scale = 1.0f;
  int32_t* word = nullptr;
  int64_t index = 0, num_qo_heads = 0, num_kv_heads = 0, capacity = 0, num_pages = 0, max_rows = 0;
  Dims dims{};
  std::atomic<int64_t> busy_ns{0};  // attending it

  // The job, written by its preparer (under prepare_mu) before the claim word publishes it.
  std::mutex prepare_mu;
  std::atomic<int32_t> seen{0};       // the doorbell value last taken
  std::atomic<int32_t> expected{0};   // the step's sequence number this layer will ring (0: none announced)
  std::atomic<int64_t> claim{kClosed};  // the next item to take
  std::atomic<int32_t> in_flight{0};  // threads inside an item (or about to claim one)
  std::atomic<int64_t> left{0};       // items not finished
  std::atomic<bool> open{false};      // published and not ended
  std::atomic<bool> stale{false};     // retired before it finished: writes no word
  std::atomic<int32_t> error_row{-1};
  std::mutex error_mu;  // the error path only
  std::string error;
  int32_t seq = 0;
  bool drop = false;
  ItemPlan plan;
  std::unique_ptr<std::atomic<int32_t>[]> pieces_left;  // [max lists]: per cut list, pieces not finished
  std::vector<float> partial_o, partial_lse;            // [2 x max items, G, D], [2 x max items, G]
};

class WorkerPool {
 public:
  // cpus: the CPUs the threads may run on (empty: the process's); pin: thread i on cpus[i % n] alone;
  // min_item_blocks: the fewest blocks of an item (work_items.h); grace_s: how long threads spin once a step's
  // rings have ended; stall_s: how long they spin for a ring that does not come before they doze.
  WorkerPool(int64_t threads, std::vector<int64_t> cpus, bool pin, double grace_s, double stall_s,
             int64_t min_item_blocks)
      : cpus_(std::move(cpus)), pin_(pin), grace_ns_(static_cast<int64_t>(grace_s * 1e9)),
        stall_ns_(static_cast<int64_t>(stall_s * 1e9)), min_item_blocks_(min_item_blocks) {
    TORCH_CHECK(threads >= 1, "threads must be >= 1, got ", threads);
    TORCH_CHECK(min_item_blocks >= 1, "min_item_blocks must be >= 1, got ", min_item_blocks);
    TORCH_CHECK(grace_s >= 0 && stall_s >= 0, "grace_s and stall_s must be >= 0");
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
    auto part = std::make_unique<LayerPart>();
    part->q = q; part->pages = pages; part->counts = counts; part->out_o = out_o; part->out_lse = out_lse;
    part->k_cache = k_cache; part->v_cache = v_cache; part->words = words;
    part->scale = static_cast<float>(scale);
    part->word = words.data_ptr<int32_t>();
    part->index = index;
    part->num_qo_heads = q.size(1);
    part->num_kv_heads = k_cache.size(1);
    part->capacity = pages.size(2);
    part->num_pages = k_cache.size(0);
    part->max_rows = q.size(0);
    part->dims = Dims{part->num_qo_heads / part->num_kv_heads, k_cache.size(2), k_cache.size(3)};
    // Every job's scratch, sized once: plan_items and the pieces never allocate afterwards.
    const int64_t lists = part->max_rows * part->num_kv_heads, slots = 2 * (max_items(num_threads()) + 1);
    part->plan.start.resize(lists + 1);
    part->pieces_left = std::make_unique<std::atomic<int32_t>[]>(lists);
    part->partial_o.resize(slots * part->dims.group_size * part->dims.head_dim);
    part->partial_lse.resize(slots * part->dims.group_size);
    part->seen.store(__atomic_load_n(part->word + kDoorbellWord, __ATOMIC_ACQUIRE));
    std::lock_guard<std::mutex> lock(mu_);
    count_lock();
    TORCH_CHECK(parts_.count(index) == 0, "layer ", index, " is already registered");
    scan_.push_back(part.get());
    parts_[index] = std::move(part);
    scan_version_.fetch_add(1);
    wake_all_locked();
  }

  // A step begins whose layers `indices` will ring `seq` without a host call (a GPU's step): thread 0 watches
  // for the first ring, and every thread spins from it until those parts have ended (the layers' earlier
  // expectations are replaced). Starts a new thread in place of each that ended.
  void expect(std::vector<int64_t> indices, int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    count_lock();
    replace_ended_threads_locked();
    for (int64_t index : indices) {
      auto it = parts_.find(index);
      TORCH_CHECK(it != parts_.end(), "layer ", index, " is not registered");
      it->second->expected.store(static_cast<int32_t>(seq));
    }
    published_.store(false);
    progress_ns_.store(now_ns());
    wake_all_locked();
  }

  // A host just rang a layer (the CPU device): wake the threads. Starts a new thread in place of each that
  // ended.
  void kick() {
    std::lock_guard<std::mutex> lock(mu_);
    count_lock();
    replace_ended_threads_locked();
    published_.store(true);
    progress_ns_.store(now_ns());
    wake_all_locked();
  }

  // Wait until layer `index` finished part `seq` or timeout_s passed -> its STATUS, or -1 when not done.
  int64_t wait_done(int64_t index, int64_t seq, double timeout_s) {
    const int32_t* word = part(index).word;
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

  void set_faults(double raise, double delay, double delay_ms, double drop, int64_t thread_exits, int64_t seed) {
    std::lock_guard<std::mutex> lock(fault_mu_);
    faults_ = FaultPlanDraws{raise, delay, delay_ms, drop, thread_exits};
    random_.seed(static_cast<uint64_t>(seed));
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) return;
      stop_.store(true);
      wake_all_locked();
    }
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  int64_t replaced_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return replaced_;
  }

  int64_t num_threads() const { return static_cast<int64_t>(alive_.size()); }

  // Nanoseconds the threads spent attending items since start-up (summed over threads): the worker's busy time;
  // with a layer index, that layer's parts only.
  int64_t busy_ns() const { return busy_ns_.load(); }
  int64_t layer_busy_ns(int64_t index) { return part(index).busy_ns.load(); }

  // CPU time (ns) the threads used since start-up, summed over threads (ended ones included): attending,
  // spinning and claiming. Against busy_ns, what spinning costs.
  int64_t cpu_ns() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t total = ended_cpu_ns_.load();
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!alive_[i]->load() || !threads_[i].joinable()) continue;
      clockid_t clock;
      if (pthread_getcpuclockid(threads_[i].native_handle(), &clock) == 0) total += thread_cpu_ns(clock);
    }
    return total;
  }

  // Mutex acquisitions since start-up (the pool's and the layers' prepare locks), and those taken by a thread
  // inside an item (between its claim and its end): none but on the error path.
  int64_t lock_count() const { return locks_.load(); }
  int64_t item_path_locks() const { return item_locks_.load(); }

  // The OS thread ids of the threads (0 until a thread has started), for /proc accounting.
  std::vector<int64_t> thread_ids() const {
    std::vector<int64_t> out;
    for (const auto& tid : tids_) out.push_back(tid->load());
    return out;
  }

  std::string last_error(int64_t index) {
    std::lock_guard<std::mutex> lock(errors_mu_);
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

  static int64_t now_ns() { return Clock::now().time_since_epoch().count(); }
  static bool& inside_item() {
    static thread_local bool inside = false;
    return inside;
  }
  void count_lock() {
    locks_.fetch_add(1, std::memory_order_relaxed);
    if (inside_item()) item_locks_.fetch_add(1, std::memory_order_relaxed);
  }

  LayerPart& part(int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = parts_.find(index);
    TORCH_CHECK(it != parts_.end(), "layer ", index, " is not registered");
    return *it->second;
  }

  void replace_ended_threads_locked() {
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!alive_[i]->load() && !stop_.load()) {
        if (threads_[i].joinable()) threads_[i].join();
        alive_[i]->store(true);
        threads_[i] = std::thread(&WorkerPool::loop, this, static_cast<int64_t>(i));
        ++replaced_;
      }
    }
  }

  // Whether a layer's expected part of the step has not ended yet (not rung, or rung and not finished).
  static bool awaited(const LayerPart& L) {
    const int32_t expected = L.expected.load(std::memory_order_relaxed);
    return expected != 0 && (L.seen.load(std::memory_order_relaxed) != expected || L.open.load());
  }

  // Under mu_: every parked thread re-checks what it waits for.
  void wake_all_locked() {
    wake_epoch_.fetch_add(1);
    cv_.notify_all();
  }

  // Without mu_ (a published job): wake the parked threads, taking the lock only when one is parked.
  void wake_parked() {
    wake_epoch_.fetch_add(1);  // seq_cst, paired with park()'s increment of parked_ then read of wake_epoch_
    if (parked_.load() == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    count_lock();
    cv_.notify_all();
  }

  // Sleep until a wake (kick, publish, registration, stop) later than `epoch`, the wake count read before the
  // thread last looked for work: a ring between that look and this call is not slept through (its kick or
  // publish counted a wake already). nap > 0: at most that long.
  void park(uint64_t epoch, std::chrono::milliseconds nap) {
    std::unique_lock<std::mutex> lock(mu_);
    count_lock();
    parked_.fetch_add(1);
    if (!stop_.load() && wake_epoch_.load() == epoch) {
      if (nap.count() > 0) {
        cv_.wait_for(lock, nap);
      } else {
        cv_.wait(lock, [&] { return stop_.load() || wake_epoch_.load() != epoch; });
      }
    }
    parked_.fetch_sub(1);
  }

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
    std::vector<LayerPart*> scan;
    int64_t version = -1;
    int64_t last_work = now_ns();
    while (!stop_.load()) {
      const uint64_t epoch = wake_epoch_.load();  // before looking for work: park() sleeps only if no wake since
      if (scan_version_.load() != version) {
        std::lock_guard<std::mutex> lock(mu_);
        count_lock();
        scan = scan_;
        version = scan_version_.load();
      }
      bool worked = false;
      for (LayerPart* layer : scan) {
        if (!prepare(*layer)) {  // an injected thread exit
          end_thread(id);
          return;
        }
        while (run_item(*layer)) worked = true;
      }
      const int64_t now = now_ns();
      if (worked) {
        last_work = now;
        continue;
      }
      if (std::any_of(scan.begin(), scan.end(), [](const LayerPart* L) { return awaited(*L); })) {
        if (id != 0 && !published_.load()) {
          park(epoch, std::chrono::milliseconds(0));  // thread 0 watches for the step's first ring
        } else if (now - progress_ns_.load() < stall_ns_) {
          _mm_pause();  // inside a step: the next ring comes without a host call
        } else {
          park(epoch, std::chrono::milliseconds(1));  // rings that do not come: doze, still catching a late one
        }
        continue;
      }
      if (now - std::max(last_work, progress_ns_.load()) < grace_ns_) {
        _mm_pause();
        continue;
      }
      park(epoch, std::chrono::milliseconds(0));
    }
    end_thread(id);
  }

  void end_thread(int64_t id) {
    ended_cpu_ns_.fetch_add(thread_cpu_ns(CLOCK_THREAD_CPUTIME_ID));
    alive_[id]->store(false);
  }

  // If the layer's doorbell changed and no other thread is preparing it: retire its job and publish the new
  // one. False when this thread must end (an injected thread exit).
  bool prepare(LayerPart& L) {
    if (__atomic_load_n(L.word + kDoorbellWord, __ATOMIC_ACQUIRE) == L.seen.load(std::memory_order_acquire)) {
      return true;
    }
    std::unique_lock<std::mutex> lock(L.prepare_mu, std::try_to_lock);
    if (!lock.owns_lock()) return true;
    count_lock();
    while (true) {
      const int32_t seq = __atomic_load_n(L.word + kDoorbellWord, __ATOMIC_ACQUIRE);
      if (seq == L.seen.load()) return true;
      L.seen.store(seq);
      retire(L);
      FaultPlanDraws draws = draw_faults();
      if (draws.thread_exits > 0) return false;  // this thread ends, the part undone (the deadline covers it)
      if (draws.delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(draws.delay_ms));
        if (__atomic_load_n(L.word + kDoorbellWord, __ATOMIC_ACQUIRE) != seq) continue;  // rung again meanwhile
      }
      publish(L, seq, draws);
      return true;
    }
  }

  // The layer's current job takes no new item and, once none is in flight, is forgotten; one that had not
  // finished is stale (it writes no word).
  void retire(LayerPart& L) {
    L.stale.store(true);
    L.claim.store(kClosed);
    while (L.in_flight.load() != 0) _mm_pause();
    L.open.store(false);
  }

  FaultPlanDraws draw_faults() {
    std::lock_guard<std::mutex> lock(fault_mu_);
    FaultPlanDraws draws;
    if (faults_.thread_exits > 0) {
      --faults_.thread_exits;
      draws.thread_exits = 1;
      return draws;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (faults_.delay > 0 && u(random_) < faults_.delay) draws.delay_ms = faults_.delay_ms;
    if (faults_.raise > 0 && u(random_) < faults_.raise) draws.raise = 1.0;
    if (faults_.drop > 0 && u(random_) < faults_.drop) draws.drop = 1.0;
    return draws;
  }

  // Plan the layer's job for `seq` into its scratch, then publish it (the claim word, with release order).
  void publish(LayerPart& L, int32_t seq, const FaultPlanDraws& draws) {
    const int64_t rows = std::max<int64_t>(
        0, std::min<int64_t>(__atomic_load_n(L.word + kRowsWord, __ATOMIC_ACQUIRE), L.max_rows));
    L.seq = seq;
    L.drop = draws.drop > 0;
    L.stale.store(false);
    L.error_row.store(-1);
    {
      std::lock_guard<std::mutex> lock(L.error_mu);
      L.error.clear();
    }
    const int64_t bad = plan_items(L.counts.data_ptr<int32_t>(), rows * L.num_kv_heads, L.capacity,
                                   num_threads(), min_item_blocks_, L.plan);
    L.open.store(true);
    if (draws.raise > 0 || bad >= 0) {  // fails at once, nothing attended
      if (bad >= 0) {
        const int32_t count = L.counts.data_ptr<int32_t>()[bad];
        fail(L, static_cast<int32_t>(bad / L.num_kv_heads),
             "row " + std::to_string(bad / L.num_kv_heads) + " head " + std::to_string(bad % L.num_kv_heads) +
                 ": count " + std::to_string(count) + " outside [0, " + std::to_string(L.capacity) + "]");
      } else {
        fail(L, 0, "injected CPU attention fault (SCOUT_TEST_FAULTS)");
      }
      finish(L);
      return;
    }
    for (int64_t j = 0; j < L.plan.lists; ++j) {
      if (L.plan.cut(j)) {
        L.pieces_left[j].store(static_cast<int32_t>(L.plan.last_item(j) - L.plan.first_item(j) + 1),
                               std::memory_order_relaxed);
      }
    }
    L.left.store(L.plan.items);
    if (L.plan.items == 0) {
      finish(L);
      return;
    }
    L.claim.store(0, std::memory_order_release);
    published_.store(true);
    progress_ns_.store(now_ns(), std::memory_order_relaxed);
    wake_parked();  // parked threads join (the step's first ring, or a part published late)
  }

  // Claim and run one item of the layer's job -> whether there was one.
  bool run_item(LayerPart& L) {
    if (L.claim.load(std::memory_order_relaxed) >= kClosed) return false;
    L.in_flight.fetch_add(1);  // seq_cst: retire() sees it, or this claim sees the closed word
    const int64_t item = L.claim.fetch_add(1, std::memory_order_acq_rel);
    if (item >= kClosed) {
      L.in_flight.fetch_sub(1);
      return false;
    }
    if (item >= L.plan.items) {  // every item taken: close the word, so that idle threads stop adding to it
      L.claim.store(kClosed, std::memory_order_relaxed);
      L.in_flight.fetch_sub(1);
      return false;
    }
    inside_item() = true;
    if (!L.stale.load(std::memory_order_acquire)) {
      const auto began = Clock::now();
      attend_item(L, item);
      const int64_t spent = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - began).count();
      busy_ns_.fetch_add(spent, std::memory_order_relaxed);
      L.busy_ns.fetch_add(spent, std::memory_order_relaxed);
    }
    if (L.left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(L);
    inside_item() = false;
    L.in_flight.fetch_sub(1, std::memory_order_release);
    progress_ns_.store(now_ns(), std::memory_order_relaxed);
    return true;
  }

  // Item `item`: the pieces of every list it holds, written to the output rows (a whole list) or to its
  // scratch slots (a cut list, merged by the piece that finishes the list).
  void attend_item(LayerPart& L, int64_t item) {
    switch (L.q.scalar_type()) {
      case torch::kBFloat16: attend_item_as<bf16>(L, item); break;
      case torch::kFloat16: attend_item_as<fp16>(L, item); break;
      default: attend_item_as<float>(L, item); break;
    }
  }

  template <typename T>
  void attend_item_as(LayerPart& L, int64_t item) {
    static thread_local std::vector<Segment<T, float>> segments;
    static thread_local std::vector<int64_t> lists;
    const ItemPlan& plan = L.plan;
    const int64_t G = L.dims.group_size, D = L.dims.head_dim, Hkv = L.num_kv_heads, Hq = L.num_qo_heads;
    const int64_t lo = plan.item_begin(item), hi = plan.item_end(item);
    const T* q = L.q.data_ptr<T>();
    const int32_t* table = L.pages.data_ptr<int32_t>();
    float* out_o = L.out_o.data_ptr<float>();
    float* out_lse = L.out_lse.data_ptr<float>();
    segments.clear();
    lists.clear();
    for (int64_t j = plan.first_list(item); j < plan.lists && plan.first_item(j) <= item; ++j) {
      const int64_t row = j / Hkv, head = j % Hkv, q_head = row * Hq + head * G;
      const int64_t begin = std::max(plan.start[j], lo) - plan.start[j];
      const int64_t end = std::min(plan.start[j + 1], hi) - plan.start[j];
      const int32_t* pages = table + j * L.capacity;
      const bool cut = plan.cut(j);
      const int64_t slot = 2 * item + (cut && plan.first_item(j) == item ? 1 : 0);
      float* o = cut ? L.partial_o.data() + slot * G * D : out_o + q_head * D;
      float* lse = cut ? L.partial_lse.data() + slot * G : out_lse + q_head;
      lists.push_back(j);
      if (L.drop) {  // the CPU part discarded (tests): empty results, reported OK
        if (!cut && plan.first_item(j) == item) write_empty(o, lse, G, D);
        continue;
      }
      const std::string bad = check_pages(L, pages, begin, end, row, head);
      if (!bad.empty()) {
        fail(L, static_cast<int32_t>(row), bad);
        continue;
      }
      segments.push_back(Segment<T, float>{q + q_head * D, pages, head, begin, end, o, lse});
    }
    if (!segments.empty() && L.error_row.load(std::memory_order_relaxed) < 0) {
      try {
        attend_segments<T, float>(L.k_cache.data_ptr<T>(), L.v_cache.data_ptr<T>(), Hkv, L.dims, L.scale,
                                  segments.data(), static_cast<int64_t>(segments.size()));
      } catch (const std::exception& e) {
        fail(L, static_cast<int32_t>(lists.front() / Hkv), e.what());
      }
    }
    for (int64_t j : lists) {
      if (!plan.cut(j) || L.pieces_left[j].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      // The list's last piece: merge its pieces (slot 2a + 1 of its first item a, slot 2i of the others).
      if (L.drop || L.error_row.load(std::memory_order_acquire) >= 0) continue;  // a failed part writes no row
      const int64_t first = plan.first_item(j), pieces = plan.last_item(j) - first + 1;
      const int64_t q_head = (j / Hkv) * Hq + (j % Hkv) * G;
      auto slot = [&](int64_t s) { return s == 0 ? 2 * first + 1 : 2 * (first + s); };
      merge_pieces(pieces, [&](int64_t s) { return L.partial_o.data() + slot(s) * G * D; },
                   [&](int64_t s) { return L.partial_lse.data() + slot(s) * G; }, G, D, out_o + q_head * D,
                   out_lse + q_head);
    }
    if (L.drop) {  // a dropped cut list: its first item writes the empty result
      for (int64_t j : lists) {
        if (plan.cut(j) && plan.first_item(j) == item) {
          const int64_t q_head = (j / Hkv) * Hq + (j % Hkv) * G;
          write_empty(out_o + q_head * D, out_lse + q_head, G, D);
        }
      }
    }
  }

  static void write_empty(float* o, float* lse, int64_t G, int64_t D) {
    std::fill(o, o + G * D, 0.0f);
    std::fill(lse, lse + G, -std::numeric_limits<float>::infinity());
  }

  // Blocks [begin, end) of a list must name pages of the host store (a torn or bad staging must not read out
  // of bounds) -> an error message, or empty.
  static std::string check_pages(const LayerPart& L, const int32_t* pages, int64_t begin, int64_t end, int64_t row,
                                 int64_t head) {
    for (int64_t i = begin; i < end; ++i) {
      if (pages[i] < 0 || pages[i] >= L.num_pages) {
        return "row " + std::to_string(row) + " head " + std::to_string(head) + ": page " +
               std::to_string(pages[i]) + " outside [0, " + std::to_string(L.num_pages) + ")";
      }
    }
    return std::string();
  }

  // The error path: the first failing row is the part's ERROR_ROW.
  void fail(LayerPart& L, int32_t row, const std::string& message) {
    int32_t none = -1;
    if (!L.error_row.compare_exchange_strong(none, row)) return;
    std::lock_guard<std::mutex> lock(L.error_mu);  // not counted: the error path
    L.error = message;
  }

  // The job's words (not for a stale job: its layer rang again), once.
  void finish(LayerPart& L) {
    if (!L.open.exchange(false)) return;
    if (!L.stale.load()) {
      const int32_t error_row = L.error_row.load();
      if (error_row >= 0) {
        std::lock_guard<std::mutex> lock(errors_mu_);
        std::lock_guard<std::mutex> error_lock(L.error_mu);
        errors_[L.index] = L.error;
      }
      __atomic_store_n(L.word + kStatusWord, error_row >= 0 ? kStatusError : kStatusOk, __ATOMIC_RELAXED);
      __atomic_store_n(L.word + kErrorRowWord, error_row, __ATOMIC_RELAXED);
      __atomic_store_n(L.word + kDoneWord, L.seq, __ATOMIC_RELEASE);
    }
    progress_ns_.store(now_ns(), std::memory_order_relaxed);
  }

  std::vector<int64_t> cpus_;
  bool pin_;
  int64_t grace_ns_, stall_ns_, min_item_blocks_;
  std::mutex mu_;  // threads_, parts_, scan_, parking; never taken per item
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<std::atomic<bool>>> alive_;
  std::vector<std::unique_ptr<std::atomic<int64_t>>> tids_;
  std::atomic<int64_t> busy_ns_{0}, ended_cpu_ns_{0}, locks_{0}, item_locks_{0};
  std::map<int64_t, std::unique_ptr<LayerPart>> parts_;
  std::vector<LayerPart*> scan_;
  std::atomic<int64_t> scan_version_{0};
  std::atomic<int64_t> progress_ns_{0};  // the last expect, kick, publish, item done or part finished
  std::atomic<bool> published_{true};    // a part of this step was published (before: thread 0 watches alone)
  std::atomic<uint64_t> wake_epoch_{0};
  std::atomic<int64_t> parked_{0};
  std::atomic<bool> stop_{false};
  int64_t replaced_ = 0;
  std::mutex errors_mu_;
  std::map<int64_t, std::string> errors_;
  std::mutex fault_mu_;
  FaultPlanDraws faults_;
  std::mt19937_64 random_{0};
};

}  // namespace
