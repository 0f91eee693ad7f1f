// The default model is compiled into the binary, so `longctx run` works from any directory.
#include "embedded_model.h"

#ifndef LONGCTX_EMBED_MODEL
#error "LONGCTX_EMBED_MODEL must name the GGUF file to embed"
#endif
#ifndef LONGCTX_EMBED_READER_MODEL
#error "LONGCTX_EMBED_READER_MODEL must name the reader model's GGUF file to embed"
#endif

asm(".section .rodata\n"
    ".balign 64\n"
    ".global longctx_embedded_model_begin\n"
    "longctx_embedded_model_begin:\n"
    ".incbin \"" LONGCTX_EMBED_MODEL "\"\n"
    ".global longctx_embedded_model_end\n"
    "longctx_embedded_model_end:\n"
    ".balign 64\n"
    ".global longctx_embedded_reader_model_begin\n"
    "longctx_embedded_reader_model_begin:\n"
    ".incbin \"" LONGCTX_EMBED_READER_MODEL "\"\n"
    ".global longctx_embedded_reader_model_end\n"
    "longctx_embedded_reader_model_end:\n"
    ".previous\n");

extern "C" const unsigned char longctx_embedded_model_begin[];
extern "C" const unsigned char longctx_embedded_model_end[];
extern "C" const unsigned char longctx_embedded_reader_model_begin[];
extern "C" const unsigned char longctx_embedded_reader_model_end[];

std::span<const unsigned char> embedded_model() {
  return {longctx_embedded_model_begin, longctx_embedded_model_end};
}

std::span<const unsigned char> embedded_reader_model() {
  return {longctx_embedded_reader_model_begin, longctx_embedded_reader_model_end};
}
