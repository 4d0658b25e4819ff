// fuse_uring.cc — see fuse_uring.h. The kernel's ABI (include/uapi/linux/
// fuse.h of 6.14+) is spelled out here: Debian 12's headers predate it.
#include "fs/fuse/fuse_uring.h"

#include <liburing.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/tsan_ring.h"
#include "common/log.h"
#include "fs/fuse/fuse_abi.h"
#include "fs/fuse/reply_yield.h"

namespace ckpt::fs {
namespace {

constexpr uint32_t kCmdRegister = 1, kCmdCommitAndFetch = 2;  // enum fuse_uring_cmd
constexpr size_t kInHeader = sizeof(fuse_abi::InHeader), kOutHeader = sizeof(fuse_abi::OutHeader);
constexpr size_t kHeaderArea = 128;                 // FUSE_URING_IN_OUT_HEADER_SZ, FUSE_URING_OP_IN_OUT_SZ
constexpr size_t kHeadroom = 4096;                  // room before the payload for the two headers
constexpr uint64_t kPollTag = 1;                    // user_data of the eventfd's poll

struct EntInOut {  // struct fuse_uring_ent_in_out
  uint64_t flags;
  uint64_t commit_id;
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
struct ReqHeader {  // struct fuse_uring_req_header
  char in_out[kHeaderArea];
  char op_in[kHeaderArea];
  EntInOut ent;
};
static_assert(sizeof(ReqHeader) == 288);

struct CmdReq {  // struct fuse_uring_cmd_req, in the SQE's 80-byte command area
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(CmdReq) == 24);

// nr_cpu_ids: the kernel keeps one queue per possible CPU and uses the ring
// only once each has an entry.
unsigned PossibleCpus() {
  std::ifstream f("/sys/devices/system/cpu/possible");  // "0-1", "0", "0-3,8-11"
  std::string s;
  if (!(f >> s) || s.empty()) return 0;
  size_t from = s.find_last_of("-,");
  try {
    return static_cast<unsigned>(std::stoul(s.substr(from == std::string::npos ? 0 : from + 1))) + 1;
  } catch (const std::exception&) {
    return 0;
  }
}

thread_local void* t_ring = nullptr;  // the ring this thread owns, if any

// An EIO reply to request `unique`, with no payload, in the entry's header.
void SetEioReply(char* in_out, uint64_t unique) {
  const fuse_abi::OutHeader h{static_cast<uint32_t>(kOutHeader), -EIO, unique};
  memcpy(in_out, &h, sizeof h);
}

}  // namespace

struct FuseUring::Entry {
  ReqHeader* header = nullptr;
  char* base = nullptr;  // kHeadroom + payload, mapped
  char* payload = nullptr;
  size_t payload_size = 0;
  struct iovec iov[2]{};
  Ring* ring = nullptr;
  uint64_t commit_id = 0;
  bool dead = false;
};

struct FuseUring::Ring {
  io_uring ring{};
  bool ring_ok = false;
  int efd = -1;
  uint16_t qid = 0;
  reply_yield::Group* group = nullptr;  // the queue's threads (FuseUring::groups_)
  std::vector<std::unique_ptr<Entry>> entries;
  Mutex mu;
  std::vector<Entry*> pending GUARDED_BY(mu);  // replies from other threads, to commit
  // Owner thread only: entries the kernel still holds.
  unsigned live = 0;
  int setup_err = 0;  // FuseUring::mu_
  ~Ring() {
    for (auto& e : entries) {
      if (e->base) munmap(e->base, kHeadroom + e->payload_size);
      delete e->header;
    }
    if (ring_ok) {
      RingUnmapped();  // before the munmap: see common/tsan_ring.h
      io_uring_queue_exit(&ring);
    }
    if (efd >= 0) close(efd);
  }
};

FuseUring::FuseUring(fuse_session* se, int fuse_fd, Options opt, std::function<void(const void*, size_t)> saw_request)
    : se_(se), fuse_fd_(fuse_fd), opt_(opt), saw_request_(std::move(saw_request)) {}

FuseUring::~FuseUring() { Stop(); }

std::string FuseUring::Unavailable() {
  std::ifstream f("/sys/module/fuse/parameters/enable_uring");
  std::string v;
  if (!(f >> v)) return "the kernel has no FUSE over io_uring (needs Linux 6.14+ with CONFIG_FUSE_IO_URING)";
  if (v != "Y" && v != "1")
    return "the fuse module's enable_uring is off (as root: echo Y > /sys/module/fuse/parameters/enable_uring)";
  return "";
}

std::string FuseUring::Enable() {
  constexpr const char* kParam = "/sys/module/fuse/parameters/enable_uring";
  std::string why = Unavailable();
  if (why.empty() || access(kParam, F_OK) != 0) return why;
  int fd = open(kParam, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, "Y", 1) != 1) {
    why += " and cannot be turned on here: " + ErrStr(errno);
  } else {
    LOG_INFO("fuse: turned on {} (lets FUSE servers ask for io_uring; -o io_uring=off leaves it alone)", kParam);
    why = Unavailable();
  }
  if (fd >= 0) close(fd);
  return why;
}

bool FuseUring::PrepFetch(Ring* r, Entry* e, uint32_t cmd, uint64_t commit_id) {
  io_uring_sqe* sqe = io_uring_get_sqe(&r->ring);
  if (!sqe) {
    io_uring_submit(&r->ring);
    sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) return false;
  }
  memset(sqe, 0, 2 * sizeof(io_uring_sqe));  // SQE128
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = fuse_fd_;
  sqe->cmd_op = cmd;
  sqe->addr = reinterpret_cast<uint64_t>(e->iov);
  sqe->len = 2;
  sqe->user_data = reinterpret_cast<uint64_t>(e);
  CmdReq req{};
  req.commit_id = commit_id;
  req.qid = r->qid;
  memcpy(sqe->cmd, &req, sizeof req);
  return true;
}

