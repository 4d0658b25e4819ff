// replica_wire.cc — see replica_wire.h.
#include "fs/cluster/replica_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/result.h"
#include "common/xxhash_fast.h"

namespace ckpt::fs::replica {
namespace {

// op u16, reserved u16, text length u32, req, a, b, c, d (u64 each).
constexpr size_t kHeader = 2 + 2 + 4 + 5 * 8;

void Put64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; i++) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t Get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

bool KnownOp(uint16_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kHello:
    case Op::kChallenge:
    case Op::kProof:
    case Op::kReady:
    case Op::kPut:
    case Op::kChunk:
    case Op::kEnd:
    case Op::kAccepted:
    case Op::kAck:
    case Op::kHeld:
    case Op::kWait:
    case Op::kRefused:
    case Op::kAbort:
    case Op::kDrop:
    case Op::kDropped:
    case Op::kGet:
    case Op::kData:
    case Op::kFetch:
    case Op::kElsewhere:
    case Op::kFetchDirect:
    case Op::kFetchRelay: return true;
  }
  return false;
}

bool ParseU64(std::string_view s, uint64_t* v) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

void PutField(std::string* s, std::string_view f) {
  Put64(s, f.size());
  s->append(f);
}

}  // namespace

std::string Encode(const Msg& m, std::string_view key, char dir) {
  std::string s;
  s.reserve(kHeader + m.text.size() + 1 + kTagLen);
  const auto op = static_cast<uint16_t>(m.op);
  s.push_back(static_cast<char>(op & 0xff));
  s.push_back(static_cast<char>(op >> 8));
  s.push_back(key.empty() ? '\0' : '\1');  // sealed
  s.push_back('\0');
  const auto n = static_cast<uint32_t>(m.text.size());
  for (int i = 0; i < 4; i++) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  for (uint64_t v : {m.req, m.a, m.b, m.c, m.d}) Put64(&s, v);
  s.append(m.text);
  if (!key.empty()) {
    // The tag over the direction and every byte before it.
    s.push_back(dir);
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    const bool ok = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                         reinterpret_cast<const unsigned char*>(s.data()), s.size(), out, &len) != nullptr;
    s.pop_back();
    if (!ok) abort();  // HMAC-SHA256 over memory cannot fail but for a broken libcrypto
    s.append(reinterpret_cast<const char*>(out), kTagLen);
  }
  return s;
}

bool SealedBy(const Msg& m, std::string_view key, char dir) {
  if (key.empty() || m.tag.size() != kTagLen) return false;
  const std::string want = Encode(m, key, dir);
  return CRYPTO_memcmp(want.data() + want.size() - kTagLen, m.tag.data(), kTagLen) == 0;
}

std::optional<Msg> Decode(const void* p, size_t len) {
  if (len < kHeader) return std::nullopt;
  const auto* b = static_cast<const unsigned char*>(p);
  const uint16_t op = static_cast<uint16_t>(b[0] | (b[1] << 8));
  if (!KnownOp(op) || b[2] > 1 || b[3]) return std::nullopt;
  const size_t tag = b[2] ? kTagLen : 0;
  const uint32_t n = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
  if (n > kMaxText || len != kHeader + n + tag) return std::nullopt;
  Msg m;
  m.op = static_cast<Op>(op);
  m.req = Get64(b + 8);
  m.a = Get64(b + 16);
  m.b = Get64(b + 24);
  m.c = Get64(b + 32);
  m.d = Get64(b + 40);
  m.text.assign(reinterpret_cast<const char*>(b + kHeader), n);
  m.tag.assign(reinterpret_cast<const char*>(b + kHeader + n), tag);
  return m;
}

bool Answers(Op request, Op reply) {
  if (reply == Op::kRefused) return true;
  switch (request) {
    case Op::kPut: return reply == Op::kAccepted || reply == Op::kAck || reply == Op::kHeld || reply == Op::kWait;
    case Op::kDrop: return reply == Op::kDropped;
    case Op::kGet: return reply == Op::kData;
    case Op::kFetch: return reply == Op::kData || reply == Op::kElsewhere;
    default: return false;
  }
}

