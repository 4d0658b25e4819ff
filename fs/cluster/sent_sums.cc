// sent_sums.cc — see sent_sums.h.
#include "fs/cluster/sent_sums.h"

#include <cerrno>
#include <string>
#include <vector>

#include "fs/meta/keys.h"

namespace ckpt::fs::replica {

Status RememberSentSum(meta::Kv* kv, uint64_t ino, uint64_t version, uint64_t hi, uint64_t lo) {
  std::string v;
  meta::AppendU64BE(&v, hi);
  meta::AppendU64BE(&v, lo);
  meta::Batch b;
  b.Put(meta::SentSumKey(ino, version), v);
  return kv->Write(b);
}

Status ForgetSentSum(meta::Kv* kv, uint64_t ino, uint64_t version) {
  meta::Batch b;
  b.Delete(meta::SentSumKey(ino, version));
  return kv->Write(b);
}

Result<std::optional<std::pair<uint64_t, uint64_t>>> SentSum(meta::Kv* kv, uint64_t ino, uint64_t version) {
  using Sum = std::optional<std::pair<uint64_t, uint64_t>>;
  auto v = kv->Get(meta::SentSumKey(ino, version));
  if (!v && v.error() != ENOENT) return Err(v.error());
  if (!v || v->size() != 16) return Sum{};
  return Sum{std::make_pair(meta::ReadU64BE(*v, 0), meta::ReadU64BE(*v, 8))};
}

Result<uint64_t> SweepSentSums(meta::Kv* kv, const std::function<bool(uint64_t ino, uint64_t version)>& needed) {
  std::vector<std::string> keys;
  auto st = kv->Scan(std::string(1, meta::kSentSumPrefix), [&](std::string_view k, std::string_view) {
    keys.emplace_back(k);
    return true;
  });
  if (!st) return Err(st.error());
  meta::Batch b;
  for (const std::string& k : keys)
    if (k.size() != 17 || !needed(meta::ReadU64BE(k, 1), meta::ReadU64BE(k, 9))) b.Delete(k);
  if (b.empty()) return 0;
  if (auto w = kv->Write(b); !w) return Err(w.error());
  return b.size();
}

}  // namespace ckpt::fs::replica
