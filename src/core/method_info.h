// What a method of a registry (rope scalings, attention backends, KV presses) declares about
// itself, read off its own parser: the parsers record each key as they read it, so the
// `longctx methods` listing and the tables of docs/methods.md cannot drift from what a spec
// accepts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lc {

struct MethodKey {
  std::string name;
  std::string type;   // int, real, bool, text, or the choices "a|b"
  std::string def;    // default, as text ("" when required or given by the model)
  std::string range;  // "[lo, hi]" for numbers, "" otherwise
  std::string help;   // one line: what the key does, with its unit
};

struct MethodInfo {
  std::string name;
  std::string help;   // one line: what it does
  std::string paper;  // where it comes from ("" when the help line says it)
  std::vector<MethodKey> keys;
};

// Adds k to keys unless a key of that name is there (a parser may read a key twice).
void add_method_key(std::vector<MethodKey>& keys, MethodKey k);
// A number as a spec would write it: integers without a point, others in %g.
std::string method_number(double x);
// An integer key's default or bound, exact at any size (method_number writes 2^63-1 in %g).
std::string method_integer(int64_t x);

}  // namespace lc
