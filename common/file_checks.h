// Checks on the files fencegate trusts: a secret file (an admin or fence token) that only its
// owner may read, and a database location that no other local user can tamper with (as sshd's
// StrictModes). docs/security.md says what each check defends against.
//
// Thread-safety: the functions hold no state.
#pragma once

#include <cstddef>
#include <string>

namespace fencegate::files {

// The shortest bearer token accepted (admin.token_file, elect --fence-token-file): a guessable
// one-character token is no gate.
inline constexpr std::size_t kMinTokenBytes = 16;

// Reads a file that holds a secret. Refused when it is not a regular file or when group or others
// may read or write it (mode & 077): "<path> has mode 0644: group or others may read or write it
// (chmod 600 <path>)". A symbolic link is followed (a Kubernetes secret volume is links); the mode
// checked is the file's. Returns "" with *text set, or the reason (naming the path, never the
// contents).
std::string read_secret_file(const std::string& path, std::string* text);
// read_secret_file, with white space (a trailing newline) trimmed from both ends.
std::string read_secret_trimmed(const std::string& path, std::string* text);

// The suffixes of the files SQLite and fencegate keep beside a database.
inline constexpr const char* kDbSideSuffixes[] = {"-wal", "-shm", ".lock"};

// Checks where a database lives before it is opened for writing. `given` may name the database
// through symbolic links the operator made: it is resolved first (realpath; for a database not
// there yet, its directory is) and the checks apply to the real path. Refused: a directory group
// or others may write to without the sticky bit; a database file, or a -wal/-shm/.lock beside
// it, owned by another user than the effective one; a -wal/-shm/.lock that is a symbolic link.
// A directory that does not exist is not refused here (opening reports it). Returns "" with
// *real set to the resolved path (or `given` when it cannot be resolved), or the reason, naming
// the path.
std::string check_db_location(const std::string& given, std::string* real);

}  // namespace fencegate::files
