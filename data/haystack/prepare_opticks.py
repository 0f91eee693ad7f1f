#!/usr/bin/env python3
"""Rebuilds opticks.txt from the Go source tree's copy of Newton's Opticks.

Source: Debian package golang-1.19-src (bookworm), file
/usr/share/go-1.19/src/testdata/Isaac.Newton-Opticks.txt: Project Gutenberg eBook #33504
with its header and licence removed by the Go authors. Newton's text (4th ed., 1730) is in
the public domain. Usage: prepare_opticks.py SOURCE > opticks.txt

The cleaning keeps running prose only, because the benchmark splits the text into sentences
and places needles between them: figure captions, bracketed figure references, footnote
markers, italics underscores, headings and tables are dropped; wrapped lines are joined so
that each output line is one paragraph.
"""
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
# Skip the transcribers' credit before the title page.
text = text[text.index("OPTICKS:"):]
paras = re.split(r"\n\s*\n", text)
out = []
for p in paras:
    p = " ".join(line.strip() for line in p.splitlines()).replace("_", "")
    p = re.sub(r"\[Illustration[^\]]*\]", " ", p)
    p = re.sub(r"\[Greek:[^\]]*\]", " ", p)
    p = re.sub(r"\[(?:in )?(?:Fig|FIG)[^\]]*\]", " ", p)  # figure references
    p = re.sub(r"\[[A-Z0-9]{1,3}\]", " ", p)  # footnote markers
    p = re.sub(r"\s+", " ", p).strip()
    p = re.sub(r" ([,.;:])", r"\1", p)  # space left before punctuation
    # Running prose: long enough, mostly letters, ends like a sentence.
    if len(p) < 200 or not p.endswith((".", "?", "!")):
        continue
    letters = sum(c.isalpha() for c in p)
    if letters < 0.7 * len(p):
        continue
    if re.search(r"\d+\s+\d+\s+\d+\s+\d+", p):  # tables of numbers
        continue
    out.append(p)
sys.stdout.write("\n".join(out) + "\n")