void FuseUring::PrepCommit(Ring* r, Entry* e) {
  if (!PrepFetch(r, e, kCmdCommitAndFetch, e->commit_id)) {
    LOG_ERROR("fuse io_uring: queue {}: no submission slot for a reply (request {})", r->qid, e->commit_id);
    e->dead = true;
    r->live--;
    return;
  }
  queue_armed_[r->qid].fetch_add(1, std::memory_order_relaxed);
}

void FuseUring::NoteTaken(Ring* r) {
  if (queue_armed_[r->qid].fetch_sub(1, std::memory_order_relaxed) != 1) return;
  // Every entry of the queue holds a request: what comes next on this CPU
  // waits until one is answered. Normal for a moment; worth a line (once a
  // minute) when they are requests answered later, such as writes waiting
  // for space, which can hold them for as long as the drain takes.
  const int64_t now = time(nullptr);
  int64_t last = queue_warned_[r->qid].load(std::memory_order_relaxed);
  if (now - last < 60 || !queue_warned_[r->qid].compare_exchange_strong(last, now)) return;
  LOG_WARN("fuse io_uring: queue {}: all {} entries hold requests; requests from CPU {} wait for one to be answered",
           r->qid, entries_per_thread_ * threads_per_queue_, r->qid);
}

Status FuseUring::AddEntry(Ring* r) {
  auto e = std::make_unique<Entry>();
  e->ring = r;
  e->header = new ReqHeader{};
  e->payload_size = opt_.payload;
  // Only the pages a request fills are ever backed; nothing reserved.
  void* m = mmap(nullptr, kHeadroom + e->payload_size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    delete e->header;
    return ErrFromErrno();
  }
  e->base = static_cast<char*>(m);
  e->payload = e->base + kHeadroom;
  e->iov[0] = {e->header, sizeof(ReqHeader)};
  e->iov[1] = {e->payload, e->payload_size};
  Entry* raw = e.get();
  r->entries.push_back(std::move(e));
  if (!PrepFetch(r, raw, kCmdRegister, 0)) return Err(ENOSPC);
  r->live++;
  queue_armed_[r->qid].fetch_add(1, std::memory_order_relaxed);
  return {};
}

