// common/flags: the one flag parser's syntax (each subcommand's messages are tested with it).
#include <doctest/doctest.h>

#include <array>

#include "common/flags.h"

using namespace fencegate::flags;

namespace {

constexpr std::array kKnown = {Flag{"--db"}, Flag{"--fence"}, Flag{"--json", Arity::none}};

Parsed run(const std::vector<std::string>& args, Rules rules = {}) { return parse(args, kKnown, rules); }

}  // namespace

TEST_CASE("flags: --name value and --name=value, in argument order, repeats kept") {
  auto p = run({"--db", "a.db", "--fence=http://x", "--fence", "http://y", "--json"});
  REQUIRE(p.items.size() == 4);
  CHECK(p.items[0].kind == Kind::flag);
  CHECK(p.items[0].name == "--db");
  CHECK(p.items[0].value == "a.db");
  CHECK_FALSE(p.items[0].inline_value);
  CHECK(p.items[1].name == "--fence");
  CHECK(p.items[1].value == "http://x");
  CHECK(p.items[1].inline_value);
  CHECK(p.items[2].value == "http://y");
  CHECK(p.items[3].kind == Kind::flag);
  CHECK(p.items[3].name == "--json");
  CHECK(p.items[3].value.empty());
  CHECK_FALSE(p.dashdash);
  CHECK(p.rest.empty());
}

TEST_CASE("flags: an empty value is a value; only a missing one is a problem") {
  auto p = run({"--db=", "--fence", ""});
  REQUIRE(p.items.size() == 2);
  CHECK(p.items[0].kind == Kind::flag);
  CHECK(p.items[0].value.empty());
  CHECK(p.items[0].inline_value);
  CHECK(p.items[1].kind == Kind::flag);
  CHECK(p.items[1].value.empty());

  auto end = run({"--json", "--db"});
  REQUIRE(end.items.size() == 2);
  CHECK(end.items[1].kind == Kind::missing_value);
  CHECK(end.items[1].name == "--db");
}

TEST_CASE("flags: a value may start with dashes unless the rules say otherwise") {
  auto loose = run({"--db", "--json", "--fence", "-1h"});
  REQUIRE(loose.items.size() == 2);
  CHECK(loose.items[0].value == "--json");
  CHECK(loose.items[1].value == "-1h");

  Rules strict;
  strict.value_may_start_with_dashes = false;
  auto p = run({"--db", "--json", "--fence", "-1h"}, strict);
  REQUIRE(p.items.size() == 3);
  CHECK(p.items[0].kind == Kind::missing_value);
  CHECK(p.items[0].name == "--db");
  CHECK(p.items[1].kind == Kind::flag);
  CHECK(p.items[1].name == "--json");
  CHECK(p.items[2].value == "-1h");
}

TEST_CASE("flags: unknown flags, stray arguments and a value on a boolean are reported, and parsing goes on") {
  auto p = run({"--bogus=1", "stray", "-x", "--json=yes", "--", "--db", "d"});
  REQUIRE(p.items.size() == 6);
  CHECK(p.items[0].kind == Kind::unknown_flag);
  CHECK(p.items[0].name == "--bogus");
  CHECK(p.items[0].arg == "--bogus=1");
  CHECK(p.items[1].kind == Kind::not_a_flag);
  CHECK(p.items[1].arg == "stray");
  CHECK(p.items[2].kind == Kind::not_a_flag);
  CHECK(p.items[3].kind == Kind::value_on_boolean);
  CHECK(p.items[3].name == "--json");
  CHECK(p.items[4].kind == Kind::not_a_flag);  // `--` is not special unless the rules say so
  CHECK(p.items[4].arg == "--");
  CHECK(p.items[5].kind == Kind::flag);
  CHECK(p.items[5].value == "d");
}

TEST_CASE("flags: `--` ends the flags when the rules say so") {
  Rules r;
  r.dashdash_ends_flags = true;
  auto p = run({"--db", "d", "--", "cmd", "--db", "-h"}, r);
  REQUIRE(p.items.size() == 1);
  CHECK(p.dashdash);
  CHECK(p.rest == std::vector<std::string>{"cmd", "--db", "-h"});
  auto none = run({"--", }, r);
  CHECK(none.dashdash);
  CHECK(none.rest.empty());
}

TEST_CASE("flags: -h and --help stop parsing where a flag may stand, not as a value") {
  auto p = run({"--bogus", "-h", "--db"});
  REQUIRE(p.items.size() == 2);
  CHECK(p.items[0].kind == Kind::unknown_flag);
  CHECK(p.items[1].kind == Kind::help);
  auto v = run({"--db", "--help"});
  REQUIRE(v.items.size() == 1);
  CHECK(v.items[0].value == "--help");
  auto eq = run({"--help=1"});
  REQUIRE(eq.items.size() == 1);
  CHECK(eq.items[0].kind == Kind::unknown_flag);
}

TEST_CASE("flags: parse_int takes whole integers in range only") {
  std::int64_t n = 7;
  CHECK(parse_int("42", 0, 100, &n));
  CHECK(n == 42);
  CHECK(parse_int("-3", -5, 5, &n));
  CHECK(n == -3);
  for (const char* bad : {"", "x", "4x", " 4", "101", "-1", "+1", "99999999999999999999"}) {
    n = 7;
    CHECK_FALSE(parse_int(bad, 0, 100, &n));
    CHECK(n == 7);
  }
}
