// commands.cc — the client commands `status`, `drain`, `umount` and `lost`:
// they talk to a running daemon through xattrs on its mount root (the
// status document and the lost pages of fs/views/status.cc), and the helpers
// every command shares (Die, Absolute, MountedType).
//
// Every user error is one line on stderr and a non-zero exit. Names that
// come back from the daemon (lost files, errors) are printed escaped, never
// as raw bytes to a terminal; no path goes through a shell (RunCommand).
#include "cli/commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/config.h"
#include "common/mounts.h"
#include "common/spawn.h"
#include "common/text.h"
#include "fs/daemon.h"

namespace ckpt::cli {

namespace stdfs = std::filesystem;

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "ckptfs: %s\n", msg.c_str());
  exit(1);
}

// The filesystem type mounted at `path`, or "" if none.
std::string MountedType(const std::string& path) {
  auto m = MountAt(path);
  return m ? m->fstype : std::string();
}

void PrintJson(const Json& j) { printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str()); }

std::string Absolute(const std::string& p) {
  std::error_code ec;
  auto a = stdfs::absolute(p, ec);
  if (ec) Die("bad path " + p);
  return a.lexically_normal().string();
}

// Reads the daemon's status document (the root's user.ckptfs.status xattr).
// Returns 0, or the errno of the read (EBADMSG: not a JSON object).
namespace {
// Whether process `pid` still runs: an exited one that its parent (init,
// for the detached daemon) has not reaped yet is a zombie, and kill(pid, 0)
// still finds it — in a container whose init reaps every second or two,
// `ckptfs umount` waited that long for a daemon long gone.
bool Running(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return true;
  const size_t paren = line.rfind(')');  // the name may hold spaces and ')'
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}
}  // namespace

int ReadStatus(const std::string& mnt, Json* out) {
  std::string buf(256 * 1024, '\0');
  ssize_t n = getxattr(mnt.c_str(), fs::kStatusXattr, buf.data(), buf.size());
  if (n < 0) return errno;
  buf.resize(static_cast<size_t>(n));
  *out = Json::parse(buf, nullptr, false);
  return out->is_object() ? 0 : EBADMSG;
}

Json StatusOrDie(const std::string& mnt) {
  Json j;
  if (int e = ReadStatus(mnt, &j); e != 0) {
    if (e == ENODATA || e == ENOTSUP) Die(mnt + " is not a ckptfs mount (" + ErrStr(e) + ")");
    Die("cannot read the status of " + mnt + ": " + ErrStr(e));
  }
  return j;
}

