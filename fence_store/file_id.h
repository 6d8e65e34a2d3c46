// Internal to fence_store/: which file a path (or an open descriptor) is, for the store's
// per-commit check that its database and write-ahead log are still the files at their paths
// (store.cpp's check_files).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <string>

namespace fencegate::store::detail {

// Which file a path (or, with an empty path, the open `fd`) is: device, inode and link count,
// read with statx asking for nothing else. A stat(2) that reads the times marks them queried
// (multigrain timestamps, Linux 6.13 on): the next write then stamps a fine-grained ctime, and
// every fdatasync of the write-ahead log wrote the inode too, a second synchronous disk write
// per commit. Returns false if the file cannot be read.
struct FileId {
  std::uint64_t dev = 0, ino = 0, nlink = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};
inline bool file_id(int fd, const std::string& path, FileId* out) {
  struct statx x {};
  const int flags = path.empty() ? AT_EMPTY_PATH : 0;
  if (::statx(path.empty() ? fd : AT_FDCWD, path.c_str(), flags | AT_STATX_SYNC_AS_STAT, STATX_INO | STATX_NLINK, &x) !=
      0)
    return false;
  out->dev = (static_cast<std::uint64_t>(x.stx_dev_major) << 32) | x.stx_dev_minor;
  out->ino = x.stx_ino;
  out->nlink = x.stx_nlink;
  return true;
}

}  // namespace fencegate::store::detail
