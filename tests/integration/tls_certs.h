// Certificates for the TLS tests (issue 27), made with the openssl command line in a temp dir: a
// throwaway CA, and leaf certificates signed by it with the SAN and validity a test needs (EC
// P-256: fast). Shared by tls_test.cpp (the data listener) and tls_upstream_test.cpp (https
// upstreams).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace fencegate::testing {

// run_command execs a path: find a tool on PATH.
inline std::string tool(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (std::size_t b = 0; b <= dirs.size();) {
    std::size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    const std::string f = dirs.substr(b, e - b) + "/" + name;
    if (::access(f.c_str(), X_OK) == 0) return f;
    b = e + 1;
  }
  return "/usr/bin/" + name;
}

inline void openssl_cmd(const std::vector<std::string>& args) {
  std::vector<std::string> argv{tool("openssl")};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = run_command(argv, 30s);
  REQUIRE_MESSAGE(r.code() == 0, "openssl failed: ", r.err);
}

// A directory of certificates: NAME.crt and NAME.key each.
struct CertDir {
  TempDir dir{"fencegate-tls-certs"};
  std::string f(const std::string& n) const { return dir.file(n); }

  // A self-signed CA `name`.
  void ca(const std::string& name) {
    openssl_cmd({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 f(name + ".key"), "-out", f(name + ".crt"), "-subj", "/CN=" + name, "-days", "2"});
  }
  // A certificate `name` signed by `ca`, with subjectAltName `san` ("" none), valid `days` (-1: it
  // expired yesterday: `openssl x509 -days -1` dates its end before its start).
  void leaf(const std::string& name, const std::string& ca, const std::string& cn, const std::string& san,
            int days = 2) {
    openssl_cmd({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f(name + ".key"),
                 "-out", f(name + ".csr"), "-subj", "/CN=" + cn});
    write_file(f(name + ".ext"), san.empty() ? "basicConstraints=CA:FALSE\n" : "subjectAltName=" + san + "\n");
    openssl_cmd({"x509", "-req", "-in", f(name + ".csr"), "-CA", f(ca + ".crt"), "-CAkey", f(ca + ".key"),
                 "-CAcreateserial", "-out", f(name + ".crt"), "-days", std::to_string(days), "-extfile",
                 f(name + ".ext")});
  }
};

}  // namespace fencegate::testing