std::string HandshakePrefix(std::string_view host) {
  std::string h(host.substr(0, host.find('%')));
  in6_addr a{};
  if (inet_pton(AF_INET6, h.c_str(), &a) != 1) return std::string(host);
  char out[INET6_ADDRSTRLEN] = {};
  if (IN6_IS_ADDR_V4MAPPED(&a)) return inet_ntop(AF_INET, &a.s6_addr[12], out, sizeof out) ? out : h;
  std::memset(&a.s6_addr[8], 0, 8);
  return inet_ntop(AF_INET6, &a, out, sizeof out) ? std::string(out) + "/64" : h;
}

void HandshakeCount::Add(const std::string& host) {
  all_n_++;
  hosts_[host]++;
  prefixes_[HandshakePrefix(host)]++;
}

std::optional<HandshakeCount::Past> HandshakeCount::Admit(const std::string& host) {
  auto past = [](int bound, size_t n) { return n >= static_cast<size_t>(std::max(bound, 1)); };
  const std::string prefix = HandshakePrefix(host);
  if (past(all_, all_n_)) return Past{"", all_n_};
  if (const size_t n = hosts_[host]; !host.empty() && past(per_host_, n)) return Past{host, n};
  if (const size_t n = prefixes_[prefix]; prefix != host && past(per_prefix_, n)) return Past{prefix, n};
  Add(host);
  return std::nullopt;
}

bool ValidNodeId(std::string_view id) {
  if (id.empty() || id.size() > kMaxNodeId) return false;
  if (!isalnum(static_cast<unsigned char>(id[0]))) return false;
  for (char c : id)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') return false;
  return true;
}

std::string Key::Name() const { return writer + "." + std::to_string(ino) + "." + std::to_string(version); }

std::optional<Key> Key::Parse(std::string_view name) {
  // The node id may hold dots: the last two fields are the numbers.
  const size_t v = name.rfind('.');
  if (v == std::string_view::npos || v == 0) return std::nullopt;
  const size_t i = name.rfind('.', v - 1);
  if (i == std::string_view::npos) return std::nullopt;
  Key k;
  k.writer = std::string(name.substr(0, i));
  if (!ValidNodeId(k.writer) || !ParseU64(name.substr(i + 1, v - i - 1), &k.ino) ||
      !ParseU64(name.substr(v + 1), &k.version))
    return std::nullopt;
  return k;
}

std::string Content::Text() const { return std::to_string(size) + "\n" + path; }

std::optional<Content> Content::FromText(std::string_view text, uint64_t hi, uint64_t lo) {
  const size_t nl = text.find('\n');
  Content c{.path = {}, .size = 0, .hi = hi, .lo = lo};
  if (nl == std::string_view::npos || !ParseU64(text.substr(0, nl), &c.size)) return std::nullopt;
  c.path = std::string(text.substr(nl + 1));
  // A path as the backend names it: relative, no NUL, no empty, "." or ".." part.
  if (c.path.empty() || c.path.find('\0') != std::string::npos) return std::nullopt;
  for (size_t b = 0; b <= c.path.size();) {
    size_t e = c.path.find('/', b);
    if (e == std::string::npos) e = c.path.size();
    const std::string_view part(c.path.data() + b, e - b);
    if (part.empty() || part == "." || part == "..") return std::nullopt;
    b = e + 1;
  }
  return c;
}

std::expected<std::string, std::string> LoadSecret(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::unexpected(errno == ELOOP ? "is a symbolic link" : ErrStr(errno));
  struct stat st;
  std::string why;
  if (fstat(fd, &st) != 0) why = ErrStr(errno);
  else if (!S_ISREG(st.st_mode)) why = "is not a regular file";
  else if (st.st_uid != geteuid()) why = "belongs to another user";
  else if (st.st_mode & 077) why = "can be read or written by others than its owner (chmod 600 it)";
  else if (st.st_size > static_cast<off_t>(kMaxSecretLen) + 1) why = "is longer than 4096 bytes";
  std::string s;
  if (why.empty()) {
    s.resize(kMaxSecretLen + 2);
    ssize_t n = pread(fd, s.data(), s.size(), 0);
    if (n < 0) why = ErrStr(errno);
    else s.resize(static_cast<size_t>(n));
  }
  close(fd);
  if (!why.empty()) return std::unexpected(why);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (s.size() < kMinSecretLen) return std::unexpected("holds fewer than 16 bytes (use e.g. `openssl rand -hex 32`)");
  if (s.size() > kMaxSecretLen) return std::unexpected("is longer than 4096 bytes");
  return s;
}

