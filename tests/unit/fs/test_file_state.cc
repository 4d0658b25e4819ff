// test_file_state.cc — the per-file state table (fs/core/file_state.h): the
// transitions the daemon relies on, and the ones that must never happen.
#include <criterion/criterion.h>

#include "fs/core/file_state.h"

using ckpt::fs::FileEvent;
using ckpt::fs::NextState;
using S = ckpt::meta::DataState;

static void Want(S from, FileEvent e, S to) {
  auto n = NextState(from, e);
  cr_assert(n.has_value(), "%s --%s--> nothing", ckpt::meta::DataStateName(from), ckpt::fs::FileEventName(e));
  cr_assert_eq(static_cast<int>(*n), static_cast<int>(to), "%s --%s--> %s, want %s", ckpt::meta::DataStateName(from),
               ckpt::fs::FileEventName(e), ckpt::meta::DataStateName(*n), ckpt::meta::DataStateName(to));
}

static void Never(S from, FileEvent e) {
  cr_assert(!NextState(from, e).has_value(), "%s --%s--> allowed", ckpt::meta::DataStateName(from),
            ckpt::fs::FileEventName(e));
}

Test(file_state, life_of_a_checkpoint) {
  Want(S::kDirty, FileEvent::kStage, S::kDraining);
  Want(S::kDraining, FileEvent::kPublish, S::kPersisted);
  Want(S::kPersisted, FileEvent::kEvict, S::kRemote);
  Want(S::kRemote, FileEvent::kFetch, S::kPersisted);
}

Test(file_state, any_change_makes_dirty) {
  for (S s : {S::kDirty, S::kDraining, S::kPersisted, S::kRemote, S::kFailed, S::kMemoryOnly})
    Want(s, FileEvent::kChange, S::kDirty);
}

Test(file_state, a_stopped_transfer_goes_back) {
  Want(S::kDraining, FileEvent::kStageEnd, S::kDirty);
  // A transfer of an older version ending changes nothing else.
  for (S s : {S::kDirty, S::kPersisted, S::kRemote, S::kFailed, S::kMemoryOnly}) Want(s, FileEvent::kStageEnd, s);
  Want(S::kDraining, FileEvent::kStage, S::kDraining);  // staged again after an error
}

Test(file_state, refused_for_good) {
  Want(S::kDraining, FileEvent::kRefuse, S::kFailed);
  Want(S::kDirty, FileEvent::kRefuse, S::kFailed);
}

// Bytes that exist only in the tier are never evicted, and nothing that is
// not in the backend is fetched or published twice.
Test(file_state, what_must_never_happen) {
  Never(S::kDirty, FileEvent::kEvict);
  Never(S::kDraining, FileEvent::kEvict);
  Never(S::kFailed, FileEvent::kEvict);
  Never(S::kRemote, FileEvent::kEvict);
  Never(S::kDirty, FileEvent::kFetch);
  Never(S::kPersisted, FileEvent::kFetch);
  Never(S::kPersisted, FileEvent::kStage);
  Never(S::kRemote, FileEvent::kStage);
  Never(S::kFailed, FileEvent::kStage);
  Never(S::kPersisted, FileEvent::kPublish);
  Never(S::kRemote, FileEvent::kPublish);
  Never(S::kFailed, FileEvent::kPublish);
  Never(S::kPersisted, FileEvent::kRefuse);
  Never(S::kRemote, FileEvent::kRefuse);
  Never(static_cast<S>(9), FileEvent::kChange);
}

// A memory-only checkpoint's version (--persist-every) is sealed but never
// drained, evicted or fetched: only a change, or `ckptfs persist`, ends it.
Test(file_state, memory_only_versions) {
  Want(S::kDirty, FileEvent::kKeep, S::kMemoryOnly);
  Want(S::kMemoryOnly, FileEvent::kKeep, S::kMemoryOnly);  // sealed again, still memory-only
  Want(S::kMemoryOnly, FileEvent::kQueue, S::kDirty);
  for (FileEvent e : {FileEvent::kStage, FileEvent::kPublish, FileEvent::kRefuse, FileEvent::kEvict, FileEvent::kFetch})
    Never(S::kMemoryOnly, e);
  for (S s : {S::kDraining, S::kPersisted, S::kRemote, S::kFailed}) Never(s, FileEvent::kKeep);
  for (S s : {S::kDirty, S::kDraining, S::kPersisted, S::kRemote, S::kFailed}) Never(s, FileEvent::kQueue);
}
