// replica_store.h — the replicas a holder keeps for other members (issue
// #30): one file per replica in a directory beside the memory tier, within
// a byte limit of their own (--replica-budget, a share of the budget) and
// within the node's one budget, which they share with its files
// (ShareRoom): a replica takes only room the node's files leave, and gives
// back its spare pages and published copies first when they need it, so
// replicas never take the room of this node's own saves (docs/replicas.md,
// "Backpressure never reaches a save").
//
// A replica arrives into `.part-NAME` (sized at Begin, written by chunks
// in any order), is checked against the writer's content checksum at
// Commit and only then renamed to its final name: a replica that is listed
// is whole and checked; a writer or holder that dies mid-stream leaves a
// `.part-` file that Open() removes. The final name carries what a holder
// must know of it to order it: `WRITER.INO.VERSION~GATE_US~CHECKSUM_HEX`
// (one rename makes it appear; GATE_US is `published` once Retire()d); what the writer said of the file (its path,
// mode, owner, mtime) is in `NAME.meta`, written before that rename and
// removed after the replica (a replica without it is discarded at Open).
//
// Thread-safety: every method may be called from any thread; an Incoming
// belongs to one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "fs/cluster/replica_wire.h"

namespace ckpt::fs::replica {

struct Held {
  Key key;
  uint64_t size = 0, gate_us = 0, hash_hi = 0, hash_lo = 0;
  std::string meta{};  // the writer's description of the file (its path...), kept beside the bytes
  // Published in a dead writer's place (Takeover) and kept only to serve
  // loads (peer_loads.h): no gate, and the first to go when room is needed.
  bool published = false;
  // Published, but its files still carry the gate's name: the rename
  // failed (NameUnnamed, each takeover pass, and Retire try it again).
  // A restart reads it back unpublished,
  // as after a crash between the publish and the rename.
  bool unnamed = false;
};

class Store {
 public:
  // Creates `dir` (0700) if missing, removes unfinished `.part-` files and
  // counts the replicas held there against `limit` bytes. EPERM: `dir`
  // belongs to another user (never followed if a link: ELOOP/ENOTDIR).
  static Result<std::unique_ptr<Store>> Open(const std::string& dir, uint64_t limit);
  ~Store();

  // A replica being received: `size` bytes written at any offsets, in any
  // order. Destroyed without Commit, it is discarded and its room freed.
  class Incoming {
   public:
    ~Incoming();
    // Whole ranges inside [0, size): 0 or an errno (ENOSPC: the tmpfs is full).
    int Write(uint64_t off, const char* p, size_t n) const;
    int Read(uint64_t off, char* p, size_t n) const;
    const Held& held() const { return held_; }

   private:
    friend class Store;
    Incoming(Store* s, Held h, int fd, std::string part);
    Store* store_;
    Held held_;
    int fd_;
    std::string part_;
    bool done_ = false;
  };

  // Reserves `Charge(h)` bytes and makes the `.part-` file. EAGAIN: the limit
  // has no room now (the writer tries later); EEXIST: this version is held
  // already, as the writer describes it (size, meta, checksum when given),
  // unpublished (nothing to send: a retry whose HELD was lost, or its writer
  // restarted: it then takes `h.gate_us`, the writer's gate now); ESTALE: a
  // replica of that name is held but is not this one (a writer that
  // reuses a name — a replacement node with the same id and a new state
  // dir numbers its files anew — or a copy published in a dead writer's
  // place): it is not counted as this one, and not replaced (it may be
  // the only copy of what it is); EINVAL: a size over the limit itself.
  Result<std::unique_ptr<Incoming>> Begin(const Held& h);
  // Checks the content checksum and makes the replica appear. EBADMSG: the
  // bytes are not what the writer's checksum says (discarded, logged by the
  // caller, who knows the sender). `landed`: the checksum of the bytes as
  // the caller hashed them while they landed (replica_link: in order, as
  // chunks arrive), which saves a pass over them here; the writer's
  // checksum is `want` when the PUT did not carry it (it comes with END).
  Status Commit(std::unique_ptr<Incoming> in, std::optional<std::pair<uint64_t, uint64_t>> landed = std::nullopt,
                std::optional<std::pair<uint64_t, uint64_t>> want = std::nullopt);