std::string IncarnationText(uint64_t id) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(id));
  return out;
}

std::optional<uint64_t> IncarnationId(std::string_view text) {
  uint64_t id = 0;
  if (text.empty() || text.size() > 16) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return id;
}

std::string RandomNonce() {
  std::string n(kNonceLen, '\0');
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = getrandom(n.data() + got, n.size() - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
    else if (errno != EINTR) abort();  // getrandom cannot fail on Linux >= 3.17 once seeded
  }
  return n;
}

std::string HandshakeMac(std::string_view secret, std::string_view role, std::string_view nonce_c,
                         std::string_view nonce_s, std::string_view id_c, std::string_view id_s) {
  std::string in = "ckptfs-replica-2";  // 2: the holder's id told in READY
  for (std::string_view f : {role, nonce_c, nonce_s, id_c, id_s}) PutField(&in, f);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(in.data()), in.size(), out, &len))
    return {};
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string SessionKey(std::string_view secret, std::string_view nonce_c, std::string_view nonce_s,
                       std::string_view id_c, std::string_view id_s) {
  return HandshakeMac(secret, "session", nonce_c, nonce_s, id_c, id_s);
}

bool SameMac(std::string_view a, std::string_view b) {
  return a.size() == kMacLen && b.size() == kMacLen && CRYPTO_memcmp(a.data(), b.data(), kMacLen) == 0;
}

uint64_t ChunkHash(const void* p, size_t len) { return XXH3_64bits(p, len); }

namespace {

// An incarnation as a meta line carries it: 1 to 64 bytes, none a space,
// a newline or a control character.
bool MetaWord(std::string_view w) {
  return !w.empty() && w.size() <= 64 &&
         std::all_of(w.begin(), w.end(), [](char c) { return static_cast<unsigned char>(c) > 0x20 && c != 0x7f; });
}

}  // namespace

std::string EncodeMeta(const FileMeta& m) {
  const bool v2 = MetaWord(m.incarnation);
  return (v2 ? "2 " : "1 ") + std::to_string(m.seq) + " " + std::to_string(m.mode) + " " + std::to_string(m.uid) + " " +
         std::to_string(m.gid) + " " + (m.has_owner ? "1" : "0") + " " + std::to_string(m.mtime_sec) + " " +
         std::to_string(m.mtime_nsec) + (v2 ? " " + m.incarnation : "") + "\n" + m.path;
}

std::optional<FileMeta> DecodeMeta(std::string_view s) {
  const size_t nl = s.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  FileMeta m;
  m.path = std::string(s.substr(nl + 1));
  // A name may hold a newline (the path is everything after the first).
  if (m.path.empty() || m.path.find('\0') != std::string::npos) return std::nullopt;
  std::string_view head = s.substr(0, nl);
  std::vector<std::string_view> f;
  while (!head.empty()) {
    size_t sp = head.find(' ');
    f.push_back(head.substr(0, sp));
    head = sp == std::string_view::npos ? std::string_view() : head.substr(sp + 1);
  }
  uint64_t v[7];
  const bool v2 = f.size() == 9 && f[0] == "2" && MetaWord(f[8]);
  if (!v2 && (f.size() != 8 || f[0] != "1")) return std::nullopt;
  if (v2) m.incarnation = std::string(f[8]);
  for (int i = 0; i < 7; i++)
    if (!ParseU64(f[i + 1], &v[i]) && f[i + 1] != "0") return std::nullopt;
  for (int i = 0; i < 7; i++)
    if (f[i + 1] == "0") v[i] = 0;
  if (v[1] > 0xffffffffu || v[2] > 0xffffffffu || v[3] > 0xffffffffu || v[4] > 1 || v[6] >= 1000000000u ||
      v[5] > static_cast<uint64_t>(INT64_MAX))
    return std::nullopt;
  m.seq = v[0];
  m.mode = static_cast<uint32_t>(v[1]);
  m.uid = static_cast<uint32_t>(v[2]);
  m.gid = static_cast<uint32_t>(v[3]);
  m.has_owner = v[4] == 1;
  m.mtime_sec = static_cast<int64_t>(v[5]);
  m.mtime_nsec = static_cast<uint32_t>(v[6]);
  return m;
}

}  // namespace ckpt::fs::replica