// Field readers that take a missing field (an older or newer daemon) as
// its default instead of throwing.
uint64_t U64(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<uint64_t>() : 0;
}
double Dbl(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}
std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool Bool(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}
const Json& Obj(const Json& j, const char* key) {
  static const Json kEmpty = Json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

namespace {

std::string Eta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "--:--";
  int t = static_cast<int>(seconds);
  return fmt::format("{:02d}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60);
}

// Prints on stderr each file that the status lists as failed or lost (the
// backend does not hold it) and returns how many there are.
int ReportNotPersisted(const Json& j) {
  const Json& f = Obj(j, "failed");
  uint64_t failed = U64(f, "count");
  uint64_t lost = j.contains("lost_count") ? U64(j, "lost_count") : 0;
  if (auto it = f.find("first"); it != f.end() && it->is_array())
    for (const Json& e : *it)
      if (e.is_object())
        fprintf(stderr, "  failed: %s: %s\n", EscapeName(Str(e, "path")).c_str(), EscapeName(Str(e, "reason")).c_str());
  if (auto it = j.find("lost"); it != j.end() && it->is_array())
    for (const Json& l : *it)
      if (l.is_string()) fprintf(stderr, "  lost: %s\n", EscapeName(l.get<std::string>()).c_str());
  return static_cast<int>(std::min<uint64_t>(failed + lost, 1u << 30));
}

// WaitDrained's answer when everything was applied but some files are
// not in the backend (failed, skipped or lost: named on stderr).
constexpr int kDrainedWithout = 3;

// Waits until everything logged when it started is in the backend. Returns
// 0 when done, kDrainedWithout when done but files failed or were lost, 1
// on timeout, when the drain holds at a refused file, or when the mount is
// read-only (the drain stops then, fs/drain/drain.h: waiting would never end),
// with a message that ends in `read_only_hint`.
int WaitDrained(const std::string& mnt, double timeout_s, const std::string& read_only_hint) {
  const int64_t started_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  bool retry_asked = false;
  Json j = StatusOrDie(mnt);
  uint64_t target = U64(Obj(j, "drain"), "head_seq");
  bool tty = isatty(STDERR_FILENO);
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  double last_plain = -10;
  bool shown = false;  // a progress line is on the terminal
  for (;;) {
    if (std::string ro = Str(j, "read_only"); !ro.empty()) {
      if (tty && shown) fprintf(stderr, "\n");
      fprintf(stderr, "ckptfs: mount is read-only (%s): the drain cannot record progress; %s\n", EscapeName(ro).c_str(),
              read_only_hint.c_str());
      return 1;
    }
    shown = true;
    const Json& dr = Obj(j, "drain");
    uint64_t applied = U64(dr, "applied_seq");
    uint64_t pending = U64(Obj(j, "dirty"), "bytes") + U64(Obj(j, "draining"), "bytes");
    total = std::max(total, pending);
    double rate = Dbl(dr, "rate");
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bool done = applied >= target;
    std::string err = Bool(dr, "in_error") ? "  backend error: " + EscapeName(Str(dr, "last_error")) : "";
    std::string line = fmt::format("drain: {} to go, {}/s, ETA {}, {} entries queued{}", HumanBytes(pending),
                                   HumanBytes(static_cast<uint64_t>(rate)), Eta(rate > 0 ? pending / rate : -1),
                                   U64(dr, "queue"), err);
    if (tty) {
      int width = 30;
      int fill =
          total ? static_cast<int>(width * (1.0 - static_cast<double>(pending) / static_cast<double>(total))) : width;
      if (done) fill = width;
      fprintf(stderr, "\r[%s%s] %s\033[K", std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
              line.c_str());
    } else if (elapsed - last_plain >= 5 || done) {
      fprintf(stderr, "%s\n", line.c_str());
      last_plain = elapsed;
    }
    // Held at a refusal at or before the target: no waiting ends that
    // but an operator's fix or skip, so once the drain has tried it again
    // since this command began (asked to at once: the fix may be done),
    // say so.
    const auto h = dr.find("held");
    const bool held = !done && h != dr.end() && h->is_object() && U64(*h, "seq") <= target;
    if (held && !retry_asked) {
      retry_asked = true;
      (void)setxattr(mnt.c_str(), fs::kRetryXattr, "1", 1, 0);  // EPERM for others: they wait for the timer
    }
    if (held && static_cast<int64_t>(U64(*h, "tried_ms")) >= started_ms) {
      if (tty) fprintf(stderr, "\n");
      fprintf(stderr,
              "ckptfs: the drain holds at %s: the backend refuses it for good (%s); %llu entries wait behind it. "
              "Fix the backend (it is retried) or give the file up with `ckptfs skip %s %s`\n",
              EscapeName(Str(*h, "path")).c_str(), EscapeName(Str(*h, "reason")).c_str(),
              static_cast<unsigned long long>(U64(*h, "behind")), EscapeName(mnt).c_str(),
              EscapeName(Str(*h, "path")).c_str());
      return 1;
    }
    if (done) {
      if (tty) fprintf(stderr, "\n");
      // Applied is not persisted: files refused (skipped) or lost are named,
      // and the drain fails until they are healed or `ckptfs lost --clear`.
      if (int bad = ReportNotPersisted(j); bad > 0) {
        fprintf(stderr,
                "ckptfs: drain: %d files are not in the backend (above); the rest closed before the drain began "
                "is persisted. `ckptfs lost %s --clear` forgets them once dealt with\n",
                bad, EscapeName(mnt).c_str());
        return kDrainedWithout;
      }
      // Not a failure (nothing the trainer wrote is missing), but the
      // backend holds more than the mount: said, not hidden.
      if (uint64_t kept = U64(Obj(j, "cluster"), "kept_removals"); kept > 0)
        fprintf(stderr,
                "drain: note: %llu removals were not applied to the backend, being ordered after a lost member's "
                "files (`ckptfs status %s` lists them: kept)\n",
                static_cast<unsigned long long>(kept), EscapeName(mnt).c_str());
      fprintf(stderr, "drain: everything closed before the drain began is persisted (%.1f s)\n", elapsed);
      return 0;
    }
    if (timeout_s > 0 && elapsed > timeout_s) {
      if (tty) fprintf(stderr, "\n");
      fprintf(stderr, "ckptfs: drain timed out after %.0f s with %s still to persist%s\n", timeout_s,
              HumanBytes(pending).c_str(), err.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 200 : 500));
    j = StatusOrDie(mnt);
  }
}

// The mount's type, or a one-line exit when it is not a ckptfs mount.
void RequireCkptfsMount(const std::string& mnt) {
  std::string type = MountedType(mnt);
  if (type.empty()) Die(mnt + " is not mounted");
  if (type != "fuse.ckptfs") Die(mnt + " is not a ckptfs mount (" + type + ")");
}

// The command's MOUNTPOINT argument, absolute and checked to be a ckptfs
// mount (exits with one line otherwise).
std::string CheckedMount(const std::string& mnt_in) {
  std::string mnt = Absolute(mnt_in);
  RequireCkptfsMount(mnt);
  return mnt;
}

// Calls fn with each page of the paged root xattr `prefix`N (the lost
// list, the checkpoints) until the daemon says there is none. Exits with
// one line naming `what` when it cannot read one.
void ForEachPage(const std::string& mnt, const char* prefix, const char* what,
                 const std::function<void(std::string_view)>& fn) {
  std::string buf(256 * 1024, '\0');
  for (uint64_t page = 0;; page++) {
    std::string name = prefix + std::to_string(page);
    ssize_t n = getxattr(mnt.c_str(), name.c_str(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == ENODATA && page > 0) return;
      Die(std::string("cannot read the ") + what + " of " + mnt + ": " + ErrStr(errno) +
          (errno == ENODATA ? " (a daemon older than this command?)" : ""));
    }
    fn(std::string_view(buf.data(), static_cast<size_t>(n)));
  }
}

// Reads the whole lost list (pages of NUL-terminated paths).
std::vector<std::string> ReadLost(const std::string& mnt) {
  std::vector<std::string> out;
  ForEachPage(mnt, fs::kLostXattrPrefix, "lost list", [&](std::string_view v) {
    while (!v.empty()) {
      size_t z = v.find('\0');
      out.emplace_back(v.substr(0, z));
      v.remove_prefix(z == std::string_view::npos ? v.size() : z + 1);
    }
  });
  return out;
}

// Every checkpoint, oldest first (pages of JSON arrays).
Json ReadCheckpoints(const std::string& mnt) {
  Json out = Json::array();
  ForEachPage(mnt, fs::kCheckpointsXattrPrefix, "checkpoints", [&](std::string_view v) {
    Json j = Json::parse(v, nullptr, false);
    if (!j.is_array()) Die("the daemon sent a checkpoint list that is not JSON");
    for (Json& row : j) out.push_back(std::move(row));
  });
  return out;
}

// "12.3 s", or "-" when unknown.
std::string Seconds(const Json& row, const char* key) {
  auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return "-";
  return fmt::format("{:.1f} s", it->get<double>());
}

std::string LocalTime(int64_t ns) {
  if (ns <= 0) return "-";
  time_t t = static_cast<time_t>(ns / 1000000000);
  struct tm tm;
  char out[32] = "-";
  if (localtime_r(&t, &tm)) strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S", &tm);
  return out;
}

}  // namespace

int CmdLs(const std::string& mnt_in, bool json) {
  std::string mnt = CheckedMount(mnt_in);
  Json list = ReadCheckpoints(mnt);
  if (json) {
    PrintJson(list);
    return 0;
  }
  if (list.empty()) {
    printf("no checkpoints in %s (names matching the mount's --checkpoint-regex)\n", EscapeName(mnt).c_str());
    return 0;
  }
  printf("%-40s %6s %10s  %-14s %-19s %11s %11s\n", "CHECKPOINT", "FILES", "BYTES", "STATE", "CLOSED AT",
         "TO RAM", "TO DURABLE");
  for (const Json& r : list) {
    const int64_t closed = r.value("closed_at_ns", int64_t{0});
    printf("%-40s %6llu %10s  %-14s %-19s %11s %11s\n", EscapeName(Str(r, "path")).c_str(),
           static_cast<unsigned long long>(U64(r, "files")), HumanBytes(U64(r, "bytes")).c_str(),
           Str(r, "state").c_str(), Bool(r, "complete") ? LocalTime(closed).c_str() : "-",
           Seconds(r, "time_to_ram_s").c_str(), Seconds(r, "time_to_durable_s").c_str());
  }
  return 0;
}

int CmdLatest(const std::string& mnt_in, const std::string& which) {
  std::string mnt = CheckedMount(mnt_in);
  Json list = ReadCheckpoints(mnt);
  for (auto it = list.rbegin(); it != list.rend(); ++it)
    if (Bool(*it, which.c_str())) {
      // Printed as it is, for `$(ckptfs latest ...)`: only the checkpoint's
      // own name must match the regex, so a directory above it may hold a
      // newline, and the script would read two paths. Such a path is
      // refused: EscapeName changes control bytes and invalid UTF-8, and
      // doubles '\\' (harmless in $(...), so allowed).
      const std::string path = mnt + "/" + Str(*it, "path");
      std::string doubled;
      for (char ch : path) doubled.append(ch == '\\' ? 2 : 1, ch);
      if (EscapeName(path) != doubled) {
        fprintf(stderr,
                "ckptfs: the %s checkpoint's path has a control character or is not UTF-8: %s (`ckptfs "
                "checkpoints --json` gives it exactly)\n",
                which.c_str(), EscapeName(path).c_str());
        return 1;
      }
      printf("%s\n", path.c_str());
      return 0;
    }
  fprintf(stderr, "ckptfs: no %s checkpoint in %s\n", which.c_str(), EscapeName(mnt).c_str());
  return 1;
}

int CmdPersist(const std::string& path_in, bool wait) {
  std::string path = Absolute(path_in);
  // The mount holding it: the status xattr answers at its root only.
  std::string mnt = path;
  while (getxattr(mnt.c_str(), fs::kStatusXattr, nullptr, 0) < 0) {
    if (mnt == "/" || mnt.empty()) Die(EscapeName(path_in) + " is not in a ckptfs mount");
    mnt = stdfs::path(mnt).parent_path().string();
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) Die("cannot stat " + EscapeName(path_in) + ": " + ErrStr(errno));
  if (setxattr(path.c_str(), fs::kPersistXattr, "1", 1, 0) != 0) {
    int e = errno;
    if (e == EALREADY) {
      printf("%s is in no memory-only checkpoint: it drains already\n", EscapeName(path_in).c_str());
      return 0;
    }
    Die("cannot persist " + EscapeName(path_in) + ": " + ErrStr(e) +
        (e == EPERM ? " (only the checkpoint's owner, root or the mount's owner may)" : ""));
  }
  printf("%s: queued for the backend\n", EscapeName(path_in).c_str());
  if (!wait) return 0;
  return CmdDrain(mnt, 0);
}

namespace {

// One CSV line split into fields (double quotes, "" inside them).
std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); i++) {
    char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      i++;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

int CmdHistory(const std::string& mnt_in, bool csv) {
  std::string mnt = CheckedMount(mnt_in);
  Json j = StatusOrDie(mnt);
  const std::string dir = Str(j, "state_dir");
  std::vector<std::string> lines;
  for (const std::string& f : {dir + "/history.csv.1", dir + "/history.csv"}) {
    std::ifstream in(f);
    if (!in && errno == EACCES) Die("cannot read " + f + ": " + ErrStr(EACCES) + " (the state dir is the daemon's user's)");
    std::string l;
    bool header = true;
    while (std::getline(in, l)) {
      if (!header) lines.push_back(l);
      header = false;
    }
  }
  if (csv) {
    printf("%s\n", fs::kHistoryHeader);
    for (const std::string& l : lines) printf("%s\n", l.c_str());
    return 0;
  }
  if (lines.empty()) {
    printf("no checkpoint has become persisted on this mount's state dir yet\n");
    return 0;
  }
  printf("%-40s %6s %10s  %-20s %9s %11s %10s\n", "CHECKPOINT", "FILES", "BYTES", "CLOSED AT (UTC)", "TO RAM",
         "TO DURABLE", "DRAIN");
  for (const std::string& l : lines) {
    auto f = SplitCsv(l);
    if (f.size() < 7) continue;
    printf("%-40s %6s %10s  %-20s %7s s %9s s %5s MB/s\n", EscapeName(f[0]).c_str(), f[1].c_str(),
           HumanBytes(strtoull(f[2].c_str(), nullptr, 10)).c_str(), f[3].c_str(), f[4].c_str(), f[5].c_str(),
           f[6].c_str());
  }
  return 0;
}

int CmdDrain(const std::string& mnt_in, double timeout_s) {
  return WaitDrained(Absolute(mnt_in), timeout_s, "fix the disk and mount again: the next mount resumes the drain") == 0
             ? 0
             : 1;
}

int CmdUmount(const std::string& mnt_in, const UmountArgs& a) {
  std::string mnt = CheckedMount(mnt_in);
  // Without the status there is no knowing what is still to drain: refuse
  // rather than unmount and report success. --no-drain is the way out (a
  // dead daemon); the next mount resumes the drain either way.
  Json status;
  int err = ReadStatus(mnt, &status);
  if (err != 0 && !a.no_drain)
    Die("cannot read the status of " + mnt + " (" + ErrStr(err) + "), so the drain cannot be waited for; nothing " +
        "unmounted (`ckptfs umount --no-drain` unmounts without it; the next mount resumes the drain)");
  long long pid =
      err == 0 && status.contains("pid") && status["pid"].is_number_integer() ? status["pid"].get<long long>() : -1;
  // Drained with files the backend lacks (named): unmounted all the same,
  // since no waiting brings them (a failed file's bytes stay in the tier,
  // which the daemon keeps), but the exit status says so.
  const int drained = a.no_drain ? 0 : WaitDrained(mnt, 0, "use `ckptfs umount --no-drain`, fix the disk and mount again");
  if (drained != 0 && drained != kDrainedWithout) return 1;
  const int rc_done = drained == kDrainedWithout ? 1 : 0;
  // Drained: the daemon gives the tier's memory back as it exits, if
  // nothing was written meanwhile (it checks again). --keep-cache keeps it
  // for a quick remount; --no-drain always keeps it.
  const bool release = !a.no_drain && !a.keep_cache;
  if (release && setxattr(mnt.c_str(), fs::kReleaseXattr, "1", 1, 0) != 0)
    fprintf(stderr, "ckptfs: warning: cannot ask the daemon to release its memory tier (%s); it stays\n",
            ErrStr(errno).c_str());
  int rc = RunCommand({"fusermount3", a.lazy ? "-uz" : "-u", mnt});
  if (rc < 0) Die("cannot run fusermount3: " + ErrStr(errno));
  if (rc != 0) {
    if (release) (void)setxattr(mnt.c_str(), fs::kReleaseXattr, "0", 1, 0);  // still mounted: as it was
    Die("cannot unmount " + mnt + " (busy? close files using it, or use --lazy)");
  }
  // Wait for the daemon to close its metadata, so a new mount can open it.
  for (int i = 0; pid > 0 && i < 1200 && Running(static_cast<pid_t>(pid)); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (pid > 0 && Running(static_cast<pid_t>(pid)))
    Die("unmounted, but the daemon (pid " + std::to_string(pid) + ") has not exited");
  const std::string tier = err == 0 ? Str(status, "tier_dir") : "";
  if (tier.empty()) return rc_done;
  std::error_code ec;
  if (!stdfs::exists(tier, ec))
    printf("ckptfs: unmounted %s; memory tier released (%s)\n", EscapeName(mnt).c_str(), EscapeName(tier).c_str());
  else if (uint64_t mo = U64(Obj(status, "memory_only"), "files"); release && mo > 0)
    printf("ckptfs: unmounted %s; memory tier kept in %s: %llu files of memory-only checkpoints are only there "
           "(mount again to read them, `ckptfs persist` to drain them)\n",
           EscapeName(mnt).c_str(), EscapeName(tier).c_str(), static_cast<unsigned long long>(mo));
  else if (release)
    printf("ckptfs: unmounted %s; memory tier kept in %s (see %s/ckptfs.log; `ckptfs gc` frees it)\n",
           EscapeName(mnt).c_str(), EscapeName(tier).c_str(), EscapeName(Str(status, "state_dir")).c_str());
  else
    printf("ckptfs: unmounted %s; memory tier kept in %s for the next mount\n", EscapeName(mnt).c_str(),
           EscapeName(tier).c_str());
  return rc_done;
}

// The cluster part of `ckptfs status` (--cluster): members, what the drain
// waits for, and the files of dead members.
void PrintCluster(const Json& c) {
  auto secs = [](uint64_t ms) { return fmt::format("{:.1f} s", static_cast<double>(ms) / 1000.0); };
  const std::string wm = U64(c, "watermark_ms") ? LocalTime(static_cast<int64_t>(U64(c, "watermark_ms")) * 1000000) : "none yet";
  printf("cluster    %s, node %s, watermark %s%s\n", EscapeName(Str(c, "name")).c_str(),
         EscapeName(Str(c, "node")).c_str(), wm.c_str(),
         Str(c, "last_error").empty() ? "" : (", " + EscapeName(Str(c, "last_error"))).c_str());
  if (std::string store = Str(c, "store"); !store.empty() && store != "backend records")
    printf("  store    %s: %llu live members, elected to reduce the records: %s\n", EscapeName(store).c_str(),
           static_cast<unsigned long long>(U64(c, "live_members")),
           Str(c, "leader").empty() ? "none yet" : EscapeName(Str(c, "leader")).c_str());
  if (auto it = c.find("names"); it != c.end() && it->is_object())
    printf("  names    in the store: %llu puts, %llu deletes, %llu lookups, %llu requests failed\n",
           static_cast<unsigned long long>(U64(*it, "puts")), static_cast<unsigned long long>(U64(*it, "deletes")),
           static_cast<unsigned long long>(U64(*it, "gets")), static_cast<unsigned long long>(U64(*it, "failures")));
  if (auto it = c.find("replicas"); it != c.end() && it->is_object()) {
    const Json& r = *it;
    auto u = [&r](const char* k) { return static_cast<unsigned long long>(U64(r, k)); };
    printf("  replicas held here for %llu other member(s): %llu files, %s of %s (listening at %s, failure group %s)",
           u("peers"), u("held_files"), HumanBytes(U64(r, "held_bytes")).c_str(),
           HumanBytes(U64(r, "budget_bytes")).c_str(), EscapeName(Str(r, "listen")).c_str(),
           EscapeName(Str(r, "failure_group")).c_str());
    if (u("peers_refused") || u("chunks_refused"))
      printf("; REFUSED %llu peer(s), %llu replica(s) with bad checksums", u("peers_refused"), u("chunks_refused"));
    if (u("messages_refused"))
      printf("; DROPPED %llu message(s) not sealed with their connection's key (forged?)", u("messages_refused"));
    if (u("stalled_closed") || u("crowded_closed"))
      printf("; CLOSED %llu connection(s) stalled mid-chunk, %llu past their node's bound", u("stalled_closed"),
             u("crowded_closed"));
    printf("\n");
    if (u("published_for_dead") || u("entries_applied_for_dead") || u("takeover_failures") ||
        u("kept_published_files") || u("kept_for_marks_files") || u("kept_for_marks_entries"))
      printf(
          "  replicas published here for dead members: %llu files (%s), %llu namespace entries, %llu kept to "
          "serve loads%s%s%s\n",
          u("published_for_dead"), HumanBytes(U64(r, "published_for_dead_bytes")).c_str(),
          u("entries_applied_for_dead"), u("kept_published_files"),
          u("kept_for_marks_files") || u("kept_for_marks_entries")
              ? ("; " + std::to_string(u("kept_for_marks_files")) + " files and " +
                 std::to_string(u("kept_for_marks_entries")) + " entries (" +
                 HumanBytes(U64(r, "kept_for_marks_bytes")) + ") held until their done marks reach etcd")
                    .c_str()
              : "",
          Str(r, "takeover_error").empty() ? "" : "; last error: ", EscapeName(Str(r, "takeover_error")).c_str());
    if (u("lost_for_dead") || u("poisoned_for_dead") || u("passed_over_for_dead"))
      printf(
          "  GIVEN UP here for dead members: %llu entries the backend refused or whose replica was unreadable, %llu "
          "later entries on their names, %llu claimed here that other holders went past while this one was gone "
          "(their writers apply them if they come back; lost otherwise)\n",
          u("lost_for_dead"), u("poisoned_for_dead"), u("passed_over_for_dead"));
    if (auto l = r.find("loads"); l != r.end() && l->is_object()) {
      auto v = [&l](const char* k) { return static_cast<unsigned long long>(U64(*l, k)); };
      printf(
          "  loads    from peers: %llu files (%s), from the backend: %llu; served to peers: %llu requests (%s)%s%s\n",
          v("from_peers"), HumanBytes(U64(*l, "from_peers_bytes")).c_str(), v("to_backend"), v("served"),
          HumanBytes(U64(*l, "served_bytes")).c_str(),
          Str(*l, "last_error").empty() ? "" : "; last error: ", EscapeName(Str(*l, "last_error")).c_str());
    }
    if (r.contains("replicas"))
      printf(
          "  replicas of this node's files: %llu each; %llu files (%s) replicated, %llu queued, %llu dropped "
          "once persisted%s%s%s\n",
          u("replicas"), u("replicated_files"), HumanBytes(U64(r, "replicated_bytes")).c_str(), u("queued"),
          u("dropped"),
          u("same_group")
              ? (", " + std::to_string(u("same_group")) + " copies in this node's own failure group").c_str()
              : "",
          Str(r, "last_error").empty() ? "" : "; last error: ", EscapeName(Str(r, "last_error")).c_str());
  }
  if (Bool(c, "node_id_clash"))
    printf("  CLASH    another mount writes records as node %s: give each mount its own --node\n",
           EscapeName(Str(c, "node")).c_str());
  if (std::string why = Str(c, "publish_blocked_reason"); !why.empty())
    printf("  BLOCKED  this node publishes nothing: %s; its files stay in memory\n", EscapeName(why).c_str());
  size_t listed = 0;
  if (auto it = c.find("members"); it != c.end() && it->is_array())
    for (const Json& m : *it) {
      listed++;
      if (!m.is_object()) continue;
      int64_t age = m.contains("age_ms") && m["age_ms"].is_number_integer() ? m["age_ms"].get<int64_t>() : 0;
      std::string problem = Str(m, "record_problem");
      printf("  member %s%s: %s, heartbeat %s ago, %llu files not persisted%s\n", EscapeName(Str(m, "node")).c_str(),
             Bool(m, "self") ? " (this node)" : "", Str(m, "state").c_str(),
             secs(static_cast<uint64_t>(std::max<int64_t>(age, 0))).c_str(),
             static_cast<unsigned long long>(U64(m, "unpersisted")),
             problem.empty() ? "" : (" (its record " + EscapeName(problem) + ": the last one read stands)").c_str());
    }
  if (uint64_t n = U64(c, "member_count"); n > listed)
    printf("  ... %llu more members (ckptfs status --json lists 100)\n", static_cast<unsigned long long>(n - listed));
  size_t refused_shown = 0;
  if (auto it = c.find("refused"); it != c.end() && it->is_array())
    for (const Json& r : *it) {
      if (!r.is_object()) continue;
      refused_shown++;
      printf("  refused  record %s: %s\n", EscapeName(Str(r, "node")).c_str(), EscapeName(Str(r, "reason")).c_str());
    }
  if (uint64_t n = U64(c, "refused_count"); n > refused_shown)
    printf("  ... %llu more records refused\n", static_cast<unsigned long long>(n - refused_shown));
  if (Bool(c, "waiting")) {
    std::string who;
    if (auto it = c.find("waiting_for"); it != c.end() && it->is_array())
      for (const Json& w : *it)
        if (w.is_string()) who += (who.empty() ? "" : ", ") + EscapeName(w.get<std::string>());
    printf("  waiting  the drain holds entry %llu for %s (their earlier files first)\n",
           static_cast<unsigned long long>(U64(c, "wait_seq")), who.c_str());
  }
  if (uint64_t n = U64(c, "lost_count"); n > 0) {
    printf("  lost     %llu files of dead members\n", static_cast<unsigned long long>(n));
    size_t shown = 0;
    if (auto it = c.find("lost"); it != c.end() && it->is_array())
      for (const Json& l : *it) {
        if (shown++ == 10 || !l.is_object()) break;
        printf("  lost: %s: %s\n", EscapeName(Str(l, "node")).c_str(), EscapeName(Str(l, "path")).c_str());
      }
  }
  if (uint64_t n = U64(c, "kept_removals"); n > 0) {
    printf("  kept     %llu removals not applied to the backend (ordered after a dead member's lost files)\n",
           static_cast<unsigned long long>(n));
    if (auto it = c.find("kept_paths"); it != c.end() && it->is_array())
      for (const Json& p : *it)
        if (p.is_string()) printf("  kept: %s\n", EscapeName(p.get<std::string>()).c_str());
  }
}

int CmdStatus(const std::string& mnt_in, bool json) {
  std::string mnt = Absolute(mnt_in);
  Json j = StatusOrDie(mnt);
  if (json) {
    PrintJson(j);
    return 0;
  }
  const Json& t = Obj(j, "tier");
  uint64_t budget = U64(t, "budget"), used = U64(t, "used");
  double pct = budget > 0 ? 100.0 * static_cast<double>(used) / static_cast<double>(budget) : 0;
  printf("mount      %s -> %s (fsync=%s)\n", EscapeName(mnt).c_str(), EscapeName(Str(j, "backend")).c_str(),
         Str(j, "fsync").c_str());
  if (std::string ro = Str(j, "read_only"); !ro.empty()) printf("READ-ONLY  %s\n", EscapeName(ro).c_str());
  printf("memory     %s of %s (%.1f%%)%s, %llu writer waits\n", HumanBytes(used).c_str(), HumanBytes(budget).c_str(),
         pct,
         U64(t, "replica_bytes") ? (" + " + HumanBytes(U64(t, "replica_bytes")) + " of other members' replicas").c_str()
                                 : "",
         static_cast<unsigned long long>(U64(t, "waits")));
  if (const Json& m = Obj(j, "memory"); Bool(m, "under_pressure"))
    printf("PRESSURE   %s available (%s), under --min-free %s: persisted files evicted%s\n",
           HumanBytes(U64(m, "available")).c_str(), EscapeName(Str(m, "where")).c_str(),
           HumanBytes(U64(m, "min_free")).c_str(),
           Bool(m, "writers_wait") ? "; new writes wait for the drain" : "");
  if (const Json& p = Obj(j, "passthrough"); Bool(p, "active")) {
    const double warm_s = Dbl(p, "prealloc_warm_seconds");
    const uint64_t warmed = U64(p, "prealloc_warmed_bytes");
    printf("io         passthrough: %llu handles open (%llu files written), %llu opens since mount, %s pre-allocated "
           "(%s warmed in %.1f s since mount)\n",
           static_cast<unsigned long long>(U64(p, "handles")), static_cast<unsigned long long>(U64(p, "writers")),
           static_cast<unsigned long long>(U64(p, "opens")), HumanBytes(U64(p, "prealloc_bytes")).c_str(),
           HumanBytes(warmed).c_str(), warm_s);
  } else {
    printf("io         through the daemon (passthrough %s)\n", EscapeName(Str(p, "why_not")).c_str());
  }
  if (const Json& u = Obj(j, "fuse_io_uring"); Bool(u, "active"))
    printf("requests   over io_uring, one queue per CPU: %llu since mount\n",
           static_cast<unsigned long long>(U64(u, "requests")));
  else
    printf("requests   through /dev/fuse (io_uring %s)\n", EscapeName(Str(u, "why_not")).c_str());
  if (const Json& y = Obj(j, "reply_yield"); Bool(y, "active"))
    printf("replies    yield the CPU to their caller (it wakes where it slept); %llu threads put back by the watch\n",
           static_cast<unsigned long long>(U64(y, "rescued")));
  else
    printf("replies    at normal priority (reply_yield %s)\n", EscapeName(Str(y, "why_not")).c_str());
  if (Bool(t, "huge_pages"))
    printf("pages      2 MiB where a file covers them (the tier's own tmpfs, --tier-huge)\n");
  else
    printf("pages      4 KiB (huge pages %s)\n", EscapeName(Str(t, "huge_pages_why_not")).c_str());
  if (uint64_t o = U64(t, "orphans"); o > 0)
    printf("orphans    %llu tier files that no file owns, in %s/orphans/ (docs/operations.md)\n",
           static_cast<unsigned long long>(o), EscapeName(Str(j, "tier_dir")).c_str());
  for (const char* s : {"dirty", "draining", "persisted", "remote"})
    printf("%-10s %llu files, %s\n", s, static_cast<unsigned long long>(U64(Obj(j, s), "files")),
           HumanBytes(U64(Obj(j, s), "bytes")).c_str());
  // Only where the policies are on: files that never reach the backend.
  if (const Json& pol = Obj(j, "policies"); U64(pol, "persist_every") > 0 || U64(pol, "persist_interval_s") > 0 ||
                                            U64(Obj(j, "memory_only"), "files") > 0)
    printf("mem-only   %llu files, %s, in memory-only checkpoints (not in the backend: ckptfs persist)\n",
           static_cast<unsigned long long>(U64(Obj(j, "memory_only"), "files")),
           HumanBytes(U64(Obj(j, "memory_only"), "bytes")).c_str());
  const Json& d = Obj(j, "drain");
  printf("drain      %llu queued, %s/s, %s persisted since mount, %llu skipped as undone\n",
         static_cast<unsigned long long>(U64(d, "queue")), HumanBytes(U64(d, "rate")).c_str(),
         HumanBytes(U64(d, "bytes_persisted")).c_str(), static_cast<unsigned long long>(U64(d, "skipped")));
  // The drain waits for saves (--drain-yield): how often, and whether now.
  if (uint64_t n = U64(d, "yields"); n > 0 || Bool(d, "yielding"))
    printf("yield      %s; %llu transfers waited for a save to finish, %.1f s in all (--drain-yield %llu ms)\n",
           Bool(d, "yielding") ? "waiting for a save now" : "not waiting",
           static_cast<unsigned long long>(n), Dbl(d, "yielded_s"),
           static_cast<unsigned long long>(U64(d, "yield_ms")));
  if (auto h = d.find("held"); h != d.end() && h->is_object()) {
    // Order first: a refused file holds every later one (docs/operations.md).
    const std::string since = LocalTime(static_cast<int64_t>(U64(*h, "since")) * 1000000000);
    printf("held       the backend refuses %s for good (%s) since %s; %llu entries wait behind it: fix the "
           "backend (it is retried) or `ckptfs skip %s %s`\n",
           EscapeName(Str(*h, "path")).c_str(), EscapeName(Str(*h, "reason")).c_str(), since.c_str(),
           static_cast<unsigned long long>(U64(*h, "behind")), EscapeName(mnt).c_str(),
           EscapeName(Str(*h, "path")).c_str());
  } else if (Bool(d, "in_error") && Str(d, "last_error").rfind("drain stopped", 0) == 0) {
    printf("error      %s\n", EscapeName(Str(d, "last_error")).c_str());
  } else if (Bool(d, "in_error")) {
    // Since when the backend has not answered (status is read on a bad day).
    const std::string since = LocalTime(static_cast<int64_t>(U64(d, "error_since")) * 1000000000);
    printf("backend    unreachable since %s, %llu retries: %s\n", since.c_str(),
           static_cast<unsigned long long>(U64(d, "retries")), EscapeName(Str(d, "last_error")).c_str());
  }
  const Json& f = Obj(j, "failed");
  if (uint64_t n = U64(f, "count"); n > 0) {
    printf("failed     %llu files the backend refused for good\n", static_cast<unsigned long long>(n));
    size_t shown = 0;
    if (auto it = f.find("first"); it != f.end() && it->is_array())
      for (const Json& e : *it) {
        if (shown++ == 10 || !e.is_object()) break;
        printf("  failed: %s: %s\n", EscapeName(Str(e, "path")).c_str(), EscapeName(Str(e, "reason")).c_str());
      }
    if (n > 10) printf("  ... %llu more\n", static_cast<unsigned long long>(n - 10));
  }
  if (auto cit = j.find("cluster"); cit != j.end() && cit->is_object()) PrintCluster(*cit);
  // lost_count is new; an older daemon sent only the (whole) list.
  auto lit = j.find("lost");
  size_t listed = lit != j.end() && lit->is_array() ? lit->size() : 0;
  uint64_t lost = j.contains("lost_count") ? U64(j, "lost_count") : listed;
  printf("lost       %llu files\n", static_cast<unsigned long long>(lost));
  size_t shown = 0;
  if (listed > 0)
    for (const Json& l : *lit) {
      if (shown++ == 10) break;
      printf("  lost: %s\n", l.is_string() ? EscapeName(l.get<std::string>()).c_str() : "?");
    }
  if (lost > 10)
    printf("  ... %llu more: ckptfs lost %s\n", static_cast<unsigned long long>(lost - 10), EscapeName(mnt).c_str());
  return 0;
}

int CmdSkip(const std::string& mnt_in, const std::string& path_in) {
  std::string mnt = CheckedMount(mnt_in);
  std::string rel = path_in;
  if (!rel.empty() && rel[0] == '/') {  // absolute: inside the mount
    std::string abs = stdfs::path(rel).lexically_normal().string();
    if (abs.size() <= mnt.size() + 1 || abs.compare(0, mnt.size(), mnt) != 0 || abs[mnt.size()] != '/')
      Die(EscapeName(path_in) + " is not inside " + EscapeName(mnt));
    rel = abs.substr(mnt.size() + 1);
  }
  Json j = StatusOrDie(mnt);
  const Json& dr = Obj(j, "drain");
  auto h = dr.find("held");
  if (h == dr.end() || !h->is_object())
    Die("the drain of " + EscapeName(mnt) + " holds at nothing: there is nothing to skip");
  if (Str(*h, "path") != rel)
    Die("the drain holds at " + EscapeName(Str(*h, "path")) + ", not at " + EscapeName(rel) + ": nothing skipped");
  if (setxattr(mnt.c_str(), fs::kSkipXattr, rel.data(), rel.size(), 0) != 0) {
    int e = errno;
    if (e == ENOENT) Die("the drain no longer holds at " + EscapeName(rel) + " (retried with success, or skipped)");
    Die("cannot skip " + EscapeName(rel) + ": " + ErrStr(e) +
        (e == EPERM ? " (only root or the mount's owner may)" : ""));
  }
  printf("%s: skipped; recorded as failed (not in the backend), the drain goes on\n", EscapeName(rel).c_str());
  return 0;
}

int CmdLost(const std::string& mnt_in, bool json, bool clear) {
  std::string mnt = CheckedMount(mnt_in);
  if (clear) {
    Json j = StatusOrDie(mnt);
    if (setxattr(mnt.c_str(), fs::kLostClearXattr, "1", 1, 0) != 0) {
      int e = errno;
      Die("cannot clear the lost list of " + mnt + ": " + ErrStr(e) +
          (e == EPERM || e == EACCES ? " (only root or the mount's owner may)" : ""));
    }
    fprintf(stderr, "ckptfs: cleared the lost list of %s (%llu entries)\n", EscapeName(mnt).c_str(),
            static_cast<unsigned long long>(U64(j, "lost_count")));
    return 0;
  }
  std::vector<std::string> lost = ReadLost(mnt);
  if (json) {
    Json j = {{"count", lost.size()}, {"lost", lost}};
    PrintJson(j);
    return 0;
  }
  for (const std::string& p : lost) printf("%s\n", EscapeName(p).c_str());
  return 0;
}

}  // namespace ckpt::cli
