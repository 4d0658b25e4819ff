// result.h — the error convention of ckptfs: a value or a positive errno.
//
// Every function that can fail returns Result<T> (std::expected<T, int>), so
// errors reach fuse_reply_err() without translation. RocksDB statuses and
// io_uring results are converted to errno where they arise (fs/meta, backend/).
#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <system_error>

namespace ckpt {

template <class T>
using Result = std::expected<T, int>;

using Status = std::expected<void, int>;

// Shorthand for returning an errno: `return Err(ENOENT);`
inline std::unexpected<int> Err(int e) { return std::unexpected<int>(e); }

// The current errno as an error; never 0 (EIO if errno was not set).
inline std::unexpected<int> ErrFromErrno() { return std::unexpected<int>(errno ? errno : EIO); }

// The message of an errno, for logs and user messages. strerror() is not
// thread-safe; the generic category's message is (and reads the same).
inline std::string ErrStr(int e) { return std::generic_category().message(e); }

}  // namespace ckpt
