// restore_peers.cc — a restart's read-back of this node's unpersisted
// files from their replica holders (issue #30; moved out of daemon.cc in
// stop 69, when it gained the check against the checksum sent).
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backend/checksum.h"
#include "common/io.h"
#include "common/log.h"
#include "common/text.h"
#include "fs/cluster/replica_wire.h"
#include "fs/cluster/sent_sums.h"
#include "fs/core/recovery.h"
#include "fs/daemon.h"

namespace ckpt::fs {

// The tier key a file is read back into (RestoreFromPeers): no inode's,
// no snapshot's (cache/tier.h: kSnapBit).
constexpr uint64_t kRestoreKey = 1ULL << 62;

// A node that restarts on its state dir with its memory tier gone (a
// reboot, a container's new /dev/shm) before its files drained reads them
// back from its replica holders before it serves (recovery kept them
// aside: Core::awaiting_peers). The holders keep them meanwhile: this
// node's record still names those entries pending. What no holder gives
// back is dropped and listed as lost, as recovery drops it without
// replicas. Before the mount and the drain.
static std::string Restore(Daemon* d) {
  Core& core = d->table->core();
  std::vector<uint64_t> inos;
  {
    MutexLock lk(&core.mu());
    inos.swap(core.awaiting_peers);
  }
  if (inos.empty() || !d->replica_link || !d->replica_peers) return "";
  d->replica_peers->Start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!d->replica_peers->known() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // A file is dropped only when every member with a link answered that it
  // holds no copy of it: a member not read (etcd does not answer) or not
  // reached (a holder restarting) may hold it, and nothing is dropped on
  // that, nor served without it.
  auto not_mounted = [&](const std::string& why) {
    return fmt::format(
        "{} files not persisted and not in the memory tier wait for their replica holders, and {}: not mounted, "
        "nothing dropped; mount again once they answer",
        inos.size(), why);
  };
  if (!d->replica_peers->known())
    return not_mounted("the members' replica links cannot be read (etcd: " +
                       (d->etcd_records ? d->etcd_records->client()->LastError() : std::string()) + ")");
  // No wait for room: nothing frees it before the drain starts (Fill would
  // wait the whole space limit, then blame the holder).
  const auto wait_limit = d->tier->wait_limit();
  d->tier->set_wait_limit(std::chrono::milliseconds(0));
  struct RestoreLimit {
    cache::Tier* tier;
    std::chrono::milliseconds limit;
    ~RestoreLimit() { tier->set_wait_limit(limit); }
  } restore_limit{d->tier.get(), wait_limit};
  std::vector<uint64_t> lost, corrupt;   // corrupt: only other bytes came back
  std::map<std::string, int> unreached;  // holder -> its error: not asked again
  const std::string run =
      replica::IncarnationText(d->fs_id);  // a copy another run under this id put is not this run's file
  for (uint64_t ino : inos) {
    std::string path;
    uint64_t size = 0, version = 0;
    {
      MutexLock lk(&core.mu());
      Inode* n = core.Find(ino);
      if (!n) continue;
      path = core.ns.EntryPath(n->rec.parent, n->rec.name);
      size = n->rec.sealed_size;
      version = n->rec.version;
    }
    const replica::Key key{.writer = d->cfg.node, .ino = ino, .version = version};
    // Read into a file of its own, renamed to the inode's once whole: a
    // restore cut short (a kill) leaves no file of the sealed size that the
    // next start would take for the version (it goes to orphans/).
    const uint64_t part = kRestoreKey | ino;
    // The checksum this node sent with the version's replicas: what comes
    // back must be those bytes (sent_sums.h). None kept (sent by a version
    // before this one, or lost with a machine crash): taken unchecked.
    auto kept = replica::SentSum(d->store->kv(), ino, version);
    if (!kept)
      return not_mounted(fmt::format("the checksum kept of {}'s replicas cannot be read from the metadata store: {}",
                                     EscapeName(path), ErrStr(kept.error())));
    const auto& sent = *kept;
    if (!sent) LOG_INFO("ino {} '{}': no checksum kept of its replicas: read back unchecked", ino, EscapeName(path));
    // Set when a holder's bytes came back whole and other than those sent
    // (EBADMSG from the link is a chunk hurt on the way: asked again), or
    // of another size than this version's with its checksum kept: its
    // copy changed at rest, not another version (a copy of another run is
    // told by its incarnation; a size alone said "no copy", and the bad one
    // stayed).
    bool sum_bad = false;
    auto other_size = [&] {
      sum_bad = sent.has_value();
      return sum_bad ? EBADMSG : ESTALE;
    };
    auto read_back = [&](const std::string& addr, int fd) -> int {
      sum_bad = false;
      std::vector<char> buf(std::min<uint64_t>(std::max<uint64_t>(size, 1), 8 << 20));
      backend::ContentHash hash;
      if (sent && !hash.ok()) return ENOMEM;
      for (uint64_t off = 0; off < size;) {
        auto got = d->replica_link->Read(addr, key, off, buf.data(), std::min<uint64_t>(buf.size(), size - off), run);
        if (!got) return got.error();
        if (*got == 0) return other_size();  // shorter than the version sealed
        if (int e = PwriteFull(fd, buf.data(), *got, off); e != 0) return e;
        if (sent) hash.Update(off, buf.data(), *got);
        off += *got;
      }
      char more;  // longer than the version sealed: another version under the name
      auto tail = d->replica_link->Read(addr, key, size, &more, 1, run);
      if (!tail) return tail.error();
      if (*tail != 0) return other_size();
      sum_bad = sent && hash.Finish(size) != *sent;
      return sum_bad ? EBADMSG : 0;
    };
    std::string from;
    bool mismatched = false;
    for (const auto& [node, addr] : d->replica_peers->Ranked(path)) {
      if (unreached.count(node)) continue;
      // A holder busy serving others (EAGAIN), or a chunk that came hurt
      // (EBADMSG from the link), is asked again, a few times.
      int e = EAGAIN;
      for (int tries = 0; tries < 4 && (e == EAGAIN || (e == EBADMSG && !sum_bad)); tries++) {
        if (tries) std::this_thread::sleep_for(std::chrono::seconds(tries));
        Status st = d->tier->Fill(part, size, [&](int fd) { return read_back(addr, fd); });
        if (st) st = d->tier->Rekey(part, ino);
        e = st ? 0 : st.error();
      }
      if (e == 0) {
        from = node;
        break;
      }
      d->tier->Remove(part);
      if (e == ENOSPC)
        return not_mounted(
            fmt::format("this node's memory tier has no room for {} ({} bytes; --cache-size)", EscapeName(path), size));
      // Other bytes than this node sent: that holder has no good copy (the
      // next one may). One line, an error: a copy changed at rest, or a
      // member that lies. It is told to drop it: kept, it would answer the
      // re-send of this version HELD and count as a copy.
      if (e == EBADMSG && sum_bad) {
        mismatched = true;
        LOG_ERROR(
            "ino {} '{}': the bytes read back from {} are not the ones this node replicated (checksum "
            "mismatch): not taken, its copy dropped",
            ino, EscapeName(path), node);
        if (auto st = d->replica_link->Drop(addr, key); !st)
          LOG_WARN("ino {} '{}': {} did not drop its bad copy: {}", ino, EscapeName(path), node, ErrStr(st.error()));
        continue;
      }
      // Its answer that it has no copy of this version; anything else (not
      // reached, refused the link, out of room here) says nothing of it.
      if (e != ENOENT && e != ESTALE) unreached[node] = e;
      LOG_INFO("ino {} '{}': not read back from {}: {}", ino, EscapeName(path), node, ErrStr(e));
    }
    if (!from.empty()) {
      LOG_WARN("ino {} '{}': read back from its replica on {} ({} bytes); it drains as before", ino, EscapeName(path),
               from, size);
      continue;
    }
    if (!unreached.empty()) {
      std::string who;
      for (const auto& [node, e] : unreached) who += (who.empty() ? "" : ", ") + node + " (" + ErrStr(e) + ")";
      // Those read back stay (their tier files are whole); the next mount asks for the rest again.
      return not_mounted("these members did not answer: " + who);
    }
    (mismatched ? corrupt : lost).push_back(ino);
  }
  const std::pair<const std::vector<uint64_t>*, const char*> drops[] = {
      {&lost, "not persisted, not in the memory tier, and no replica holder has it"},
      {&corrupt,
       "not persisted, not in the memory tier, and its replica holders gave back other bytes than were replicated "
       "(checksum mismatch)"}};
  for (const auto& [inos, why] : drops)
    if (auto st = DropAwaited(core, *inos, why); !st)
      LOG_ERROR("cannot record {} lost files: {}", inos->size(), ErrStr(st.error()));
  return "";
}

std::string RestoreFromPeers(Daemon* d) {
  std::string why = Restore(d);
  if (!why.empty()) return why;  // nothing decided: every checksum kept
  // What no pending version needs any more (persisted meanwhile, a version
  // superseded, a crash before its DROP): the replicator forgets a
  // version's checksum with its replicas, this the rest.
  Core& core = d->table->core();
  auto swept = replica::SweepSentSums(d->store->kv(), [&](uint64_t ino, uint64_t version) {
    MutexLock lk(&core.mu());
    const Inode* n = core.ns.Find(ino);
    return n && S_ISREG(n->rec.mode) && n->rec.version == version && n->rec.state != meta::DataState::kPersisted &&
           n->rec.state != meta::DataState::kRemote;
  });
  if (!swept) LOG_WARN("replicas: the checksums kept of sent replicas were not swept: {}", ErrStr(swept.error()));
  return "";
}

}  // namespace ckpt::fs