  // ENOENT if not held. The replica's file is kept, as a spare
  // (`.free-N`), for the next replica: its pages are in RAM already, so the
  // next Begin writes into them instead of faulting in and zeroing fresh
  // ones (half the CPU of a replication on this VM went to zeroing pages).
  // Spares count against the limit and are the first to go for room.
  Status Drop(const Key& k);
  // A writer's DROP (its drain applied the version): as Drop, except for a
  // replica this holder claimed for a takeover (SetClaimed), which it
  // publishes itself whatever the writer says (kept; {} returned).
  Status DropForWriter(const Key& k);
  void SetClaimed(const Key& k);
  // Marks a held replica published (its name says so, a restart keeps it):
  // it no longer counts for MinGate, and Begin drops it, oldest first, when
  // it needs its room. False: not held. A rename that fails (a full tier's
  // inodes) leaves it published in memory under its old name (`unnamed`,
  // logged), never dropped: its done mark may be owed, and a holder that
  // lost it would read "claimed, no replica" as a give-up.
  // keep: and Keep it, under the same lock (no eviction between the two).
  bool Retire(const Key& k, bool keep = false);
  // Tries again the renames of the `unnamed` ones (the takeover's every
  // pass). The number still unnamed.
  size_t NameUnnamed();
  // Keeps a published copy from being given back for room (Relieve,
  // Begin's need) and from giving way to a new replica of its name
  // (EAGAIN) until Unkeep or Drop: its claim's mark is neither in etcd
  // nor noted on the tier, and a holder restarted without the copy would
  // read "claimed, no replica" as a give-up (Takeover). False: not held
  // published. KeepPublished keeps every published copy (at start, until
  // the holder's first read-back of its claims says which are owed).
  bool Keep(const Key& k);
  void Unkeep(const Key& k);
  void KeepPublished();
  // The copies kept now (files, namespace entries) and their bytes: room
  // not given back for anything until their marks land (status, metrics).
  struct KeptTotal {
    size_t files = 0, entries = 0;
    uint64_t bytes = 0;
  };
  KeptTotal KeptNow() const;
  // A descriptor of a held replica (read-only) and what is known of it.
  Result<std::pair<int, Held>> OpenHeld(const Key& k) const;
  std::vector<Held> List() const;

  // One budget with the tier (cache/tier.h TakeOutside): from here on
  // every byte this store holds (held, reserved, spare) is taken from
  // `room` first, what is held now at once (even past the budget), and a
  // replica that finds no room there beside the node's own files, once
  // this store's spares and published copies are gone, waits (EAGAIN;
  // TakeWanted says how much, for the evictor of the node's persisted files).
  struct Room {
    std::function<bool(uint64_t n, bool force)> take;
    std::function<void(uint64_t n)> give;
  };
  void ShareRoom(Room room);
  // For a need of `need` bytes of the room: spares, then published copies,
  // oldest first, are given back. The bytes freed.
  uint64_t Relieve(uint64_t need);
  // The room the last replica that did not fit the tier asked for (0:
  // none); cleared.
  uint64_t TakeWanted();

  uint64_t bytes() const;  // held, reserved and spare
  // What a replica takes of the limit and the node's budget: its bytes,
  // its meta file's pages (one at least) and the two files' inodes (1 KiB
  // each, about what tmpfs spends on an inode and its dentry). Until stop
  // 67 only its bytes: a member committing many empty replicas filled RAM
  // with metas the budget never saw. A spare keeps only its bytes.
  static uint64_t Charge(const Held& h);
  uint64_t spare_bytes() const;
  // The earliest gate time among the replicas held (0: none).
  uint64_t MinGate() const;
  uint64_t limit() const { return limit_; }

  // Notes: a few small texts a holder must find again after its daemon
  // restarts on the same tier (Takeover: what it decided of a claimed
  // entry while that mark is not yet in etcd). One file each beside the
  // replicas (`.note-HASH`: the key's and text's lengths, the key, the text; written
  // whole under a `.part-` name, then renamed), kept by Open, never listed
  // as replicas, not counted against the limit (each at most kMaxNote).
  static constexpr size_t kMaxNote = 64 << 10;
  Status KeepNote(const std::string& key, const std::string& text);
  std::optional<std::string> Note(const std::string& key) const;
  std::vector<std::string> NoteKeys() const;
  void DropNote(const std::string& key);

 private:
  Store(std::string dir, int dirfd, uint64_t limit) : dir_(std::move(dir)), dirfd_(dirfd), limit_(limit) {}
  void Release(uint64_t n);
  bool Kept(const Key& k) const REQUIRES(mu_);
  // bytes_ from `from` to `to` more or less, the room taken or given with
  // it; false (nothing changed): the room has not the difference.
  bool Resize(uint64_t from, uint64_t to) REQUIRES(mu_);
  // Spares, then published copies, until `need` bytes are freed; their
  // names, to unlink without the lock, appended to `names`.
  void FreeUnneeded(uint64_t need, std::vector<std::string>* names) REQUIRES(mu_);
  void Unlink(const std::vector<std::string>& names) const;
  std::string FinalName(const Held& h) const;
  // Renames held replica `x` (its file and meta) to what `to` says of it,
  // and makes it `to`; false (errno set, nothing changed) if a rename failed.
  bool Rename(Held* x, Held to) REQUIRES(mu_);
  // Renames `x` to its published name; if that fails, keeps it published
  // in memory under its old name (`unnamed`, logged once) and says false.
  bool NamePublished(Held* x) REQUIRES(mu_);

  const std::string dir_;
  const int dirfd_;
  const uint64_t limit_;
  mutable Mutex mu_;
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  std::vector<Held> held_ GUARDED_BY(mu_);
  std::vector<Key> incoming_ GUARDED_BY(mu_);
  std::vector<Key> claimed_ GUARDED_BY(mu_);                              // SetClaimed, until Drop
  std::set<Key> kept_ GUARDED_BY(mu_);                                    // Keep, until Unkeep or Drop
  std::vector<std::pair<std::string, uint64_t>> spares_ GUARDED_BY(mu_);  // dropped replicas' files: name, size
  uint64_t next_spare_ GUARDED_BY(mu_) = 0;
  Room room_ GUARDED_BY(mu_);
  uint64_t wanted_ GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> notes_ GUARDED_BY(mu_);  // key -> text (KeepNote)
};

}  // namespace ckpt::fs::replica
