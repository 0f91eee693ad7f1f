// The rope registry: ONE line per method, read as an X-macro list. The declarations of the
// method definitions (rope_method.h) and the registry rope_registry.cpp searches, lists in its
// errors, `--help` and rope_method_info() are generated from it, in this order.
//
//   LC_ROPE_METHOD(ident): a position method; a file rope_<ident>.cpp defines
//     rope_detail::method_<ident>() returning its RopeMethodDef: name, summary, paper, typed
//     keys (kind, default, help) and factory.
//   LC_ROPE_COMPONENT(ident): a component composed with a position method by '+' (logn); its
//     RopeMethodDef declares the keys and has no factory; make_rope_plan reads them.
//
// Adding a rope scaling = its file + one LC_ROPE_METHOD line (CMake globs src/rope).
//
// Include this file after defining the macro(s) wanted; an undefined one expands to nothing,
// and both are undefined again at the end. No include guard, on purpose.

#ifndef LC_ROPE_METHOD
#define LC_ROPE_METHOD(ident)
#endif
#ifndef LC_ROPE_COMPONENT
#define LC_ROPE_COMPONENT(ident)
#endif

LC_ROPE_METHOD(gguf)
LC_ROPE_METHOD(none)
LC_ROPE_METHOD(linear)
LC_ROPE_METHOD(ntk)
LC_ROPE_METHOD(dynamic_ntk)
LC_ROPE_METHOD(yarn)
LC_ROPE_METHOD(llama3)
LC_ROPE_METHOD(mrrope_uni)
LC_ROPE_METHOD(mrrope_pro)
LC_ROPE_COMPONENT(logn)

#undef LC_ROPE_METHOD
#undef LC_ROPE_COMPONENT
