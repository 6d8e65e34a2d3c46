// RFC 7239 Forwarded syntax check (see forwarded.h).
#include "proxy/forwarded.h"

#include <cstddef>

namespace fencegate::proxy {

namespace {

// tchar (RFC 9110 5.6.2).
bool is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~': return true;
    default: return false;
  }
}

bool is_ows(char c) { return c == ' ' || c == '\t'; }

// Advances *i over a token; false if there is none.
bool token(std::string_view v, std::size_t* i) {
  const std::size_t start = *i;
  while (*i < v.size() && is_tchar(static_cast<unsigned char>(v[*i]))) ++*i;
  return *i > start;
}

// Advances *i over a quoted-string (RFC 9110 5.6.4); false if it is not one or is unterminated.
bool quoted_string(std::string_view v, std::size_t* i) {
  if (*i >= v.size() || v[*i] != '"') return false;
  for (++*i; *i < v.size(); ++*i) {
    const unsigned char c = static_cast<unsigned char>(v[*i]);
    if (c == '"') {
      ++*i;
      return true;
    }
    if (c == '\\') {  // quoted-pair: HTAB / SP / VCHAR / obs-text
      if (++*i >= v.size()) return false;
      const unsigned char q = static_cast<unsigned char>(v[*i]);
      if (q != '\t' && (q < 0x20 || q == 0x7f)) return false;
      continue;
    }
    if (c != '\t' && (c < 0x20 || c == 0x7f)) return false;  // qdtext: HTAB / SP / VCHAR but " \ / obs-text
  }
  return false;  // unterminated
}

}  // namespace

bool valid_forwarded(std::string_view v) {
  std::size_t i = 0;
  bool any_pair = false;
  for (;;) {
    while (i < v.size() && (is_ows(v[i]) || v[i] == ',')) ++i;  // list separators, empty elements
    if (i == v.size()) return any_pair;
    // One forwarded-element: pairs separated by ";" (an empty pair is allowed by the grammar).
    for (;;) {
      if (i < v.size() && v[i] != ';' && v[i] != ',') {
        if (!token(v, &i) || i >= v.size() || v[i] != '=') return false;
        ++i;
        if (!(i < v.size() && v[i] == '"' ? quoted_string(v, &i) : token(v, &i))) return false;
        any_pair = true;
      }
      if (i < v.size() && v[i] == ';') {
        ++i;
        continue;
      }
      break;
    }
    while (i < v.size() && is_ows(v[i])) ++i;
    if (i < v.size() && v[i] != ',') return false;  // anything else after a pair
  }
}

}  // namespace fencegate::proxy
