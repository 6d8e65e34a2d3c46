// Checks on the files fencegate trusts (see file_checks.h): secret files readable by their owner
// only, and a database location other local users cannot tamper with.
#include "common/file_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fencegate::files {
namespace {

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string parent_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string resolved(const char* path, bool* ok) {
  char buf[PATH_MAX];
  *ok = ::realpath(path, buf) != nullptr;
  return *ok ? std::string(buf) : std::string();
}

std::string owner_problem(const std::string& what, const struct stat& st) {
  if (st.st_uid == ::geteuid()) return {};
  return what + " is owned by uid " + std::to_string(st.st_uid) + ", not by the user fencegate runs as (uid " +
         std::to_string(::geteuid()) + "): that user could read or change the fence";
}

}  // namespace

std::string read_secret_file(const std::string& path, std::string* text) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) return "cannot read " + path + ": " + std::strerror(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return "cannot read " + path + ": " + std::strerror(e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return S_ISDIR(st.st_mode) ? "cannot read " + path + ": " + std::strerror(EISDIR) : path + " is not a regular file";
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return path + " has mode " + octal_mode(st.st_mode) + ": group or others may read or write it (chmod 600 " + path +
           ")";
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return "cannot read " + path + ": " + std::strerror(e);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1u << 20)) {
      ::close(fd);
      return path + " is larger than 1 MiB; it must hold a single token";
    }
  }
  ::close(fd);
  *text = std::move(out);
  return {};
}

std::string check_db_location(const std::string& given, std::string* real) {
  *real = given;
  struct stat st {};
  bool ok = false;
  if (::lstat(given.c_str(), &st) == 0) {
    std::string r = resolved(given.c_str(), &ok);
    if (!ok) return {};  // a dangling link: opening reports it
    *real = r;
  } else {
    std::string dir = resolved(parent_of(given).c_str(), &ok);
    if (!ok) return {};  // no such directory: opening reports it
    *real = (dir == "/" ? std::string() : dir) + "/" + base_of(given);
  }
  const std::string shown = *real == given ? given : given + " (" + *real + ")";
  const std::string dir = parent_of(*real);
  if (::stat(dir.c_str(), &st) == 0 && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
    return "database " + shown + ": its directory " + dir + " has mode " + octal_mode(st.st_mode) +
           ": other users may write to it (group or others, without the sticky bit) and could replace the database "
           "or plant links beside it (chmod go-w " +
           dir + ")";
  if (::stat(real->c_str(), &st) == 0) {
    if (auto e = owner_problem("database " + shown, st); !e.empty()) return e;
  }
  for (const char* suffix : kDbSideSuffixes) {
    const std::string side = *real + suffix;
    if (::lstat(side.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode))
      return "database " + shown + ": " + side +
             " is a symbolic link; fencegate does not create or open the files beside the database through a link "
             "(remove it)";
    if (auto e = owner_problem("database " + shown + ": " + side, st); !e.empty()) return e;
  }
  return {};
}

std::string read_secret_trimmed(const std::string& path, std::string* text) {
  std::string t;
  if (auto e = read_secret_file(path, &t); !e.empty()) return e;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  std::size_t lead = 0;
  while (lead < t.size() && std::isspace(static_cast<unsigned char>(t[lead]))) ++lead;
  *text = t.substr(lead);
  return {};
}

}  // namespace fencegate::files
