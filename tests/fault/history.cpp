// History checker: see history.h for the properties and their exact meaning.
#include "tests/fault/history.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace fencegate::fault {
namespace {

bool is_2xx(int s) { return s >= 200 && s < 300; }
// Answers the proxy gives itself, without forwarding (docs/contract.md, "The contract").
bool is_local_rejection(int s) { return s == 400 || s == 409 || s == 428 || s == 503; }
// The upstream only noticed after the proxy closed: completion is an upper bound.
bool peer_ended(const std::string& outcome) { return outcome == "aborted_by_peer" || outcome == "write_failed"; }

const char* token_name(Token t) {
  switch (t) {
    case Token::valid: return "valid";
    case Token::missing: return "missing";
    case Token::malformed: return "malformed";
  }
  return "?";
}

// Formats times relative to the earliest timestamp in the history.
class Printer {
 public:
  explicit Printer(const History& h) {
    auto take = [&](Clock::time_point t) {
      if (t != Clock::time_point{} && (!have_ || t < t0_)) t0_ = t, have_ = true;
    };
    for (const auto& c : h.client) take(c.sent);
    for (const auto& u : h.upstream) take(u.arrival);
    for (const auto& e : h.events) take(e.at);
    for (const auto& s : h.stored) take(s.at);
  }
  std::string at(Clock::time_point t) const {
    if (t == Clock::time_point{}) return "?";
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - t0_).count();
    return "+" + std::to_string(ms) + "ms";
  }
  std::string show(const ClientOp& c) const {
    std::string s = "client   " + c.op_id + " res=" + c.resource;
    if (c.token == Token::valid)
      s += " gen=" + std::to_string(c.generation);
    else
      s += std::string(" token=") + token_name(c.token);
    if (!c.leader.empty()) s += " leader=" + c.leader;
    if (!c.write) s += " (read)";
    s += " sent=" + at(c.sent) + " done=" + at(c.done) + " -> ";
    s += c.status ? std::to_string(c.status) : "no response" + (c.error.empty() ? "" : " (" + c.error + ")");
    return s;
  }
  std::string show(const UpstreamOp& u) const {
    return "upstream " + (u.op_id.empty() ? std::string("<no op id>") : u.op_id) + " res=" + u.resource +
           " gen=" + std::to_string(u.generation) + " arrival=" + at(u.arrival) +
           " completion=" + (u.outcome == "pending" ? std::string("never") : at(u.completion)) + " " + u.outcome;
  }
  std::string show(const AuditFact& a) const {
    return "audit    " + (a.op_id.empty() ? std::string("<no op id>") : a.op_id) + " res=" + a.resource + " " +
           a.decision + " presented=" + std::to_string(a.presented) + " current=" + std::to_string(a.current);
  }
  std::string show(const StoredSample& s) const {
    return "stored   res=" + s.resource + " gen=" + std::to_string(s.generation) +
           " epoch=" + std::to_string(s.epoch) + " at=" + at(s.at);
  }

 private:
  Clock::time_point t0_{};
  bool have_ = false;
};

// Builds one violation's trace: a headline, the ops involved, and the faults injected between
// the earliest and the latest of their timestamps.
class Trace {
 public:
  Trace(const Printer& p, std::string headline) : p_(p), text_(std::move(headline) + "\n") {}
  template <class Op>
  Trace& op(const Op& o) {
    text_ += "  " + p_.show(o) + "\n";
    span(o);
    return *this;
  }
  Trace& line(const std::string& s) {
    text_ += "  " + s + "\n";
    return *this;
  }
  std::string finish(const std::vector<Event>& events) const {
    std::string s = text_;
    if (!have_) return s;
    std::string faults;
    for (const auto& e : events)
      if (e.at >= lo_ && e.at <= hi_) faults += "    " + p_.at(e.at) + " " + e.what + "\n";
    if (!faults.empty()) s += "  faults meanwhile:\n" + faults;
    return s;
  }

 private:
  void time(Clock::time_point t) {
    if (t == Clock::time_point{}) return;
    if (!have_) lo_ = hi_ = t, have_ = true;
    lo_ = std::min(lo_, t);
    hi_ = std::max(hi_, t);
  }
  void span(const ClientOp& c) { time(c.sent), time(c.done); }
  void span(const UpstreamOp& u) { time(u.arrival), time(u.completion); }
  void span(const AuditFact&) {}
  void span(const StoredSample& s) { time(s.at); }

  const Printer& p_;
  std::string text_;
  Clock::time_point lo_{}, hi_{};
  bool have_ = false;
};

