// The one command-line flag parser every `fencegate` subcommand uses (serve, elect, leader, audit).
//
// It knows the syntax only: `--name value` and `--name=value`, boolean flags, `-h`/`--help`, and
// (if asked) `--` ending the flags. It returns what it found in argument order -- each flag
// occurrence and each syntax problem as an Item -- and the caller gives them meaning: which value
// wins when a flag repeats (serve and audit: the last; elect's --fence: every one), how a value is
// checked, and the wording of its messages, which are part of each subcommand's contract.
//
// Secrets never come from a flag value (a process's arguments are visible to every local user):
// subcommands take a file that holds the secret (--admin-token-file, --fence-token-file).
//
// Thread-safety: pure functions over their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fencegate::flags {

enum class Arity {
  value,  // --name VALUE or --name=VALUE
  none,   // a boolean: --name (giving it a value is a problem)
};

// One flag a subcommand accepts. `name` includes the leading dashes: "--threads".
struct Flag {
  std::string_view name;
  Arity arity = Arity::value;
};

// What differs between the subcommands' syntax (their documented behaviour, kept as it was).
struct Rules {
  // `--` ends the flags; the arguments after it are Parsed::rest (elect's COMMAND). Otherwise a
  // lone `--` is reported as Kind::not_a_flag.
  bool dashdash_ends_flags = false;
  // `--name VALUE` takes the next argument as the value even if it starts with "--" (audit's
  // "--since -1h", elect's). If false (serve), "--db --threads 2" reports --db's value missing and
  // goes on with --threads.
  bool value_may_start_with_dashes = true;
};

enum class Kind {
  flag,              // a known flag with its value (boolean: value "")
  help,              // -h or --help where a flag may stand: parsing stopped here
  unknown_flag,      // starts with "--" but names no known flag (name: the part before any '=')
  not_a_flag,        // an argument that is not a flag ("stray", "-x", a lone "--")
  missing_value,     // a value flag at the end, or (see Rules) followed by a flag
  value_on_boolean,  // --json=yes
};

struct Item {
  Kind kind = Kind::flag;
  std::string name;            // "--threads" (flags and problems with a flag name); "" otherwise
  std::string value;           // Kind::flag only
  std::string arg;             // the argument as given: "--threads=4", "stray"
  bool inline_value = false;   // the value came as --name=value (it may be empty)
};

struct Parsed {
  std::vector<Item> items;        // in argument order; a Kind::help item is the last
  bool dashdash = false;          // a `--` ended the flags (Rules::dashdash_ends_flags)
  std::vector<std::string> rest;  // the arguments after that `--`
};

// Parses `args` (argv after the subcommand) against the `known` flags.
Parsed parse(const std::vector<std::string>& args, std::span<const Flag> known, Rules rules = {});

// Returns true iff `text` is a whole decimal integer (optional '-') within lo..hi; then sets *out.
bool parse_int(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t* out);

}  // namespace fencegate::flags
