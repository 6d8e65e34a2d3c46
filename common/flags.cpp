// The one command-line flag parser (see common/flags.h): syntax only, in argument order.
#include "common/flags.h"

#include <charconv>

namespace fencegate::flags {

namespace {

const Flag* find(std::span<const Flag> known, std::string_view name) {
  for (const Flag& f : known)
    if (f.name == name) return &f;
  return nullptr;
}

bool is_flag_shaped(std::string_view a) { return a.size() > 2 && a.substr(0, 2) == "--"; }

}  // namespace

Parsed parse(const std::vector<std::string>& args, std::span<const Flag> known, Rules rules) {
  Parsed out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    Item item;
    item.arg = a;
    if (a == "--help" || a == "-h") {
      item.kind = Kind::help;
      out.items.push_back(std::move(item));
      return out;
    }
    if (a == "--" && rules.dashdash_ends_flags) {
      out.dashdash = true;
      out.rest.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      return out;
    }
    if (!is_flag_shaped(a)) {
      item.kind = Kind::not_a_flag;
      out.items.push_back(std::move(item));
      continue;
    }
    const std::size_t eq = a.find('=');
    item.name = a.substr(0, eq);
    const Flag* f = find(known, item.name);
    if (f == nullptr) {
      item.kind = Kind::unknown_flag;
    } else if (f->arity == Arity::none) {
      item.kind = eq == std::string::npos ? Kind::flag : Kind::value_on_boolean;
    } else if (eq != std::string::npos) {
      item.value = a.substr(eq + 1);
      item.inline_value = true;
    } else if (i + 1 < args.size() && (rules.value_may_start_with_dashes || args[i + 1].rfind("--", 0) != 0)) {
      item.value = args[++i];
    } else {
      item.kind = Kind::missing_value;
    }
    out.items.push_back(std::move(item));
  }
  return out;
}

bool parse_int(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t* out) {
  std::int64_t n = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, n);
  if (text.empty() || ec != std::errc() || p != end || n < lo || n > hi) return false;
  *out = n;
  return true;
}

}  // namespace fencegate::flags
