#!/usr/bin/env python3
"""Pull the example program and its documented output out of man pages.

For each page whose EXAMPLES section has a program (an .EX block with main())
writes OUT/<page>.c, and the next .EX block, the output the page promises,
to OUT/<page>.expected. The harness compiles and runs them in the guest, so
a man page's example cannot rot.
    extract-examples.py OUT PAGE...
"""
import pathlib
import sys


def unescape(line):
    return line.replace("\\-", "-").replace("\\e", "\\")


def blocks(text):
    """The .EX ... .EE blocks of the EXAMPLES section, unescaped."""
    section, cur, out = None, None, []
    for line in text.splitlines():
        if line.startswith(".SH "):
            section = line[4:].strip()
        elif section == "EXAMPLES" and line == ".EX":
            cur = []
        elif cur is not None and line == ".EE":
            out.append("\n".join(cur) + "\n")
            cur = None
        elif cur is not None:
            cur.append(unescape(line))
    return out


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for page in map(pathlib.Path, sys.argv[2:]):
        ex = blocks(page.read_text())
        progs = [i for i, b in enumerate(ex) if "main(" in b]
        if not progs:
            continue
        i = progs[0]
        if i + 1 >= len(ex):
            sys.exit(f"{page}: the example has no documented output block")
        (out / (page.stem + ".c")).write_text(ex[i])
        (out / (page.stem + ".expected")).write_text(ex[i + 1])
        print(f"man example: {page.name}")


if __name__ == "__main__":
    main()