Status FuseUring::Setup(Ring* r, unsigned entries) {
  io_uring_params p{};
  p.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
  p.cq_entries = 2 * std::max(entries, 16u);  // every entry's completion, and the eventfd's
  if (int rc = io_uring_queue_init_params(16, &r->ring, &p); rc < 0) return Err(-rc);
  RingMapped();
  r->ring_ok = true;
  r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->efd < 0) return ErrFromErrno();
  if (auto st = AddEntry(r); !st) return st;
  io_uring_sqe* sqe = io_uring_get_sqe(&r->ring);
  io_uring_prep_poll_add(sqe, r->efd, POLLIN);
  io_uring_sqe_set_data64(sqe, kPollTag);
  if (int rc = io_uring_submit(&r->ring); rc < 0) return Err(-rc);
  // A refusal (the payload too small, a queue the kernel does not have)
  // completes at once; an accepted entry completes with a request.
  io_uring_cqe* cqe = nullptr;
  if (io_uring_peek_cqe(&r->ring, &cqe) == 0 && cqe && cqe->user_data != kPollTag && cqe->res < 0)
    return Err(-cqe->res);
  // The rest now, all of them: an entry registered later would take only
  // requests that arrive after it, never one the kernel queued while every
  // entry of the queue was taken, and that one would then wait for a reply
  // to come through this queue (fs/fuse/fuse_uring.h). One at a time, giving
  // the CPU to the queue's other threads in between, so that consecutive
  // entries of the kernel's list belong to different threads.
  for (unsigned i = 1; i < entries; i++) {
    if (auto st = AddEntry(r); !st) {
      LOG_WARN("fuse io_uring: queue {}: {} of {} entries registered: {}", r->qid, i, entries, ErrStr(st.error()));
      break;
    }
    (void)io_uring_submit(&r->ring);
    sched_yield();
  }
  return {};
}

Status FuseUring::Start() {
  nqueues_ = PossibleCpus();
  if (nqueues_ == 0) return Err(ENODEV);
  // 2 to 8 CPUs: 4 threads per queue; 16: 2; more: 2.
  const unsigned threads = opt_.threads_per_queue ? opt_.threads_per_queue : std::clamp(32 / nqueues_, 2u, 4u);
  // Entries per queue: 256 up to 4 CPUs, fewer with more CPUs (callers
  // spread over their queues), at least 32.
  const unsigned per_queue = opt_.entries_per_queue ? opt_.entries_per_queue : std::clamp(1024 / nqueues_, 32u, 256u);
  threads_per_queue_ = threads;
  entries_per_thread_ = std::max(1u, (per_queue + threads - 1) / threads);
  queue_armed_ = std::make_unique<std::atomic<int>[]>(nqueues_);
  queue_warned_ = std::make_unique<std::atomic<int64_t>[]>(nqueues_);
  for (unsigned q = 0; q < nqueues_; q++) {
    groups_.push_back(std::make_unique<reply_yield::Group>());
    for (unsigned t = 0; t < threads; t++) {
      rings_.push_back(std::make_unique<Ring>());
      rings_.back()->qid = static_cast<uint16_t>(q);
      rings_.back()->group = groups_.back().get();
    }
  }
  // Each thread sets up its own ring: the kernel hands a request to the
  // task that submitted the entry (task work), so that must be the thread
  // that waits on the ring — not this one, which goes back to /dev/fuse,
  // where nothing may come again.
  for (auto& r : rings_) threads_.emplace_back([this, ring = r.get()] { Loop(ring); });
  std::vector<bool> queue_ok(nqueues_, false);
  int first_err = 0;
  {
    MutexLock lk(&mu_);
    while (setups_done_ < rings_.size()) setup_cv_.Wait(&mu_);
    for (auto& r : rings_)
      if (r->setup_err == 0) queue_ok[r->qid] = true;
      else if (!first_err) first_err = r->setup_err;
  }
  if (std::find(queue_ok.begin(), queue_ok.end(), false) != queue_ok.end()) {
    // Some queue has no entry: the kernel never uses the rings (requests
    // stay on /dev/fuse), so they can all go.
    Stop();
    return Err(first_err ? first_err : EIO);
  }
  // Every queue has an entry: the kernel uses the rings now. A thread whose
  // setup failed has ended; the others serve its queue.
  if (first_err) LOG_WARN("fuse io_uring: a ring could not be set up: {}", ErrStr(first_err));
  running_.store(true, std::memory_order_release);
  LOG_INFO("fuse: requests over io_uring ({} queues, {} threads and {} entries each)", nqueues_, threads,
           threads * entries_per_thread_);
  return {};
}

