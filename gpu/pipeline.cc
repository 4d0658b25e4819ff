// pipeline.cc — the GPU path's save and load pipelines (pipeline.h).
#include "gpu/pipeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "common/config.h"
#include "common/io.h"

namespace ckpt::gpu {
namespace {

constexpr uint64_t kMinChunk = 1ull << 20;
constexpr uint64_t kMaxPinned = 1ull << 40;
constexpr int kMaxBuffers = 16;
// Loads split a chunk over several readers only above this size: below it
// a thread costs more than it reads.
constexpr uint64_t kParallelReadMin = 8ull << 20;

std::string Quoted(const std::string& p) { return "'" + p + "'"; }

}  // namespace

Result<Options> OptionsFromEnv(std::string* why) {
  Options o;
  if (const char* v = std::getenv("CKPTFS_CUDA_PINNED"); v && *v) {
    std::string s = v;
    int buffers = kDefaultBuffers;
    if (auto x = s.find_first_of("xX"); x != std::string::npos) {
      std::string b = s.substr(0, x);
      auto n = ParseCount(b);
      if (!n || *n < 1 || *n > kMaxBuffers) {
        *why = "CKPTFS_CUDA_PINNED: want BxSIZE with B from 1 to 16, not " + Quoted(s);
        return Err(EINVAL);
      }
      buffers = static_cast<int>(*n);
      s = s.substr(x + 1);
    }
    auto size = ParseSize(s);
    if (!size || s.back() == '%') {
      *why = "CKPTFS_CUDA_PINNED: " + (size ? "a percentage is not a size" : size.error());
      return Err(EINVAL);
    }
    // "BxSIZE" gives each buffer SIZE; a lone SIZE is all of them together.
    uint64_t total = v != s ? *size * static_cast<uint64_t>(buffers) : *size;
    if (total / static_cast<uint64_t>(buffers) < kMinChunk || total > kMaxPinned) {
      *why = "CKPTFS_CUDA_PINNED: want at least 1M per buffer and at most 1T in all, not " + Quoted(v);
      return Err(EINVAL);
    }
    o.pinned_bytes = total;
    o.buffers = buffers;
  }
  if (const char* v = std::getenv("CKPTFS_CUDA_READ_THREADS"); v && *v) {
    auto n = ParseCount(v);
    if (!n || *n > 64) {
      *why = std::string("CKPTFS_CUDA_READ_THREADS: want a whole number from 1 to 64, not ") + Quoted(v);
      return Err(EINVAL);
    }
    o.read_threads = static_cast<int>(*n);
  }
  return o;
}

void SaveJob::Fail(int e, std::string why) {
  MutexLock lk(&mu_);
  if (err_) return;
  err_ = e;
  why_ = std::move(why);
}

int SaveJob::Error() {
  MutexLock lk(&mu_);
  return err_;
}

Engine::Engine(std::unique_ptr<Copier> copier, const Options& o)
    : copier_(std::move(copier)),
      opts_(o),
      chunk_(std::max<uint64_t>(kMinChunk, o.pinned_bytes / static_cast<uint64_t>(std::max(1, o.buffers))) /
             4096 * 4096),
      writer_([this] { WriterLoop(); }) {}

Engine::~Engine() {
  {
    MutexLock lk(&mu_);
    stop_ = true;
    cv_.NotifyAll();
  }
  writer_.join();
  MutexLock lk(&mu_);
  for (char* b : bufs_) copier_->FreePinned(b);
}

Status Engine::Acquire(std::string* why) {
  MutexLock lk(&mu_);
  while (held_) cv_.Wait(&mu_);
  if (bufs_.empty()) {
    for (int i = 0; i < std::max(1, opts_.buffers); i++) {
      auto p = copier_->AllocPinned(chunk_);
      if (!p) {
        for (char* b : bufs_) copier_->FreePinned(b);
        bufs_.clear();
        *why = "cannot allocate " + std::to_string(opts_.buffers) + " pinned buffers of " +
               std::to_string(chunk_ >> 20) + " MiB (CKPTFS_CUDA_PINNED): " + ErrStr(p.error());
        return Err(p.error());
      }
      bufs_.push_back(static_cast<char*>(*p));
    }
    busy_.assign(bufs_.size(), false);
  }
  held_ = true;
  return {};
}

void Engine::Release() {
  MutexLock lk(&mu_);
  held_ = false;
  cv_.NotifyAll();
}

void Engine::WaitBuffer(int b) {
  MutexLock lk(&mu_);
  while (busy_[b]) cv_.Wait(&mu_);
}

void Engine::Push(Chunk c) {
  MutexLock lk(&mu_);
  if (c.buf >= 0) busy_[c.buf] = true;
  queue_.push_back(std::move(c));
  cv_.NotifyAll();
}

Result<std::shared_ptr<SaveJob>> Engine::Save(const std::string& path, const std::vector<Tensor>& tensors,
                                              const Metadata& meta, std::string* why) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < tensors.size(); i++) {
    if (tensors[i].spec.nbytes && !tensors[i].ptr) {
      *why = "save " + Quoted(path) + ": tensor " + std::to_string(i) + " '" + tensors[i].spec.name +
             "' has a null address";
      return Err(EFAULT);
    }
    specs.push_back(tensors[i].spec);
  }
  std::string bad;
  auto layout = BuildHeader(specs, meta, &bad);
  if (!layout) {
    *why = "save " + Quoted(path) + ": " + bad;
    return Err(layout.error());
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") {
    *why = "save " + Quoted(path) + ": not a file name";
    return Err(EINVAL);
  }
  if (auto st = Acquire(why); !st) {
    *why = "save " + Quoted(path) + ": " + *why;
    return Err(st.error());
  }
  auto job = std::make_shared<SaveJob>();
  job->path_ = path;
  {
    MutexLock lk(&mu_);
    job->tmp_ = dir + "." + base + ".ckptfs-" + std::to_string(getpid()) + "-" + std::to_string(++seq_);
  }
  // O_TRUNC: on ckptfs a truncating open is what takes the passthrough
  // path (kernel writes straight into the tier file).
  job->fd_ = open(job->tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0666);
  if (job->fd_ < 0) {
    int e = errno;
    Release();
    *why = "save " + Quoted(path) + ": cannot create " + Quoted(job->tmp_) + ": " + ErrStr(e);
    return Err(e);
  }

  // The stream: the header, then each tensor at its offset.
  const Layout& l = *layout;
  const int nbuf = static_cast<int>(std::max(1, opts_.buffers));
  std::vector<bool> used(nbuf, false);
  int copy_err = 0;
  std::string copy_why;
  size_t ti = 0;  // the first tensor not wholly before this chunk
  for (uint64_t cs = 0, k = 0; cs < l.total && !copy_err; cs += chunk_, k++) {
    int b = static_cast<int>(k % static_cast<uint64_t>(nbuf));
    WaitBuffer(b);
    if (job->Error() || job->cancelled_) break;
    uint64_t ce = std::min(l.total, cs + chunk_);
    char* buf;
    {
      MutexLock lk(&mu_);
      buf = bufs_[b];
    }
    if (cs < l.header.size())
      std::memcpy(buf, l.header.data() + cs, std::min<uint64_t>(ce, l.header.size()) - cs);
    for (; ti < tensors.size(); ti++) {
      uint64_t ts = l.offsets[ti], te = ts + tensors[ti].spec.nbytes;
      if (ts >= ce) break;
      uint64_t s = std::max(ts, cs), e = std::min(te, ce);
      if (s < e) {
        if (auto st = copier_->ToHost(buf + (s - cs), tensors[ti].ptr + (s - ts), e - s); !st) {
          copy_err = st.error();
          copy_why = "tensor " + std::to_string(ti) + " '" + tensors[ti].spec.name + "': the copy to host failed: " +
                     ErrStr(copy_err);
          break;
        }
      }
      if (te > ce) break;  // continues in the next chunk
    }
    // Marked even after a failed enqueue: the copies enqueued into this
    // buffer must be waited for before anyone reuses it.
    auto rec = copier_->Record(b);
    used[b] = true;
    if (!rec && !copy_err) copy_err = rec.error(), copy_why = "marking the copy stream: " + ErrStr(copy_err);
    if (copy_err) break;
    Push(Chunk{job, b, cs, ce - cs});
  }
  // Every copy must have finished before Save returns: that is the promise
  // to the caller, whose tensors may change from then on.
  for (int b = 0; b < nbuf; b++) {
    if (!used[b]) continue;
    if (auto st = copier_->Wait(b); !st && !copy_err)
      copy_err = st.error(), copy_why = "the copy to host failed: " + ErrStr(copy_err);
  }
  if (copy_err) job->Fail(copy_err, copy_why);
  Push(Chunk{job, -1, 0, 0});
  if (job->Error()) {
    // The copies failed, or the writer already did: report it now, and
    // leave nothing behind (the writer removes the file).
    if (auto st = Wait(*job, why); !st) return Err(st.error());
  }
  return job;
}

