// peer_copy.cc — see peer_copy.h.
#include "fs/core/peer_copy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

namespace ckpt::fs {

Result<int> LocalCopyForPeer(InodeTable* t, const std::string& path, uint64_t size, uint64_t hi, uint64_t lo,
                             bool fetch) {
  if ((hi | lo) == 0) return Err(ENOENT);
  std::vector<uint64_t> looked;  // lookups this took: given back at the end
  struct Forget {
    InodeTable* t;
    std::vector<uint64_t>* looked;
    ~Forget() {
      for (uint64_t ino : *looked) t->Forget(ino, 1);
    }
  } forget{t, &looked};
  SharedNamespace& shared = t->shared_ns();
  uint64_t ino = meta::kRootIno;
  for (size_t b = 0; b <= path.size();) {
    size_t e = path.find('/', b);
    if (e == std::string::npos) e = path.size();
    const std::string_view name(path.data() + b, e - b);
    if (name.empty() || name == "." || name == "..") return Err(ENOENT);
    auto r = shared.enabled() ? shared.Lookup(ino, name) : t->Lookup(ino, name);
    if (!r) return Err(r.error() == ENOTDIR || r.error() == ELOOP ? ENOENT : r.error());
    looked.push_back(r->ino);
    ino = r->ino;
    b = e + 1;
  }
  auto same = [&](const InodeRecord& r, bool remote_ok) {
    return S_ISREG(r.mode) && r.size == size && r.checksum_hi == hi && r.checksum_lo == lo &&
           (r.state == meta::DataState::kPersisted || (remote_ok && r.state == meta::DataState::kRemote));
  };
  auto rec = t->GetAttr(ino);
  if (!rec || !same(*rec, fetch)) return Err(ENOENT);
  auto fd = t->Open(ino, O_RDONLY);  // fetches a remote file
  if (!fd) return Err(fd.error());
  int mine = fcntl(*fd, F_DUPFD_CLOEXEC, 0);
  const int dup_err = errno;
  t->Release(ino, O_RDONLY);
  if (mine < 0) return Err(dup_err);
  rec = t->GetAttr(ino);  // the bytes fetched are the ones asked for
  if (!rec || !same(*rec, false)) {
    close(mine);
    return Err(ENOENT);
  }
  return mine;
}

}  // namespace ckpt::fs