void FuseUring::StopDispatch() {
  MutexLock lk(&mu_);
  dispatching_ = false;
  while (handling_ > 0) handled_cv_.Wait(&mu_);
}

void FuseUring::Stop() {
  if (threads_.empty() && rings_.empty()) return;
  StopDispatch();
  stopping_.store(true, std::memory_order_release);
  for (auto& r : rings_) {
    uint64_t one = 1;
    if (write(r->efd, &one, sizeof one) < 0) {
    }
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  {
    // From here no reply touches an entry: later ones are dropped, and
    // those under way (another thread copying into an entry, queueing it on
    // its ring, writing the ring's eventfd) end before the rings go.
    MutexLock lk(&mu_);
    stopped_ = true;
    while (replying_ > 0) replied_cv_.Wait(&mu_);
  }
  rings_.clear();
  groups_.clear();
  running_.store(false, std::memory_order_release);
}

void FuseUring::Loop(Ring* r) {
  t_ring = r;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(r->qid, &set);
  // Pinned: the caller sleeps and its CPU runs the handler, with no
  // wake-up of another CPU. Measured (docs/benchmarks.md): a 4-rank DCP
  // save 8-10 ms faster pinned; a lone reader's open + read + close of
  // small files 20% slower (the asynchronous RELEASE is handled on the
  // reader's CPU). The save is what the product is for.
  (void)sched_setaffinity(0, sizeof set, &set);  // an offline CPU: its queue is never used anyway
  reply_yield::Group::Member member(*r->group);
  Status st = Setup(r, entries_per_thread_);
  {
    MutexLock lk(&mu_);
    r->setup_err = st ? 0 : st.error();
    setups_done_++;
    setup_cv_.NotifyAll();
  }
  if (!st) {
    t_ring = nullptr;
    return;
  }
  while (!stopping_.load(std::memory_order_acquire)) {
    // Replies to hand over: at SCHED_IDLE, so each caller wakes on its own
    // CPU instead of being moved to an idle one (fs/fuse/reply_yield.h).
    if (reply_yield::On() && io_uring_sq_ready(&r->ring) > 0) {
      reply_yield::Scope idle;
      (void)io_uring_submit(&r->ring);  // what it did not take, the wait below submits
    }
    int rc = io_uring_submit_and_wait(&r->ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      LOG_ERROR("fuse io_uring: queue {}: waiting failed: {}", r->qid, ErrStr(-rc));
      break;
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    std::vector<Entry*> ready;
    bool poll = false;
    io_uring_for_each_cqe(&r->ring, head, cqe) {
      seen++;
      if (cqe->user_data == kPollTag) {
        poll = true;
        continue;
      }
      auto* e = reinterpret_cast<Entry*>(cqe->user_data);
      if (cqe->res < 0) {
        // The connection is gone (unmount, abort): the entry is done.
        if (!e->dead) {
          e->dead = true;
          r->live--;
          queue_armed_[r->qid].fetch_sub(1, std::memory_order_relaxed);
        }
        if (cqe->res != -ENOTCONN && cqe->res != -ECANCELED && !stopping_.load())
          LOG_ERROR("fuse io_uring: queue {}: entry failed: {}", r->qid, ErrStr(-cqe->res));
        continue;
      }
      ready.push_back(e);
      NoteTaken(r);
    }
    io_uring_cq_advance(&r->ring, seen);
    // Once the session loop has ended (StopDispatch), a request stays in
    // its entry, unanswered until the connection ends, as one left unread
    // on /dev/fuse does.
    if (!ready.empty()) {
      bool handle;
      {
        MutexLock lk(&mu_);
        handle = dispatching_;
        if (handle) handling_++;
      }
      if (handle) {
        for (Entry* e : ready) Dispatch(r, e);
        MutexLock lk(&mu_);
        if (--handling_ == 0 && !dispatching_) handled_cv_.NotifyAll();
      }
    }
    if (poll) {
      uint64_t v;
      if (read(r->efd, &v, sizeof v) < 0) {
      }
      std::vector<Entry*> todo;
      {
        MutexLock lk(&r->mu);
        todo.swap(r->pending);
      }
      for (Entry* e : todo) PrepCommit(r, e);
      if (!stopping_.load()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) {
          io_uring_submit(&r->ring);
          sqe = io_uring_get_sqe(&r->ring);
        }
        if (sqe) {
          io_uring_prep_poll_add(sqe, r->efd, POLLIN);
          io_uring_sqe_set_data64(sqe, kPollTag);
        }
      }
    }
    if (r->live == 0) break;  // the kernel holds none of our entries any more
  }
  io_uring_submit(&r->ring);  // commits still prepared
  t_ring = nullptr;
}

void FuseUring::Dispatch(Ring* r, Entry* e) {
  fuse_abi::InHeader in;
  memcpy(&in, e->header->in_out, sizeof in);
  const uint32_t len = in.len;
  const uint64_t unique = in.unique;
  const EntInOut ent = e->header->ent;
  e->commit_id = ent.commit_id;
  // The request's length counts the per-op header, which the kernel put in
  // op_in, and the payload: what lies between them is the op header's size.
  const size_t payload = ent.payload_sz;
  if (len < kInHeader + payload || len - kInHeader - payload > kHeaderArea || payload > e->payload_size) {
    LOG_ERROR("fuse io_uring: queue {}: malformed request {} (length {}, payload {})", r->qid, unique, len, payload);
    // Answer EIO so the caller and the entry are not held forever.
    SetEioReply(e->header->in_out, unique);
    e->header->ent.payload_sz = 0;
    PrepCommit(r, e);
    return;
  }
  const size_t op = len - kInHeader - payload;
  char* start = e->payload - op - kInHeader;
  memcpy(start, e->header->in_out, kInHeader);
  memcpy(start + kInHeader, e->header->op_in, op);
  {
    MutexLock lk(&mu_);
    inflight_[unique] = e;
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (saw_request_) saw_request_(start, len);
  fuse_buf buf{};
  buf.size = len;
  buf.mem = start;
  fuse_session_process_buf(se_, &buf);
}

bool FuseUring::Reply(const struct iovec* iov, int count, ssize_t* written) {
  if (count < 1 || iov[0].iov_len < kOutHeader) return false;
  fuse_abi::OutHeader out;
  memcpy(&out, iov[0].iov_base, sizeof out);
  const uint64_t unique = out.unique;
  size_t total = 0;
  for (int i = 0; i < count; i++) total += iov[i].iov_len;
  Entry* e;
  {
    MutexLock lk(&mu_);
    auto it = inflight_.find(unique);
    if (it == inflight_.end()) return false;
    e = it->second;
    inflight_.erase(it);
    if (stopped_) {
      // The rings are gone (or going): the request came through one, so
      // not to /dev/fuse either; the kernel answers its caller when the
      // connection ends.
      *written = static_cast<ssize_t>(total);
      return true;
    }
    replying_++;
  }
  memcpy(e->header->in_out, iov[0].iov_base, kOutHeader);
  size_t at = 0;
  bool fits = total - kOutHeader <= e->payload_size;
  if (fits) {
    for (int i = 0; i < count; i++) {
      const char* p = static_cast<const char*>(iov[i].iov_base);
      size_t n = iov[i].iov_len;
      if (i == 0) p += kOutHeader, n -= kOutHeader;
      memcpy(e->payload + at, p, n);
      at += n;
    }
  } else {
    LOG_ERROR("fuse io_uring: reply to request {} is {} bytes, more than an entry holds", unique, total);
    SetEioReply(e->header->in_out, unique);
  }
  e->header->ent.payload_sz = static_cast<uint32_t>(at);
  Ring* r = e->ring;
  if (t_ring == r) {
    PrepCommit(r, e);  // submitted with the thread's next wait: one system call for both
  } else {
    {
      MutexLock lk(&r->mu);
      r->pending.push_back(e);
    }
    uint64_t one = 1;
    if (write(r->efd, &one, sizeof one) < 0) {
    }
  }
  {
    MutexLock lk(&mu_);
    if (--replying_ == 0 && stopped_) replied_cv_.NotifyAll();
  }
  *written = static_cast<ssize_t>(total);
  return true;
}

}  // namespace ckpt::fs