void Engine::WriterLoop() {
  for (;;) {
    Chunk c;
    char* buf = nullptr;
    {
      MutexLock lk(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      c = std::move(queue_.front());
      queue_.pop_front();
      if (c.buf >= 0) buf = bufs_[c.buf];
    }
    SaveJob& job = *c.job;
    if (c.buf < 0) {
      Finish(job);
      continue;
    }
    if (auto st = copier_->Wait(c.buf); !st) {
      job.Fail(st.error(), "the copy to host failed: " + ErrStr(st.error()));
    } else if (!job.Error() && !job.cancelled_) {
      if (opts_.write_delay_us) std::this_thread::sleep_for(std::chrono::microseconds(opts_.write_delay_us));
      int e = 0;
      if (c.off <= opts_.fail_write_at && opts_.fail_write_at < c.off + c.len) e = opts_.fail_write_errno;
      if (!e) e = PwriteFull(job.fd_, buf, c.len, c.off);
      if (e) job.Fail(e, "writing " + Quoted(job.tmp_) + " at " + std::to_string(c.off) + ": " + ErrStr(e));
    }
    MutexLock lk(&mu_);
    busy_[c.buf] = false;
    cv_.NotifyAll();
  }
}

void Engine::Finish(SaveJob& job) {
  bool placed = false;
  if (!job.Error() && !job.cancelled_) {
    int fd = job.fd_;
    job.fd_ = -1;
    // close() is where ckptfs seals the version: its error is the save's.
    if (close(fd) != 0) {
      job.Fail(errno, "closing " + Quoted(job.tmp_) + ": " + ErrStr(errno));
    } else if (rename(job.tmp_.c_str(), job.path_.c_str()) != 0) {
      job.Fail(errno, "renaming " + Quoted(job.tmp_) + " to " + Quoted(job.path_) + ": " + ErrStr(errno));
    } else {
      placed = true;
    }
  }
  if (!placed) {
    if (job.fd_ >= 0) close(job.fd_);
    job.fd_ = -1;
    unlink(job.tmp_.c_str());
    if (!job.Error()) job.Fail(ECANCELED, "cancelled");
  }
  Release();
  MutexLock lk(&job.mu_);
  job.placed_ = placed;
  job.done_ = true;
  job.cv_.NotifyAll();
}

Status Engine::Wait(SaveJob& job, std::string* why) {
  MutexLock lk(&job.mu_);
  while (!job.done_) job.cv_.Wait(&job.mu_);
  if (job.err_) {
    *why = "save " + Quoted(job.path_) + ": " + job.why_;
    return Err(job.err_);
  }
  return {};
}

bool Engine::Cancel(SaveJob& job) {
  MutexLock lk(&job.mu_);
  if (job.done_) return false;
  job.cancelled_ = true;
  return true;
}

bool Engine::Done(SaveJob& job) {
  MutexLock lk(&job.mu_);
  return job.done_;
}

Result<Parsed> Engine::ReadHeader(const std::string& path, std::string* why) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "open " + Quoted(path) + ": " + ErrStr(errno);
    return Err(errno);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    *why = Quoted(path) + ": " + ErrStr(e);
    return Err(e);
  }
  Result<Parsed> p = ParseHeader(fd, static_cast<uint64_t>(st.st_size), why);
  close(fd);
  if (!p) *why = Quoted(path) + ": " + *why;
  return p;
}