// Collects violations, capping how many of one (property, resource) are reported.
class Report {
 public:
  Report(const History& h, const Options& o) : h_(h), o_(o) {}
  void add(const std::string& property, const std::string& resource, const Trace& t) {
    int& n = counts_[{property, resource}];
    if (++n <= o_.max_per_kind) out_.push_back(Violation{property, resource, t.finish(h_.events)});
  }
  std::vector<Violation> take() {
    for (const auto& [key, n] : counts_)
      if (n > o_.max_per_kind)
        out_.push_back(Violation{key.first, key.second,
                                 "... and " + std::to_string(n - o_.max_per_kind) + " more of this kind\n"});
    return std::move(out_);
  }

 private:
  const History& h_;
  const Options& o_;
  std::map<std::pair<std::string, std::string>, int> counts_;
  std::vector<Violation> out_;
};

}  // namespace

std::vector<Violation> check(const History& h, const Options& o) {
  Printer p(h);
  Report rep(h, o);

  // Indexes by op id.
  std::map<std::string, const ClientOp*> client;
  for (const auto& c : h.client)
    if (!client.emplace(c.op_id, &c).second)
      rep.add("0-history", c.resource, Trace(p, "two client ops share the op id " + c.op_id).op(*client[c.op_id]).op(c));
  std::map<std::string, std::vector<const UpstreamOp*>> upstream;
  for (const auto& u : h.upstream) upstream[u.op_id].push_back(&u);
  std::map<std::string, std::vector<const AuditFact*>> audit;
  for (const auto& a : h.audit) audit[a.op_id].push_back(&a);
  auto ups_of = [&](const std::string& id) -> const std::vector<const UpstreamOp*>& {
    static const std::vector<const UpstreamOp*> none;
    auto it = upstream.find(id);
    return it == upstream.end() ? none : it->second;
  };
  auto client_of = [&](const std::string& id) -> const ClientOp* {
    auto it = client.find(id);
    return it == client.end() ? nullptr : it->second;
  };

  // Forwarded writes per resource, in arrival order. An upstream op nobody sent counts as a write.
  std::map<std::string, std::vector<const UpstreamOp*>> writes;
  for (const auto& u : h.upstream) {
    const ClientOp* c = client_of(u.op_id);
    if ((!c || c->write) && u.generation > 0) writes[u.resource].push_back(&u);
  }
  for (auto& [res, v] : writes)
    std::stable_sort(v.begin(), v.end(), [](const UpstreamOp* a, const UpstreamOp* b) { return a->arrival < b->arrival; });

  // 1-order: generations never decrease in arrival order. Each op is compared with the highest
  // generation that arrived before it.
  for (const auto& [res, v] : writes) {
    const UpstreamOp* top = nullptr;
    for (const UpstreamOp* u : v) {
      if (top && u->generation < top->generation)
        rep.add("1-order", res,
                Trace(p, "a lower generation reached the upstream after a higher one").op(*top).op(*u));
      if (!top || u->generation > top->generation) top = u;
    }
  }

  // 2-overlap: a lower generation's exchange is over before a higher one starts upstream. Pairs
  // arriving in the wrong order are 1-order's.
  for (const auto& [res, v] : writes) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      const UpstreamOp& lo = *v[i];
      const bool pending = lo.outcome == "pending";
      const auto end = peer_ended(lo.outcome) ? lo.completion - o.peer_abort_slack : lo.completion;
      for (std::size_t j = i + 1; j < v.size(); ++j) {
        const UpstreamOp& hi = *v[j];
        if (hi.generation <= lo.generation) continue;
        if (pending || end > hi.arrival) {
          rep.add("2-overlap", res,
                  Trace(p, "a lower generation's exchange was still running when a higher one started upstream")
                      .op(lo)
                      .op(hi));
          break;  // one report per lower op
        }
      }
    }
  }

  // 3-match: upstream ops against client ops.
  for (const auto& [id, ups] : upstream) {
    const ClientOp* c = client_of(id);
    if (!c) {
      for (const UpstreamOp* u : ups)
        rep.add("3-match", u->resource, Trace(p, "the upstream received a request no client sent").op(*u));
      continue;
    }
    if (ups.size() > 1) {
      Trace t(p, "one client request reached the upstream " + std::to_string(ups.size()) + " times");
      t.op(*c);
      for (const UpstreamOp* u : ups) t.op(*u);
      rep.add("3-match", c->resource, t);
    }
    for (const UpstreamOp* u : ups)
      if (u->resource != c->resource || (c->token == Token::valid && u->generation != c->generation))
        rep.add("3-match", c->resource,
                Trace(p, "the upstream received another resource or generation than the client sent").op(*c).op(*u));
  }
  for (const auto& c : h.client) {
    const auto& ups = ups_of(c.op_id);
    if (is_2xx(c.status) && ups.empty())
      rep.add("3-match", c.resource, Trace(p, "a client got a 2xx the upstream never produced").op(c));
    if (is_local_rejection(c.status) && !ups.empty()) {
      Trace t(p, "a request answered " + std::to_string(c.status) + " (nothing forwarded) reached the upstream");
      t.op(c);
      for (const UpstreamOp* u : ups) t.op(*u);
      rep.add("3-match", c.resource, t);
    }
    if (c.write && c.token != Token::valid && !ups.empty()) {
      Trace t(p, "a write without a valid token was forwarded (enforce mode)");
      t.op(c);
      for (const UpstreamOp* u : ups) t.op(*u);
      rep.add("3-match", c.resource, t);
    }
  }

  // 4-audit: every rejection a client saw is audited; a rejection is never also forwarded.
  for (const auto& c : h.client) {
    if (!c.write) continue;
    std::string want;  // the decision prefix the audit row must have
    if (c.status == 409) want = "rejected_";
    if (c.status == 428) want = "rejected_missing";
    if (c.status == 400 && c.token == Token::malformed) want = "rejected_malformed";
    if (want.empty()) continue;
    bool found = false;
    auto it = audit.find(c.op_id);
    if (it != audit.end())
      for (const AuditFact* a : it->second)
        if (a->decision.rfind(want, 0) == 0 && a->resource == c.resource &&
            (c.status != 409 || a->presented == c.generation))
          found = true;
    if (!found) {
      Trace t(p, "a client got " + std::to_string(c.status) + " but no matching audit row (" + want + "...) exists");
      t.op(c);
      if (it != audit.end())
        for (const AuditFact* a : it->second) t.op(*a);
      rep.add("4-audit", c.resource, t);
    }
  }
  for (const auto& [id, rows] : audit) {
    std::vector<const AuditFact*> rejected;
    for (const AuditFact* a : rows)
      if (a->decision.rfind("rejected_", 0) == 0) rejected.push_back(a);
    if (rejected.empty()) continue;
    const ClientOp* c = client_of(id);
    const std::string& res = rejected.front()->resource;
    if (!c) {
      for (const AuditFact* a : rejected) rep.add("4-audit", res, Trace(p, "an audit row names an op nobody sent").op(*a));
      continue;
    }
    const auto& ups = ups_of(id);
    if (!ups.empty() || is_2xx(c->status)) {
      Trace t(p, "a write was audited as rejected but forwarded");
      t.op(*c);
      for (const AuditFact* a : rejected) t.op(*a);
      for (const UpstreamOp* u : ups) t.op(*u);
      rep.add("4-audit", res, t);
    }
    if (rejected.size() > 1) {
      Trace t(p, "one request has " + std::to_string(rejected.size()) + " rejection audit rows");
      t.op(*c);
      for (const AuditFact* a : rejected) t.op(*a);
      rep.add("4-audit", res, t);
    }
  }

  // 5-stored: samples never decrease, and each covers every generation forwarded before it.
  std::map<std::string, const StoredSample*> last;
  for (const auto& s : h.stored) {
    auto [it, fresh] = last.emplace(s.resource, &s);
    if (!fresh) {
      if (s.generation < it->second->generation)
        rep.add("5-stored", s.resource,
                Trace(p, "the stored generation decreased").op(*it->second).op(s));
      else
        it->second = &s;
    }
    const UpstreamOp* top = nullptr;
    auto w = writes.find(s.resource);
    if (w != writes.end())
      for (const UpstreamOp* u : w->second)
        if (u->arrival < s.at && (!top || u->generation > top->generation)) top = u;
    if (top && top->generation > s.generation)
      rep.add("5-stored", s.resource,
              Trace(p, "a generation was forwarded before it was stored (the stored one is lower)").op(*top).op(s));
  }
  return rep.take();
}

std::string describe(const std::vector<Violation>& v) {
  std::string s;
  for (const auto& x : v) s += x.property + " [" + x.resource + "]: " + x.trace;
  return s;
}

std::string op_target(const std::string& resource, const std::string& op_id) { return "/r/" + resource + "/" + op_id; }

bool parse_op_target(const std::string& target, std::string* resource, std::string* op_id) {
  if (target.rfind("/r/", 0) != 0) return false;
  auto slash = target.find('/', 3);
  if (slash == std::string::npos || slash == 3 || slash + 1 >= target.size()) return false;
  auto rest = target.substr(slash + 1);
  auto q = rest.find_first_of("/?");
  *resource = target.substr(3, slash - 3);
  *op_id = rest.substr(0, q);
  return !op_id->empty();
}

}  // namespace fencegate::fault