int Engine::ParallelRead(int fd, char* dst, uint64_t len, uint64_t off) {
  int n = std::max(1, opts_.read_threads);
  if (n == 1 || len < kParallelReadMin) return PreadFull(fd, dst, len, off);
  uint64_t part = (len / static_cast<uint64_t>(n) + kMinChunk - 1) / kMinChunk * kMinChunk;
  std::vector<int> errs(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  for (int i = 1; i < n && part * static_cast<uint64_t>(i) < len; i++) {
    uint64_t s = part * static_cast<uint64_t>(i), e = std::min(len, s + part);
    threads.emplace_back([&, i, s, e] { errs[i] = PreadFull(fd, dst + s, e - s, off + s); });
  }
  errs[0] = PreadFull(fd, dst, std::min(len, part), off);
  for (auto& t : threads) t.join();
  for (int e : errs)
    if (e) return e;
  return 0;
}

Status Engine::Load(const std::string& path, const std::vector<Tensor>& tensors, std::string* why) {
  auto parsed = ReadHeader(path, why);
  if (!parsed) {
    *why = "load " + *why;
    return Err(parsed.error());
  }
  auto fail = [&](int e, std::string msg) -> Status {
    *why = "load " + Quoted(path) + ": " + msg;
    return Err(e);
  };
  // Which stored tensor each wanted one is.
  struct Piece {
    uint64_t off, n, ptr;
  };
  std::vector<Piece> pieces;
  bool by_name = !tensors.empty() && std::all_of(tensors.begin(), tensors.end(),
                                                 [](const Tensor& t) { return !t.spec.name.empty(); });
  std::map<std::string, const StoredTensor*> stored;
  for (const StoredTensor& s : parsed->tensors) stored[s.name] = &s;
  if (!by_name && tensors.size() != parsed->tensors.size())
    return fail(EINVAL, "the file holds " + std::to_string(parsed->tensors.size()) + " tensors, not " +
                            std::to_string(tensors.size()) + " (name them to load some)");
  for (size_t i = 0; i < tensors.size(); i++) {
    const Tensor& t = tensors[i];
    const StoredTensor* s = &parsed->tensors[std::min(i, parsed->tensors.size() - 1)];
    if (by_name) {
      auto it = stored.find(t.spec.name);
      if (it == stored.end()) return fail(ENOENT, "no tensor '" + t.spec.name + "' in the file");
      s = it->second;
    }
    std::string what = "tensor " + std::to_string(i) + " '" + s->name + "'";
    if (s->nbytes != t.spec.nbytes)
      return fail(EINVAL, what + " is " + std::to_string(s->nbytes) + " bytes, the destination " +
                              std::to_string(t.spec.nbytes));
    if (!t.spec.dtype.empty() && t.spec.dtype != s->dtype)
      return fail(EINVAL, what + " is " + s->dtype + ", the destination " + t.spec.dtype);
    if (s->nbytes && !t.ptr) return fail(EFAULT, what + ": the destination has a null address");
    if (s->nbytes) pieces.push_back(Piece{s->offset, s->nbytes, t.ptr});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.off < b.off; });

  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno, ErrStr(errno));
  if (auto st = Acquire(why); !st) {
    close(fd);
    return fail(st.error(), *why);
  }
  const int nbuf = static_cast<int>(std::max(1, opts_.buffers));
  std::vector<bool> used(nbuf, false);
  int err = 0;
  std::string err_why;
  // Chunks are contiguous file ranges of at most one buffer; a gap between
  // wanted tensors (a subset loaded by name) starts a new chunk.
  size_t pi = 0;
  uint64_t done_in_piece = 0;
  for (uint64_t k = 0; pi < pieces.size() && !err; k++) {
    int b = static_cast<int>(k % static_cast<uint64_t>(nbuf));
    if (used[b]) {
      if (auto st = copier_->Wait(b); !st) {
        err = st.error(), err_why = "the copy to the device failed: " + ErrStr(err);
        break;
      }
    }
    char* buf;
    {
      MutexLock lk(&mu_);
      buf = bufs_[b];
    }
    uint64_t cs = pieces[pi].off + done_in_piece, len = 0;
    struct Copy {
      uint64_t ptr, at, n;
    };
    std::vector<Copy> copies;
    while (pi < pieces.size() && len < chunk_ && pieces[pi].off + done_in_piece == cs + len) {
      uint64_t n = std::min(pieces[pi].n - done_in_piece, chunk_ - len);
      copies.push_back(Copy{pieces[pi].ptr + done_in_piece, len, n});
      len += n;
      done_in_piece += n;
      if (done_in_piece == pieces[pi].n) pi++, done_in_piece = 0;
    }
    if (int e = ParallelRead(fd, buf, len, cs)) {
      err = e, err_why = "reading at " + std::to_string(cs) + ": " + ErrStr(e);
      break;
    }
    for (const Copy& c : copies) {
      if (auto st = copier_->ToDevice(c.ptr, buf + c.at, c.n); !st) {
        err = st.error(), err_why = "the copy to the device failed: " + ErrStr(err);
        break;
      }
    }
    auto rec = copier_->Record(b);
    used[b] = true;
    if (!rec && !err) err = rec.error(), err_why = "marking the copy stream: " + ErrStr(err);
  }
  for (int b = 0; b < nbuf; b++) {
    if (!used[b]) continue;
    if (auto st = copier_->Wait(b); !st && !err)
      err = st.error(), err_why = "the copy to the device failed: " + ErrStr(err);
  }
  Release();
  close(fd);
  if (err) return fail(err, err_why);
  return {};
}

}  // namespace ckpt::gpu
